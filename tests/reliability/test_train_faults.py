"""Faults `eyas train` survives, each in a real subprocess: a full disk while a checkpoint is written,
SIGTERM at random points (each rerun ends with the uninterrupted run's weights, bit for bit), and
non-finite numbers (a NaN in stored features, a loss that overflows, a learning rate or weight decay
that wrecks the weights): training stops naming the shard and sample or the optimizer step, and no
checkpoint, best/ or final/ ever holds the broken weights."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import (Finished, on_full_disk_then_rerun, poison_sample, run_sigterm_after,
                      sigterm_at_random_points, temporary_files, tree_bytes)
from safetensors.torch import load_file

from eyas.config import TrainConfig
from eyas.draft.model import load_draft
from eyas.features.store import read_store_manifest
from eyas.train import batches as B
from eyas.train.sources import StoreSource

EYAS = str(Path(sys.executable).parent / "eyas")
PAGE = 4096  # tmpfs allocates whole pages
ROW_TOKENS, TOKEN_BUDGET = 128, 512
STOPPED = "the checkpoints and best/ keep the last good weights; lower --lr or check the inputs"


def environment() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def store(example_store: Path) -> Path:
    return example_store


def train_command(store: Path, out: Path, *extra: str) -> list[str]:
    """4 steps of one micro-batch (the 18 training samples make 4), each evaluated, each checkpointed, all kept."""
    return [EYAS, "train", "--features", str(store), "--out", str(out), "--max-steps", "4", "--grad-accum", "1",
            "--ttt-steps", "2", "--token-budget", str(TOKEN_BUDGET), "--device", "cpu", f"row_tokens={ROW_TOKENS}",
            "log_every=1", "save_every=1", "eval_every=1", "keep_last=4", "dtype=float32", "target_dtype=float32",
            *extra]


@pytest.fixture(scope="module")
def reference(store: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Finished]:
    """The uninterrupted run, and when (once it could catch SIGTERM) it had claimed its run directory
    and written its last file."""
    out = tmp_path_factory.mktemp("train-reference") / "run"
    finished = run_sigterm_after(train_command(store, out), None, environment(),
                                 markers=(out / "config.yaml", out / "summary.json"))
    assert finished.code == 0 and None not in finished.marked, finished
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [f"step-0000000{s}" for s in range(1, 5)]
    return out, finished


def metric_lines(run: Path) -> list[dict]:
    """metrics.jsonl without the wall-clock rate."""
    return [{k: v for k, v in json.loads(line).items() if k != "tokens_per_s"}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def assert_same_run(got: Path, expected: Path) -> None:
    """Bit-identical final weights (torch.equal, tensor by tensor), checkpoints, best/ and metrics."""
    final, reference = (load_file(str(run / "final" / "model.safetensors")) for run in (got, expected))
    assert final.keys() == reference.keys()
    assert all(torch.equal(final[name], tensor) for name, tensor in reference.items())
    for part in ("checkpoints", "best", "final"):
        assert tree_bytes(got / part) == tree_bytes(expected / part), part
    assert metric_lines(got) == metric_lines(expected)


def pages(root: Path) -> int:
    """Return the tmpfs pages the files under `root` (or the file `root`) take."""
    files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
    return sum(-(-p.stat().st_size // PAGE) for p in files)


def test_disk_full_while_writing_a_checkpoint_then_rerun_matches(store, reference, tmp_path: Path) -> None:
    done, _ = reference
    second = done / "checkpoints" / "step-00000002"
    # the lock, run.json, config.yaml, metrics.jsonl, checkpoint 1 and best/ fit, with room for best/ written
    # again; checkpoint 2 gets its draft in, then runs out of space half way through the optimizer state
    room = pages(second / "draft") + pages(second / "optimizer.safetensors") // 2
    size = PAGE // 1024 * (4 + pages(done / "checkpoints" / "step-00000001") + pages(done / "best") + room)
    out = tmp_path / "run"
    runs = on_full_disk_then_rerun(train_command(store, out), out, size, tmp_path / "copies", environment())
    assert runs.failed.code == 2
    assert runs.failed.err == (f"eyas: error: {out / 'checkpoints' / 'step-00000002'}: disk full (No space left on "
                               "device) while writing it; free space and rerun the same command to resume\n")
    left = runs.left
    assert sorted(p.name for p in left.iterdir()) == [".eyas-lock", "best", "checkpoints", "config.yaml",
                                                      "metrics.jsonl", "run.json"]
    assert [p.name for p in (left / "checkpoints").iterdir()] == ["step-00000001"]  # no temporary directory
    assert temporary_files(left) == []
    first = Path("checkpoints") / "step-00000001"
    assert tree_bytes(left / first) == tree_bytes(done / first)  # what resume loads: the uninterrupted run's
    assert runs.rerun.code == 0, runs.rerun.err
    assert_same_run(runs.result, done)


def test_sigterm_at_random_points_then_rerun_matches(store, reference, tmp_path: Path) -> None:
    """One point anywhere in the run, one while it trains and writes (imports and loading take much of it)."""
    done, run = reference
    sigterm_at_random_points(lambda out: train_command(store, out), tmp_path, "summary.json", run, 20240612,
                             lambda out: assert_same_run(out, done), environment())


def read_at_step(store: Path, step: int) -> tuple[str, int, int]:
    """Return (shard file, position, sample id) of a training sample first read at optimizer `step`
    (1-based) of `train_command`: the micro-batch plan of epoch 0, one micro-batch per step."""
    manifest = read_store_manifest(store)
    lengths = StoreSource(store, manifest).lengths()
    defaults = TrainConfig.model_fields
    train, _ = B.split_indices(len(lengths), defaults["eval_fraction"].default, defaults["seed"].default)
    plan = B.plan_epoch(train, lengths, defaults["seed"].default, 0, ROW_TOKENS, TOKEN_BUDGET)
    assert len(plan) == 4
    index = plan[step - 1][0][0]
    info = next(s for s in manifest.shards if s.first_sample <= index < s.first_sample + s.samples)
    return info.file, index - info.first_sample, index


@pytest.mark.parametrize("value", [float("nan"), 3e38], ids=["nan-feature", "overflowing-feature"])
def test_non_finite_at_step_3_stops_and_keeps_the_good_checkpoints(value: float, store, reference,
                                                                   tmp_path: Path) -> None:
    """A NaN in one sample's stored features is refused as it is read (naming shard and sample); a
    huge finite one passes that check and makes the loss NaN, refused before the update (naming the
    step). Either way checkpoints 1 and 2 and best/ are the uninterrupted run's, bit for bit."""
    done, _ = reference
    poisoned = tmp_path / "store"
    shutil.copytree(store, poisoned)
    shard, position, index = read_at_step(poisoned, 3)
    assert poison_sample(poisoned, shard, position, "aux", value) == index
    out = tmp_path / "run"
    failed = subprocess.run(train_command(poisoned, out), capture_output=True, text=True, env=environment())
    assert failed.returncode == 2
    if value != value:  # NaN
        assert failed.stderr == (f"eyas: error: {poisoned / shard}: sample {index}: aux features hold NaN or Inf; "
                                 "extract the store again (eyas extract --overwrite)\n")
    else:
        assert failed.stderr == ("eyas: error: train: optimizer step 3: loss nan, gradient norm nan; stopped before "
                                 f"applying the update: {STOPPED}\n")
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000001", "step-00000002"]
    for step in ("step-00000001", "step-00000002"):  # the run key names the --features path, so it differs
        got, expected = (tree_bytes(run / "checkpoints" / step) for run in (out, done))
        for files in (got, expected):
            files["trainer.json"] = json.loads(files["trainer.json"]) | {"run_key": None}
        assert got == expected
    best_step = json.loads((out / "checkpoints" / "step-00000002" / "trainer.json").read_text())["best_step"]
    assert tree_bytes(out / "best") == tree_bytes(done / "checkpoints" / f"step-{best_step:08d}" / "draft")
    assert all(bool(torch.isfinite(p).all()) for p in load_draft(out / "best").parameters())
    assert not (out / "final").exists() and not (out / "summary.json").exists()


@pytest.mark.parametrize(("extra", "expected"), [
    (["--lr", "1e12"], r"optimizer step 1: held-out loss nan; stopped before saving its weights"),
    (["--lr", "1e20", "weight_decay=1e20"], r"optimizer step 1: the update made draft weights non-finite "
                                            r"\(loss [0-9.]+, gradient norm [0-9.]+\); stopped before saving them"),
], ids=["diverging-lr", "overflowing-weight-decay"])
def test_an_update_that_wrecks_the_weights_is_never_saved(extra: list[str], expected: str, store,
                                                          tmp_path: Path) -> None:
    out = tmp_path / "run"
    failed = subprocess.run(train_command(store, out, *extra), capture_output=True, text=True, env=environment())
    assert failed.returncode == 2
    assert re.fullmatch(f"eyas: error: train: {expected}: {re.escape(STOPPED)}\n", failed.stderr), failed.stderr
    assert sorted(p.name for p in out.iterdir()) == [".eyas-lock", "config.yaml", "metrics.jsonl", "run.json"]
