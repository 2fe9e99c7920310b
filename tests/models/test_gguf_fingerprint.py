"""A GGUF target's fingerprint comes from the file's own bytes: the same under transformers 4.57 and 5.x,
read as `gguf.GGUFReader` reads the file; an artifact fingerprinted the old way (transformers' reading
of the file) is named as the same file; `dtype: auto` runs a quantized GGUF in float32."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import transformers

from eyas.draft.config import _fingerprint_problems
from eyas.errors import EyasError
from eyas.models.fingerprint import OTHER_VERSION, target_fingerprint
from eyas.models.gguf_file import read_gguf_metadata
from eyas.models.tokenizer import load_tokenizer
from eyas.precision import choose_dtype
from eyas.testing.gguf import write_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]
# the other supported transformers line: the 4.57 venv from the main one, the main venv from the 4.57 one (make
# test-transformers4 runs after make test, so on a clean checkout the comparison runs there)
OTHER_LINE = ROOT / (".venv-transformers4" if transformers.__version__.startswith("5.") else ".venv") / "bin" / "python"
FINGERPRINT = ("import json, sys; from pathlib import Path; from eyas.models.fingerprint import target_fingerprint; "
               "from eyas.models.tokenizer import load_tokenizer; import transformers; p = Path(sys.argv[1]); "
               "print(json.dumps([transformers.__version__, target_fingerprint(p, load_tokenizer(p)).model_dump()]))")


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "gemma3.gguf", "gemma3", num_layers=2)


def test_the_metadata_is_what_the_gguf_package_reads(gemma3: Path) -> None:
    from gguf import GGUFReader

    reader, ours = GGUFReader(str(gemma3)), read_gguf_metadata(gemma3)
    fields = {key: field for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    assert list(ours.entries) == list(fields)
    for key, field in fields.items():
        assert ours.entries[key] == b"".join(part.tobytes() for part in field.parts[2:]), key  # parts 0, 1: the key
        expected = len(field.data) if field.types[0].name == "ARRAY" else field.contents()
        assert ours.values[key] == pytest.approx(expected) if isinstance(expected, float) else ours.values[key] == expected
    assert ours.tensor_types == {tensor.name: int(tensor.tensor_type) for tensor in reader.tensors}
    assert ours.architecture == "gemma3" and ours.packed and ours.vocab_size == len(fields["tokenizer.ggml.tokens"].data)


@pytest.mark.skipif(not OTHER_LINE.is_file(), reason=f"no {OTHER_LINE.parents[1].name}: the other transformers line")
def test_the_fingerprint_is_the_same_under_transformers_4_and_5(gemma3: Path) -> None:
    theirs = subprocess.run([str(OTHER_LINE), "-c", FINGERPRINT, str(gemma3)], capture_output=True, text=True,
                            check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"})
    version, recorded = json.loads(theirs.stdout.strip().splitlines()[-1])
    assert {version.split(".")[0], transformers.__version__.split(".")[0]} == {"4", "5"}
    assert target_fingerprint(gemma3, load_tokenizer(gemma3)).model_dump() == recorded


def test_an_old_fingerprint_of_the_same_file_is_named_as_such(gemma3: Path) -> None:
    now = target_fingerprint(gemma3, load_tokenizer(gemma3))
    old = now.model_copy(update={"config": "0" * 64, "tokenizer": "1" * 64, "id": "2" * 64})  # transformers' reading
    assert old.same_file_otherwise_hashed(now) and not old.tokenization_matches(now)
    assert OTHER_VERSION in _fingerprint_problems(old, now)[0]
    other_file = old.model_copy(update={"weights": "3" * 64})
    assert not other_file.same_file_otherwise_hashed(now)
    assert OTHER_VERSION not in _fingerprint_problems(other_file, now)[0]


def test_the_template_in_the_file_and_its_tokens_decide_the_fingerprint(tmp_path: Path) -> None:
    plain = write_tiny_gguf(tmp_path / "plain.gguf", "gemma3", num_layers=2, chat_template=False)
    chat = write_tiny_gguf(tmp_path / "chat.gguf", "gemma3", num_layers=2)
    a, b = (target_fingerprint(p, load_tokenizer(p)) for p in (plain, chat))
    assert (a.tokenizer, a.config, a.vocab_size) == (b.tokenizer, b.config, b.vocab_size) and a.chat_template != b.chat_template
    llama = write_tiny_gguf(tmp_path / "llama.gguf", "llama")
    c = target_fingerprint(llama, load_tokenizer(llama))
    assert c.tokenizer != a.tokenizer and c.config != a.config


def test_a_file_that_is_not_gguf_is_refused_in_one_line(tmp_path: Path) -> None:
    for name, data in (("empty.gguf", b""), ("text.gguf", b"hello"), ("cut.gguf", b"GGUF\x03\x00\x00\x00\x01")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(EyasError, match=f"{name}: not a readable GGUF file"):
            read_gguf_metadata(tmp_path / name)


def test_auto_runs_a_quantized_gguf_in_float32_and_its_directory_by_the_usual_rule(gemma3: Path, tmp_path: Path) -> None:
    from eyas.models.materialise import materialise_gguf

    packed = choose_dtype("auto", "cpu", gemma3)
    assert packed.dtype == "float32" and "quantized GGUF" in packed.reason
    assert choose_dtype("bfloat16", "cpu", gemma3).dtype == "bfloat16"  # an explicit dtype is honoured
    directory = materialise_gguf(gemma3, tmp_path / "hf")
    assert choose_dtype("auto", "cpu", directory) == choose_dtype("auto", "cpu")
