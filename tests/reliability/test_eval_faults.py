"""A full disk while `eyas eval` appends to results.jsonl, in a real subprocess: one line, no torn
result left to be counted, and the rerun finishes with the uninterrupted run's results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import on_full_disk_then_rerun, write_jsonl

from eyas.config import ExtractConfig, TrainConfig
from eyas.features.extract import run_extract
from eyas.train.loop import run_train

EYAS = str(Path(sys.executable).parent / "eyas")
PAGE = 4096  # tmpfs allocates whole pages
TIMINGS = {"seconds", "baseline_seconds", "speedup", "tokens_per_s", "baseline_tokens_per_s", "pooled_speedup", "paired",
           "timing"}


def environment() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def inputs(weighted_target, prepared, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The tiny llama target, a one-step draft for it and 21 prompts (their result lines fill more than a page)."""
    root = tmp_path_factory.mktemp("eval-faults-inputs")
    target = weighted_target("llama")
    run_extract(ExtractConfig(target=target, data=prepared(target), out=root / "store", dtype="float32", device="cpu"))
    run_train(TrainConfig(features=root / "store", out=root / "run", max_steps=1, ttt_steps=2, device="cpu",
                          dtype="float32", target_dtype="float32"))
    prompts = write_jsonl(root / "prompts.jsonl", [{"prompt": f"Tell me fact number {i} about the sea."}
                                                   for i in range(21)])
    return target, root / "run" / "final", prompts


def eval_command(inputs: tuple[Path, Path, Path], out: Path) -> list[str]:
    target, draft, prompts = inputs
    return [EYAS, "eval", "--target", str(target), "--draft", str(draft), "--prompts", str(prompts), "--out", str(out),
            "--max-new-tokens", "4", "--chain", "2", "--device", "cpu", "eval.dtype=float32"]


def without_timings(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in TIMINGS}


def results(out: Path) -> list[dict]:
    return [without_timings(json.loads(line)) for line in (out / "results.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(inputs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("eval-reference") / "report"
    done = subprocess.run(eval_command(inputs, out), capture_output=True, text=True, env=environment())
    assert done.returncode == 0, done.stderr
    assert (out / "results.jsonl").stat().st_size > PAGE + 600  # the page boundary falls before the last lines
    return out


def test_disk_full_while_appending_a_result_then_rerun_matches(inputs, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    # 5 pages: the lock, run.json, progress.json, config.yaml and the first page of results.jsonl
    runs = on_full_disk_then_rerun(eval_command(inputs, out), out, 5 * PAGE // 1024, tmp_path / "copies",
                                   environment())
    assert runs.failed.code == 2
    assert runs.failed.err == (f"eyas: error: {out / 'results.jsonl'}: disk full (No space left on device) while "
                               "writing it; free space and rerun the same command to resume\n")
    left = runs.left
    assert sorted(p.name for p in left.iterdir()) == [".eyas-lock", "config.yaml", "progress.json", "results.jsonl",
                                                      "run.json"]
    text = (left / "results.jsonl").read_text()
    assert text.endswith("\n") and len(text) <= PAGE  # the result that did not fit was cut back whole
    kept, expected = results(left), results(reference)
    assert 0 < len(kept) < len(expected) and kept == expected[:len(kept)]
    assert runs.rerun.code == 0, runs.rerun.err
    assert results(runs.result) == expected
    report, reference_report = (json.loads((run / "report.json").read_text()) for run in (runs.result, reference))
    assert without_timings(report) == without_timings(reference_report)
