"""Training reads the target's argmax from the store and never computes the full-vocabulary logits; a
store made before eyas stored it (format 1) still trains, to the same metrics and weights, computing
each sample's argmax once per run instead of once per micro-batch of every epoch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from eyas.config import TrainConfig
from eyas.features.store import read_store_manifest
from eyas.files import sha256_file
from eyas.models.argmax import TargetArgmax
from eyas.train.loop import run_train

# 4 micro-batches per epoch (rows <= 128 tokens, 512-token micro-batches), two epochs, held-out evaluations
SETTINGS = {"epochs": 2, "ttt_steps": 2, "token_budget": 512, "row_tokens": 128, "device": "cpu", "dtype": "float32",
            "log_every": 1, "eval_every": 3, "save_every": 100}


def as_format_1(store: Path, out: Path) -> Path:
    """Copy `store` as eyas wrote stores before the argmax: no `argmax` tensor or vocabulary in the shards,
    no `teacher_argmax` in a format-1 manifest (each shard's size and sha256 recorded anew)."""
    shutil.copytree(store, out)
    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["shards"]:
        path = out / entry["file"]
        with safe_open(str(path), framework="pt") as handle:
            tensors = {key: handle.get_tensor(key) for key in handle.keys() if key != "argmax"}
            described = json.loads(handle.metadata()["eyas.features"])
        del described["vocab_size"]
        save_file(tensors, str(path), metadata={"eyas.features": json.dumps(described, sort_keys=True)})
        entry["sha256"], entry["bytes"] = sha256_file(path), path.stat().st_size
    del manifest["teacher_argmax"]
    manifest["format_version"] = 1
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return out


class Counted:
    """Counts the calls of `TargetArgmax` and the positions each computed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls, self.positions = 0, 0
        original = TargetArgmax.forward

        def forward(module: TargetArgmax, last: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            self.positions += last.shape[:-1].numel()
            return original(module, last)

        monkeypatch.setattr(TargetArgmax, "forward", forward)


def metric_lines(run: Path) -> list[dict]:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if k != "tokens_per_s"} for line in lines]


@pytest.fixture(scope="module")
def stored_run(example_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two epochs on the store with its argmax; the full-vocabulary argmax must never run."""
    assert read_store_manifest(example_store).teacher_argmax is not None
    out = tmp_path_factory.mktemp("stored") / "run"
    with pytest.MonkeyPatch.context() as patch:
        counted = Counted(patch)
        run_train(TrainConfig(features=example_store, out=out, **SETTINGS))
    assert counted.calls == 0
    return out


def test_a_store_made_without_the_argmax_trains_to_the_same_run_computing_each_once(
        stored_run: Path, example_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    old = as_format_1(example_store, tmp_path / "old-store")
    manifest = read_store_manifest(old)
    counted = Counted(monkeypatch)
    capsys.readouterr()
    run_train(TrainConfig(features=old, out=tmp_path / "run", **SETTINGS))
    # every sample is read in both epochs (and the held-out ones at each evaluation), its argmax computed once
    assert counted.calls == manifest.samples and counted.positions == manifest.tokens
    said = [line for line in capsys.readouterr().err.splitlines() if "argmax" in line]
    assert said == [f"eyas: {old}: extracted before eyas stored the target's argmax: computing it over the 512-token "
                    "vocabulary once per sample, the first time each is read, and keeping it for the run (the first "
                    "epoch runs at the old rate, the later ones do not); `eyas extract --overwrite` stores it"]
    stored, recomputed = metric_lines(stored_run), metric_lines(tmp_path / "run")
    # 8 steps, held-out at steps 3, 6 and the last; the argmax decides the losses too (out-of-vocabulary masking)
    assert len(stored) == 8 + 3 and stored == recomputed
    expected = load_file(str(stored_run / "final" / "model.safetensors"))
    got = load_file(str(tmp_path / "run" / "final" / "model.safetensors"))
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)


@pytest.mark.parametrize("chunk_elements", [1 << 26, 3 * 40, 1], ids=["one-block", "blocks-of-7", "one-by-one"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_target_argmax_is_the_float32_argmax_block_by_block_and_ties_go_to_the_lowest_id(
        chunk_elements: int, dtype: torch.dtype) -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    generator = torch.Generator().manual_seed(0)
    norm = LlamaRMSNorm(16, eps=1e-6).to(dtype)
    weight = torch.randn(40, 16, generator=generator).to(dtype)  # [V, H]
    weight[33] = weight[5]  # a tie across blocks of 7: rows 5 and 33 give equal logits
    last = torch.randn(3, 6, 16, generator=generator)  # [B, T, H]
    last[0, 0] = weight[5].float() * 50  # so that the tied rows win at [0, 0]
    argmax = TargetArgmax(norm, weight, chunk_elements)
    assert (argmax.chunk_rows, argmax.vocab_block) == (max(1, chunk_elements // 40), max(1, chunk_elements // 16))
    assert argmax.weight.data_ptr() == weight.data_ptr()  # the head is shared, never copied
    with torch.no_grad():
        logits = norm.float()(last) @ weight.float().T  # [B, T, V] in float32
    got = argmax(last)
    assert got.shape == (3, 6) and got.dtype == torch.long
    assert torch.equal(got, logits.argmax(-1)) and int(got[0, 0]) == 5
