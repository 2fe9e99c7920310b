"""The store holds the target's full-vocabulary argmax per token: it is the target model's own greedy
token (transformers' logits), exactly what training would recompute from the stored `last`, in every
storage dtype; a shard whose argmax is missing, damaged or not the manifest's is refused in one line."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from eyas.backends.vllm.contract import InstalledVllm, VllmPath
from eyas.config import ExtractConfig
from eyas.draft.objective import TeacherHead
from eyas.errors import EyasError
from eyas.features.extract import run_extract
from eyas.features.preflight import preflight_extract
from eyas.features.store import FeatureShard, StoreManifest, open_store, read_store_manifest, verify_store
from eyas.files import sha256_file
from eyas.models.argmax import TargetArgmax
from eyas.models.head import load_target_head

SHARD = "shard-00001.safetensors"
TESTS = Path(__file__).resolve().parents[1]


def extract(target: Path, data: Path, out: Path, storage: str = "fp32") -> StoreManifest:
    """Extract in float32 into at least two shards; return the manifest."""
    manifest, _ = run_extract(ExtractConfig(target=target, data=data, out=out, dtype="float32", storage_dtype=storage,
                                            device="cpu", shard_tokens=400, token_budget=300))
    assert len(manifest.shards) > 1
    return manifest


def stored_samples(store: Path) -> list[dict[str, torch.Tensor]]:
    manifest = read_store_manifest(store)
    return [shard.sample(position) for shard in open_store(store, manifest) for position in range(len(shard))]


@pytest.mark.parametrize("architecture", ["llama", "gemma2"])  # gemma2: a final-logit soft cap
def test_the_stored_argmax_is_the_target_models_greedy_token(weighted_target, prepared, tmp_path: Path,
                                                              architecture: str) -> None:
    target = weighted_target(architecture)
    manifest = extract(target, prepared(target), tmp_path / "store")
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    assert manifest.format_version == 2 and manifest.teacher_argmax is not None
    assert manifest.teacher_argmax.vocab_size == model.config.vocab_size == 512
    head = load_target_head(target, torch.float32, "cpu")  # what training reads, not the extraction's model
    draft_ids = torch.arange(0, 512, 7)
    recomputed = TeacherHead(head.final_norm, head.lm_head, draft_ids, head.softcap)
    samples = stored_samples(tmp_path / "store")
    for sample in samples:
        stored = sample["argmax"]
        assert stored.dtype == torch.int32
        with torch.no_grad():
            greedy = model(input_ids=sample["input_ids"].long()[None]).logits[0].argmax(-1)  # [T], transformers' own
        assert torch.equal(stored.long(), greedy)
        assert torch.equal(stored.long(), recomputed(sample["last"][None]).argmax[0])
    every = torch.cat([sample["argmax"] for sample in samples])
    assert len(every.unique()) > 10  # a real label, not a constant


def test_the_vllm_backend_stores_the_same_argmax(weighted_target, prepared, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the stand-in engine of tests/backends/test_vllm_backend.py (vLLM's file layout, features from
    transformers): the argmax is computed beside the engine from the target's head, as the HF backend's."""
    spec = importlib.util.spec_from_file_location("vllm_backend_tests", TESTS / "backends" / "test_vllm_backend.py")
    tests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tests)  # type: ignore[union-attr]
    module = types.ModuleType("eyas_stand_in_vllm")
    module.Engine = tests._StandInEngine  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "eyas_stand_in_vllm", module)
    path = VllmPath("stand-in", "0.0.0", None, (), ("0.0.0", "0.0.0"), "eyas_stand_in_vllm:Engine", "test")
    monkeypatch.setattr("eyas.backends.vllm.extractor.usable_path", lambda: (InstalledVllm("vllm", "0.0.0"), path))
    target = weighted_target("llama")
    hf = extract(target, prepared(target), tmp_path / "hf")
    config = ExtractConfig(target=target, data=prepared(target), out=tmp_path / "vllm", backend="vllm", dtype="float32",
                           storage_dtype="fp32", shard_tokens=400)
    manifest, _ = run_extract(config, preflight_extract(config.model_copy(update={"backend": "hf"})))
    assert manifest.backend == "vllm 0.0.0 (stand-in)" and manifest.teacher_argmax == hf.teacher_argmax
    assert verify_store(tmp_path / "vllm") == []
    ours, theirs = stored_samples(tmp_path / "vllm"), stored_samples(tmp_path / "hf")
    assert len(ours) == len(theirs) == 19
    assert all(torch.equal(a["argmax"], b["argmax"]) for a, b in zip(ours, theirs))


@pytest.mark.parametrize("storage", ["bf16", "fp8"])
def test_the_stored_argmax_is_recomputed_exactly_from_a_rounded_store(weighted_target, prepared, tmp_path: Path,
                                                                      storage: str) -> None:
    """From bf16 or fp8 `last`, the argmax is the rounded state's: what training computes from what it reads."""
    target = weighted_target("llama")
    extract(target, prepared(target), tmp_path / "store", storage)
    head = load_target_head(target, torch.float32, "cpu")
    argmax = TargetArgmax(head.final_norm, head.lm_head)
    for sample in stored_samples(tmp_path / "store"):
        assert torch.equal(sample["argmax"].long(), argmax(sample["last"]))


