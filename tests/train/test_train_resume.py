"""`eyas train` killed with SIGKILL resumes to the uninterrupted run's losses and weights; torchrun with
2 gloo ranks and `--grad-accum 1` computes the same steps as one process with `--grad-accum 2`, with
and without `--fsdp`, and an FSDP run resumes a single-process checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import kill_9_when
from safetensors.torch import load_file


EYAS = str(Path(sys.executable).parent / "eyas")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
STEPS = 6


def environment() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}  # same reductions in every run; two ranks on two cores


@pytest.fixture(scope="module")
def store(example_store: Path) -> Path:
    return example_store


def train_command(store: Path, out: Path, grad_accum: int, *extra: str, launcher: list[str] | None = None,
                  token_budget: int = 512) -> list[str]:
    """6 steps over 4 micro-batches per epoch (rows <= 128 tokens, 512-token micro-batches; 5 with a
    384-token budget): the epoch boundaries, a mid-epoch checkpoint at step 3 and held-out evaluations
    (one micro-batch) every 2 steps are all crossed. float32 autocast on every CPU: these runs compare
    exact sums across rank counts, which bfloat16 rounding (auto on AVX-512-BF16 CPUs) would blur."""
    prefix = [*launcher, "-m", "eyas"] if launcher else [EYAS]  # as docs/train.md runs torchrun
    return [*prefix, "train", "--features", str(store), "--out", str(out), "--max-steps", str(STEPS),
            "--grad-accum", str(grad_accum), "--ttt-steps", "2", "--token-budget", str(token_budget), "--device", "cpu",
            "row_tokens=128", "log_every=1", "save_every=3", "eval_every=2", "dtype=float32", *extra]


@pytest.fixture(scope="module")
def uninterrupted(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: one process, 2 micro-batches per step, never interrupted."""
    out = tmp_path_factory.mktemp("train-uninterrupted") / "run"
    done = subprocess.run(train_command(store, out, 2), check=False, capture_output=True, text=True, env=environment())
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def metric_lines(run: Path) -> list[dict]:
    """The lines of metrics.jsonl without the wall-clock rate."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if k != "tokens_per_s"} for line in lines]


def losses(run: Path, split: str = "train") -> dict[int, float]:
    lines = [line for line in metric_lines(run) if line["split"] == split]
    steps = [line["step"] for line in lines]
    assert len(steps) == len(set(steps)), f"a step is logged twice: {steps}"
    return {line["step"]: line["loss"] for line in lines}


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "final" / "model.safetensors"))


def assert_same_weights(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], atol: float) -> None:
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.allclose(got[name].float(), tensor.float(), rtol=0, atol=atol), \
            (name, (got[name].float() - tensor.float()).abs().max().item())


def test_kill_9_then_resume_matches_the_uninterrupted_run(store: Path, uninterrupted: Path, tmp_path: Path) -> None:
    killed = tmp_path / "killed"
    kill_9_when(train_command(store, killed, 2), killed / "checkpoints" / "step-00000003" / "trainer.json",
                env=environment())
    assert not (killed / "summary.json").exists() and not (killed / "final").exists()
    written = [line for line in (killed / "metrics.jsonl").read_text().splitlines(keepends=True)
               if line.endswith("\n") and json.loads(line)["step"] <= 3]
    assert len(written) == 4  # train 1-3 and eval 2, with the killed run's wall-clock rates
    done = subprocess.run(train_command(store, killed, 2, "--resume"), check=False, capture_output=True,
                          text=True, env=environment())
    assert done.returncode == 0, done.stderr[-3000:]
    # it continued from the checkpoint: the lines up to step 3 are the killed run's, not rewritten
    assert (killed / "metrics.jsonl").read_text().startswith("".join(written))
    expected = losses(uninterrupted)
    assert sorted(expected) == list(range(1, STEPS + 1))
    got = losses(killed)
    assert got.keys() == expected.keys()
    for step, loss in expected.items():
        assert got[step] == pytest.approx(loss, rel=0, abs=1e-6), step
    assert losses(killed, "eval") == pytest.approx(losses(uninterrupted, "eval"), rel=0, abs=1e-6)
    positions = [[(line["split"], line["step"], line.get("tokens"), line.get("epoch")) for line in metric_lines(run)]
                 for run in (killed, uninterrupted)]
    assert positions[0] == positions[1]
    assert_same_weights(final_weights(killed), final_weights(uninterrupted), atol=1e-6)
    summary, reference = (json.loads((run / "summary.json").read_text()) for run in (killed, uninterrupted))
    assert summary["steps"] == reference["steps"] == STEPS and summary["best_step"] == reference["best_step"]


def test_resume_with_nothing_to_resume_is_refused(store: Path, run_cli, tmp_path: Path) -> None:
    out = tmp_path / "fresh"
    result = run_cli(*train_command(store, out, 2, "--resume")[1:])
    assert result.code == 2 and result.err.count("\n") == 1 and "Traceback" not in result.err, result.err
    assert f"eyas: error: {out}: --resume: no checkpoint of this run to resume from" in result.err
    assert not (out / "metrics.jsonl").exists() and not (out / "final").exists()


def run_ok(command: list[str]) -> None:
    done = subprocess.run(command, check=False, capture_output=True, text=True, env=environment(), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def assert_same_run(ranked: Path, uninterrupted: Path) -> None:
    """Same per-step train and eval losses, tokens per step and final weights as the one-process run."""
    expected, got = losses(uninterrupted), losses(ranked)
    assert got.keys() == expected.keys()
    for step, loss in expected.items():
        assert got[step] == pytest.approx(loss, rel=1e-4), step
    assert [line["tokens"] for line in metric_lines(ranked) if line["split"] == "train"] == \
           [line["tokens"] for line in metric_lines(uninterrupted) if line["split"] == "train"]
    assert losses(ranked, "eval") == pytest.approx(losses(uninterrupted, "eval"), rel=1e-4)
    assert_same_weights(final_weights(ranked), final_weights(uninterrupted), atol=1e-5)


def test_torchrun_two_gloo_ranks_match_one_process_with_twice_the_accumulation(store: Path, uninterrupted: Path,
                                                                               tmp_path: Path) -> None:
    run_ok(train_command(store, tmp_path / "ranked", 1, launcher=TORCHRUN))
    assert_same_run(tmp_path / "ranked", uninterrupted)


def test_fsdp_ranks_match_one_process_with_short_steps_and_evaluations(store: Path, tmp_path: Path) -> None:
    """5 micro-batches per epoch in steps of 2: every third step, and every evaluation (one micro-batch),
    leaves rank 1 without a micro-batch of its own, so it runs a zero-weight one for FSDP's collectives."""
    run_ok(train_command(store, tmp_path / "single", 2, token_budget=384))
    run_ok(train_command(store, tmp_path / "fsdp", 1, "--fsdp", launcher=TORCHRUN, token_budget=384))
    assert_same_run(tmp_path / "fsdp", tmp_path / "single")
    tokens = [line["tokens"] for line in metric_lines(tmp_path / "fsdp") if line["split"] == "train"]
    assert len({b - a for a, b in zip([0, *tokens], tokens)}) > 1  # steps of different sizes were crossed
    summary, single = (json.loads((tmp_path / run / "summary.json").read_text()) for run in ("fsdp", "single"))
    assert (summary["ranks"], summary["fsdp"], single["ranks"], single["fsdp"]) == (2, True, 1, False)
    assert summary["draft_parameters"] == single["draft_parameters"] == single["draft_parameters_on_rank"]
    assert summary["draft_parameters_on_rank"] <= summary["draft_parameters"] // 2 + 1024  # sharded, + padding


def test_fsdp_resumes_a_one_process_checkpoint(store: Path, uninterrupted: Path, tmp_path: Path) -> None:
    """The one-process run's step-3 checkpoint, continued by 2 FSDP ranks (shards of weights and AdamW
    moments loaded, whole tensors gathered into the step-6 checkpoint), ends where that run ended."""
    resumed = tmp_path / "resumed"
    checkpoint = Path("checkpoints") / "step-00000003"
    shutil.copytree(uninterrupted / checkpoint, resumed / checkpoint)
    run_ok(train_command(store, resumed, 1, "--fsdp", "--resume", launcher=TORCHRUN))
    assert losses(resumed) == pytest.approx({s: v for s, v in losses(uninterrupted).items() if s > 3}, rel=1e-4)
    assert_same_weights(final_weights(resumed), final_weights(uninterrupted), atol=1e-5)
    for name in ("draft/model.safetensors", "optimizer.safetensors"):
        got, expected = (load_file(str(run / "checkpoints" / "step-00000006" / name)) for run in (resumed, uninterrupted))
        assert_same_weights(got, expected, atol=1e-5)
