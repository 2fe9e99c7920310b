"""`eyas materialise GGUF DIR` on tiny GGUF files of two architectures (Llama, Gemma-3): a directory that
transformers loads into the same logits and tokens as the GGUF itself, that is the same target as the
GGUF, written whole or not at all, and one-line refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from eyas.models.fingerprint import target_fingerprint
from eyas.models.materialise import READY, WEIGHTS, hf_config
from eyas.models.tokenizer import load_tokenizer
from eyas.testing.gguf import write_tiny_gguf

TEXTS = ["the cat is on the mat. Hello!", "  two  spaces\tand\nnewlines ✓ 東京", "<start_of_turn>user\nhi<end_of_turn>\n"]
LAYERS = {"llama": 2, "gemma3": 6}  # Gemma-3: five sliding-window layers (window 16) and one full


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf")
    return {kind: write_tiny_gguf(root / f"{kind}.gguf", kind, num_layers) for kind, num_layers in LAYERS.items()}  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_the_directory_gives_the_ggufs_logits_tokens_and_fingerprint(kind: str, ggufs, run_cli, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    gguf, directory = ggufs[kind], tmp_path / "hf"
    result = run_cli("materialise", gguf, directory)
    assert result.code == 0, result.err
    config = json.loads((directory / "config.json").read_text())
    expected = {"llama": "LlamaForCausalLM", "gemma3": "Gemma3ForCausalLM"}[kind]
    assert config["architectures"] == [expected] and config["dtype"] == "float32" and "quantization_config" not in config
    ours, theirs = load_tokenizer(directory), load_tokenizer(gguf)
    for text in TEXTS:
        assert ours(text)["input_ids"] == theirs(text)["input_ids"]
    chat = [{"role": "user", "content": TEXTS[0]}]
    assert ours.apply_chat_template(chat, tokenize=False) == theirs.apply_chat_template(chat, tokenize=False)
    ids = torch.tensor([theirs(TEXTS[0] * 2)["input_ids"]])  # [1, T], T > the sliding window of 16
    assert ids.shape[1] > 16
    with torch.no_grad():
        mine = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)(input_ids=ids).logits
        reference = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                         dtype=torch.float32)(input_ids=ids).logits
    assert torch.equal(mine, reference)  # [1, T, V]
    assert target_fingerprint(directory, ours) == target_fingerprint(gguf, theirs)  # the same target
    again = run_cli("materialise", gguf, directory)  # an intact earlier one is reused
    assert again.code == 0 and f"eyas materialise -> {directory}" in again.out


def test_bfloat16_halves_the_weights_and_keeps_only_the_tokenization(ggufs, run_cli, tmp_path: Path) -> None:
    from safetensors import safe_open

    gguf = ggufs["gemma3"]
    assert run_cli("materialise", gguf, tmp_path / "bf16", "--dtype", "bfloat16").code == 0
    with safe_open(str(tmp_path / "bf16" / WEIGHTS), "pt") as handle:
        assert {handle.get_tensor(name).dtype for name in handle.keys()} == {torch.bfloat16}
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    mine, theirs = (target_fingerprint(p, load_tokenizer(p)) for p in (tmp_path / "bf16", gguf))
    assert mine.tokenization_matches(theirs) and mine.id != theirs.id


def test_an_edited_directory_is_no_longer_the_ggufs_target(ggufs, run_cli, tmp_path: Path) -> None:
    gguf, directory = ggufs["llama"], tmp_path / "hf"
    assert run_cli("materialise", gguf, directory).code == 0
    reference = target_fingerprint(gguf, load_tokenizer(gguf))
    config = directory / "tokenizer_config.json"
    config.write_text(config.read_text().replace("{", '{"edited": "by hand", ', 1))  # any transformers line loads it
    edited = target_fingerprint(directory, load_tokenizer(directory))
    assert not edited.tokenization_matches(reference)
    refused = run_cli("materialise", gguf, directory)
    assert refused.code == 2 and refused.err.strip().endswith("is not empty; give a new or empty directory")


def test_an_abandoned_build_is_removed_and_never_looks_finished(ggufs, tmp_path: Path) -> None:
    from eyas.models.materialise import materialise_gguf

    directory = tmp_path / "hf"
    dead = tmp_path / ".hf.building-999999999"  # no such pid: a run killed mid-write
    dead.mkdir()
    (dead / WEIGHTS).write_bytes(b"half")
    assert materialise_gguf(ggufs["llama"], directory) == directory
    assert not dead.exists() and (directory / READY).is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".hf.building")]
    assert os.listdir(directory)


def test_refusals_are_one_line(ggufs, run_cli, tmp_path: Path) -> None:
    import gguf as gguf_package

    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    (tmp_path / "model.gguf").write_text("not a gguf")
    writer = gguf_package.GGUFWriter(str(tmp_path / "rwkv.gguf"), "rwkv6")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    cases = [((tmp_path / "model.gguf", tmp_path / "a"), "not a GGUF file"),
             ((ggufs["llama"], tmp_path / "busy"), "busy: is not empty; give a new or empty directory"),
             ((tmp_path / "rwkv.gguf", tmp_path / "b"), "transformers cannot read this GGUF file"),
             ((ggufs["llama"], tmp_path / "c", "--dtype", "int8"), "--dtype: 'int8': expected float32")]
    for args, message in cases:
        result = run_cli("materialise", *args)
        assert result.code == 2 and message in result.err and len(result.err.strip().splitlines()) == 1, result.err
        assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"


def test_rope_is_also_spelled_the_way_transformers_4_reads_it() -> None:
    flat = hf_config({"rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}, "quantization_config": {}},
                     "LlamaForCausalLM", "float32")
    assert flat["rope_theta"] == 5e5 and "rope_scaling" not in flat and "quantization_config" not in flat
    per_layer = hf_config({"rope_parameters": {"full_attention": {"rope_theta": 1e6, "rope_type": "linear", "factor": 8.0},
                                               "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}}},
                          "Gemma3ForCausalLM", "bfloat16")
    assert (per_layer["rope_theta"], per_layer["rope_local_base_freq"]) == (1e6, 1e4)
    assert per_layer["rope_scaling"]["factor"] == 8.0 and per_layer["torch_dtype"] == "bfloat16"
