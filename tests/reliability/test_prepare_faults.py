"""Faults `eyas prepare` survives, each in a real subprocess: SIGTERM at random points and a full disk while a
Parquet shard is written; each rerun ends with the uninterrupted run's dataset, byte for byte (kill -9 is in
tests/data/test_prepare_resume.py)."""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import pytest
from conftest import (Finished, chat, on_full_disk_then_rerun, run_sigterm_after, sigterm_at_random_points,
                      tree_bytes)

from eyas.files import LOCK_FILE, write_text_atomic

EYAS = str(Path(sys.executable).parent / "eyas")
PAGE = 4096  # tmpfs allocates whole pages
WORDS = "the quick brown fox jumps over a lazy dog while speculative decoding drafts tokens for targets".split()


def environment() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def prepare_command(target: Path, data: Path, out: Path) -> list[str]:
    return [EYAS, "prepare", "--target", str(target), "--data", str(data), "--out", str(out), "--draft-vocab-size",
            "64", "records_per_shard=250", "batch_size=50"]


@pytest.fixture(scope="module")
def inputs(tiny_targets, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny chatml target and 2,000 conversations of one to three turns (every 50th a bare prompt)."""
    rng = random.Random(0)
    records = [chat(*[(role, " ".join(rng.choices(WORDS, k=rng.randint(3, 40))))
                      for _ in range(rng.randint(1, 3)) for role in ("user", "assistant")])
               if index % 50 else {"prompt": f"prompt {index}"} for index in range(2000)]
    data = tmp_path_factory.mktemp("prepare-faults") / "in.jsonl"
    write_text_atomic(data, "".join(json.dumps(record) + "\n" for record in records))
    return tiny_targets["chatml"], data


@pytest.fixture(scope="module")
def reference(inputs, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Finished]:
    out = tmp_path_factory.mktemp("prepare-reference") / "ds"
    finished = run_sigterm_after(prepare_command(*inputs, out), None, environment(),
                                 markers=(out / "config.yaml", out / "manifest.json"))
    assert finished.code == 0 and None not in finished.marked, finished
    assert len(list(out.glob("data-*.parquet"))) == 8
    return out, finished


def assert_same_dataset(got: Path, expected: Path, got_out: Path | None = None) -> None:
    """Every file byte-identical (config.yaml up to the --out it names); the lock file left out."""
    files, reference = tree_bytes(got), tree_bytes(expected)
    assert files.pop("config.yaml").replace(str(got_out or got).encode(), b"OUT") == \
           reference.pop("config.yaml").replace(str(expected).encode(), b"OUT")
    assert files.keys() == reference.keys()
    assert all(files[name] == reference[name] for name in reference), [n for n in reference if files[n] != reference[n]]


def pages(size: int) -> int:
    return -(-size // PAGE)


def test_sigterm_at_random_points_then_rerun_is_byte_identical(inputs, reference, tmp_path: Path) -> None:
    dataset, run = reference
    sigterm_at_random_points(lambda out: prepare_command(*inputs, out), tmp_path, "manifest.json", run, 20261207,
                             lambda out: assert_same_dataset(out, dataset), environment())


def test_disk_full_while_writing_a_shard_then_rerun_is_byte_identical(inputs, reference, tmp_path: Path) -> None:
    dataset, _ = reference
    small = ("run.json", "config.yaml", "progress.json", "prompts-00000.jsonl")
    first, second = ((dataset / f"data-0000{i}.parquet").stat().st_size for i in (0, 1))
    # the lock and the small records, shard 0 and half of shard 1 fit
    size = PAGE // 1024 * (1 + sum(pages((dataset / n).stat().st_size) for n in small if (dataset / n).exists())
                           + pages(first) + pages(second) // 2)
    out = tmp_path / "out"
    runs = on_full_disk_then_rerun(prepare_command(*inputs, out), out, size, tmp_path / "copies", environment())
    assert runs.failed.code == 2, runs.failed
    assert runs.failed.err.endswith("disk full (No space left on device) while writing it; free space and rerun the "
                                    "same command to resume\n") and runs.failed.err.count("\n") == 1, runs.failed.err
    left = sorted(p.name for p in runs.left.iterdir() if p.name != LOCK_FILE)
    assert "manifest.json" not in left and not [name for name in left if ".tmp-" in name], left
    assert (runs.left / "data-00000.parquet").read_bytes() == (dataset / "data-00000.parquet").read_bytes()
    assert runs.rerun.code == 0, runs.rerun.err
    assert_same_dataset(runs.result, dataset, out)
