"""`eyas extract`, `eyas verify` and `eyas preflight extract` through the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from eyas.features.extract import length_batches, plan_shards
from eyas.features.store import FeatureShard, read_store_manifest
from eyas.models.capture import teacher_logits
from eyas.models.load import load_target
from eyas.testing.tiny import build_tiny_target


def extract_args(target: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return ["extract", "--target", str(target), "--data", str(data), "--out", str(out), "--dtype", "float32", *extra]


@pytest.mark.parametrize("architecture", ["llama", "deepseek_v3"])
def test_teacher_from_the_store_equals_the_model_logits(weighted_target, prepared, run_cli, tmp_path: Path,
                                                        architecture: str) -> None:
    target = weighted_target(architecture)
    data = prepared(target)
    out = tmp_path / "store"
    result = run_cli(*extract_args(target, data, out, "--storage-dtype", "fp32", "shard_tokens=400", "token_budget=300"))
    assert result.code == 0, result.err
    manifest = read_store_manifest(out)
    assert manifest.layer_ids == [2, 4, 5] and manifest.layer_convention == "input" and len(manifest.shards) > 1
    assert manifest.samples == 19 and manifest.target.id and manifest.dataset_fingerprint
    parts = load_target(target, torch.float32, "cpu")
    worst, seen = 0.0, 0
    for info in manifest.shards:
        shard = FeatureShard(out / info.file)
        for position in range(len(shard)):
            sample = shard.sample(position)
            with torch.no_grad():
                logits = parts.model(input_ids=sample["input_ids"].long()[None]).logits[0]  # [T, V]
            worst = max(worst, (teacher_logits(parts, sample["last"]) - logits).abs().max().item())
            seen += 1
    assert seen == 19 and worst < 1e-4, worst


def test_bf16_and_fp8_stores_verify_and_a_flipped_byte_is_caught(weighted_target, prepared, run_cli, tmp_path: Path) -> None:
    target = weighted_target("llama")
    data = prepared(target)
    sizes = {}
    for storage in ("bf16", "fp8"):
        out = tmp_path / storage
        assert run_cli(*extract_args(target, data, out, "--storage-dtype", storage)).code == 0
        verified = run_cli("verify", out)
        assert verified.code == 0 and "ok" in verified.out
        sizes[storage] = read_store_manifest(out).bytes_per_token
        first = FeatureShard(out / "shard-00000.safetensors").sample(0)
        assert first["aux"].dtype == torch.float32 and first["aux"].shape[1] == 3 * 64
    assert sizes["fp8"] < 0.6 * sizes["bf16"]
    shard = tmp_path / "fp8" / "shard-00000.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[-10] ^= 0x01
    shard.write_bytes(bytes(raw))
    broken = run_cli("verify", tmp_path / "fp8")
    assert broken.code == 1 and "shard-00000.safetensors: sha256 mismatch" in broken.err


def test_rerun_reuses_a_finished_store(weighted_target, prepared, run_cli, tmp_path: Path) -> None:
    target = weighted_target("llama")
    args = extract_args(target, prepared(target), tmp_path / "store")
    assert run_cli(*args).code == 0
    again = run_cli(*args)
    assert again.code == 0 and "already extracted" in again.out


def test_no_preflight_skips_the_checks_but_writes_the_same_store(weighted_target, prepared, run_cli, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    target = weighted_target("llama")
    assert run_cli(*extract_args(target, prepared(target), tmp_path / "checked")).code == 0

    def no_audit() -> tuple[list[str], dict[str, str]]:
        raise AssertionError("--no-preflight ran the engine API audit")

    monkeypatch.setattr("eyas.features.preflight.engine_api_problems", no_audit)
    result = run_cli(*extract_args(target, prepared(target), tmp_path / "unchecked", "--no-preflight"))
    assert result.code == 0, result.err
    checked, unchecked = read_store_manifest(tmp_path / "checked"), read_store_manifest(tmp_path / "unchecked")
    assert [s.sha256 for s in checked.shards] == [s.sha256 for s in unchecked.shards]
    assert checked.run_key == unchecked.run_key


def test_dataset_for_another_target_is_refused_before_weights_load(tiny_targets, weighted_target, prepared, run_cli,
                                                                    tmp_path: Path) -> None:
    data = prepared(tiny_targets["llama3"])  # a different tokenizer and template
    target = weighted_target("llama")
    result = run_cli(*extract_args(target, data, tmp_path / "store"))
    assert result.code == 1 and result.err.count("\n") == 1  # found by the preflight: exit 1, as a check
    assert "the dataset was prepared for another tokenizer or chat template" in result.err
    assert not (tmp_path / "store").exists()


def preflight_problem(run_cli, *args: str | Path) -> str:
    result = run_cli(*args)
    assert result.code == 1 and result.err.count("\n") == 1 and "Traceback" not in result.err, result.err
    assert result.err.startswith("eyas: error: preflight found")
    return result.err


def test_bad_layers_are_refused(weighted_target, prepared, run_cli, tmp_path: Path) -> None:
    target = weighted_target("llama")
    data = prepared(target)
    err = preflight_problem(run_cli, *extract_args(target, data, tmp_path / "s", "--layers", "2,4,99",
                                                   "--layer-convention", "input"))
    assert "layers: [99] out of range for a 8-layer target in the input convention (0..8)" in err
    err = preflight_problem(run_cli, *extract_args(target, data, tmp_path / "s", "--layers", "2,4,5"))
    assert "layer_convention: required with --layers" in err
    err = preflight_problem(run_cli, *extract_args(target, data, tmp_path / "s", "--layers", "5,2,4",
                                                   "--layer-convention", "input"))  # refused now, not at export
    assert "layers: [5, 2, 4] not ascending (engines concatenate the layers in ascending order)" in err


def test_missing_weight_shard_and_unwritable_out_are_reported_together(weighted_target, prepared, run_cli,
                                                                        tmp_path: Path) -> None:
    source = weighted_target("llama")
    data = prepared(source)
    target = tmp_path / "sharded"
    shutil.copytree(source, target)
    (target / "model.safetensors").rename(target / "model-00001-of-00002.safetensors")
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors",
                                            "model.norm.weight": "model-00001-of-00002.safetensors"}}
    (target / "model.safetensors.index.json").write_text(json.dumps(index))
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    err = preflight_problem(run_cli, *extract_args(target, data, blocker / "store"))
    assert "preflight found 2 problem(s)" in err
    assert "model-00002-of-00002.safetensors: missing (listed in model.safetensors.index.json)" in err
    assert f"{blocker / 'store'}: not writable" in err


@pytest.mark.parametrize(("shape", "layers"), [
    ({"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
      "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256}, "[2, 40, 77]"),
    ({"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
      "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "n_routed_experts": 256,
      "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "vocab_size": 129280,
      "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
      "n_group": 8, "topk_group": 4}, "[2, 30, 58]"),
], ids=["llama-3-70b", "deepseek-v3"])
def test_weightless_preflight_of_huge_targets(run_cli, tmp_path: Path, shape: dict, layers: str) -> None:
    target = build_tiny_target(tmp_path / "big", "chatml")
    (target / "config.json").write_text(json.dumps({"architectures": [], **shape}))
    (target / "model-00001-of-00001.safetensors").write_bytes(b"")
    index = {"weight_map": {"lm_head.weight": "model-00001-of-00001.safetensors"}}
    (target / "model.safetensors.index.json").write_text(json.dumps(index))
    examples = Path(__file__).resolve().parents[2] / "examples" / "data"
    assert run_cli("prepare", "--target", target, "--data", examples, "--out", tmp_path / "ds").code == 0
    result = run_cli("preflight", "extract", "--target", target, "--data", tmp_path / "ds", "--out", tmp_path / "store",
                     "--device", "cpu")
    assert result.code == 0, result.out + result.err
    assert f"aux layers: {layers} as inputs of layers" in result.out
    assert "capture dry run: ok on meta" in result.out and "preflight ok" in result.out
    assert not (tmp_path / "store").exists()


def test_batches_respect_the_token_budget_and_shards_cover_every_sample() -> None:
    lengths = [5, 300, 40, 40, 41, 7, 120, 3]
    batches = length_batches(lengths, 128)
    assert sorted(p for b in batches for p in b) == list(range(8))
    assert all(len(b) * lengths[b[0]] <= 128 or len(b) == 1 for b in batches)
    assert all(lengths[b[0]] == max(lengths[p] for p in b) for b in batches)
    spans = plan_shards(torch.tensor(lengths).numpy(), 100)
    assert spans[0][0] == 0 and spans[-1][1] == 8 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def test_quantized_checkpoints_that_cannot_load_here_are_named_before_loading(weighted_target, prepared, run_cli,
                                                                               tmp_path: Path) -> None:
    source = weighted_target("llama")
    data = prepared(source)
    target = tmp_path / "fp8-model"
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (target / "config.json").write_text(json.dumps(config))
    err = preflight_problem(run_cli, *extract_args(target, data, tmp_path / "store", "--device", "cpu"))
    assert "quantization_config: fp8 weights need a CUDA device; this run has cpu" in err