@pytest.fixture(scope="module")
def two_shards(weighted_target, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from eyas.config import PrepareConfig
    from eyas.data.prepare import run_prepare

    root = tmp_path_factory.mktemp("argmax-store")
    target = weighted_target("llama")
    examples = Path(__file__).resolve().parents[2] / "examples" / "data"
    run_prepare(PrepareConfig(target=target, data=[examples], out=root / "ds"))
    extract(target, root / "ds", root / "store")
    return root / "store"


def rewrite_shard(store: Path, shard: str, change: Callable[[dict[str, torch.Tensor], dict[str, str]], None]) -> None:
    """Rewrite `store/shard` after `change(tensors, metadata)` and record its new size and sha256 in the
    manifest, so the change is the store's only fault."""
    path = store / shard
    with safe_open(str(path), framework="pt") as handle:
        tensors, metadata = {key: handle.get_tensor(key) for key in handle.keys()}, handle.metadata()
    change(tensors, metadata)
    save_file(tensors, str(path), metadata=metadata)
    manifest = json.loads((store / "manifest.json").read_text())
    entry = next(info for info in manifest["shards"] if info["file"] == shard)
    entry["sha256"], entry["bytes"] = sha256_file(path), path.stat().st_size
    (store / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def without_argmax(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    del tensors["argmax"]
    described = json.loads(metadata["eyas.features"])
    del described["vocab_size"]
    metadata["eyas.features"] = json.dumps(described, sort_keys=True)


def out_of_vocabulary(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    tensors["argmax"][int(tensors["offsets"][1]) + 2] = 512  # the second sample's third token


def as_int64(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    tensors["argmax"] = tensors["argmax"].long()


def assert_refused_in_one_line(store: Path, expected: str, run_cli) -> None:
    """`verify` reports `expected` for the shard, and opening the store (as `train` does) refuses it in one line."""
    problems = verify_store(store)
    assert any(problem.startswith(f"{store / SHARD}: ") and expected in problem for problem in problems), problems
    verified = run_cli("verify", store)
    assert verified.code == 1 and expected in verified.err and "Traceback" not in verified.err
    with pytest.raises(EyasError) as error:
        shards = open_store(store, read_store_manifest(store))
        for shard in shards:  # features are checked as each sample is read
            for position in range(len(shard)):
                shard.sample(position)
    message = str(error.value)
    assert message.startswith(f"{store / SHARD}: ") and expected in message and "\n" not in message, message


@pytest.mark.parametrize("change, expected", [
    (without_argmax, "argmax: missing, but the manifest's teacher_argmax says every shard holds it"),
    (out_of_vocabulary, "argmax holds token ids outside the target's vocabulary 0..511"),
    (as_int64, "argmax: shape [95] I64 but the manifest implies [95] I32"),
], ids=["missing", "out-of-vocabulary", "int64"])
def test_a_shard_with_a_missing_or_damaged_argmax_is_refused(two_shards: Path, tmp_path: Path, run_cli, change,
                                                              expected: str) -> None:
    store = shutil.copytree(two_shards, tmp_path / "store")
    tokens = next(info.tokens for info in read_store_manifest(store).shards if info.file == SHARD)
    rewrite_shard(store, SHARD, change)
    assert_refused_in_one_line(store, expected.replace("[95]", f"[{tokens}]"), run_cli)


def test_a_changed_argmax_byte_fails_the_checksum(two_shards: Path, tmp_path: Path, run_cli) -> None:
    store = shutil.copytree(two_shards, tmp_path / "store")
    with safe_open(str(store / SHARD), framework="pt") as handle:
        argmax = handle.get_tensor("argmax")
    raw = bytearray((store / SHARD).read_bytes())
    at = raw.index(argmax.numpy().tobytes())  # the tensor's bytes in the file
    raw[at] ^= 0x01  # an id that stays inside the vocabulary: only the checksum can tell
    (store / SHARD).write_bytes(bytes(raw))
    assert_refused_in_one_line(store, "sha256 mismatch", run_cli)


def test_an_argmax_the_manifest_does_not_describe_is_refused(two_shards: Path, tmp_path: Path, run_cli) -> None:
    """A shard of a new store among a format-1 manifest's: mixed stores are refused, never half read."""
    store = shutil.copytree(two_shards, tmp_path / "store")
    rewrite_shard(store, "shard-00000.safetensors", without_argmax)  # a format-1 shard: only shard 1 is foreign
    manifest = json.loads((store / "manifest.json").read_text())
    manifest["teacher_argmax"] = None
    (store / "manifest.json").write_text(json.dumps(manifest))
    assert_refused_in_one_line(store, "argmax: in the shard, but the manifest describes none", run_cli)


def test_a_shard_reads_its_argmax_only_when_it_holds_one(two_shards: Path, tmp_path: Path) -> None:
    store = shutil.copytree(two_shards, tmp_path / "store")
    rewrite_shard(store, SHARD, without_argmax)
    assert "argmax" in FeatureShard(store / "shard-00000.safetensors").sample(0)
    assert "argmax" not in FeatureShard(store / SHARD).sample(0)
