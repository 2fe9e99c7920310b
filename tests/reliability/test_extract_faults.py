"""Faults `eyas extract` survives, each in a real subprocess: a full disk while a shard is written,
SIGTERM at random points, a second process on the same store (and its holder killed); and `eyas verify`
finding a NaN in stored features. Each rerun ends byte-identical to an uninterrupted run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (Finished, on_full_disk_then_rerun, poison_sample, run_sigterm_after,
                      sigterm_at_random_points, tree_bytes)

from eyas.features.store import read_store_manifest

EYAS = str(Path(sys.executable).parent / "eyas")
PAGE = 4096  # tmpfs allocates whole pages


def environment() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def extract_command(target: Path, data: Path, out: Path) -> list[str]:
    """The example dataset in 3 shards (6, 8 and 5 samples) of the tiny llama target. Without
    --no-preflight, its disk check would refuse to start on the small disk: here space runs out mid-run."""
    return [EYAS, "extract", "--target", str(target), "--data", str(data), "--out", str(out), "--device", "cpu",
            "--dtype", "float32", "--no-preflight", "shard_tokens=600", "token_budget=256"]


@pytest.fixture(scope="module")
def inputs(weighted_target, prepared) -> tuple[Path, Path]:
    target = weighted_target("llama")
    return target, prepared(target)


@pytest.fixture(scope="module")
def reference(inputs: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Finished]:
    """The uninterrupted store, and when (once it could catch SIGTERM) it had claimed the store and
    written its last file."""
    out = tmp_path_factory.mktemp("extract-reference") / "store"
    finished = run_sigterm_after(extract_command(*inputs, out), None, environment(),
                                 markers=(out / "config.yaml", out / "manifest.json"))
    assert finished.code == 0 and None not in finished.marked, finished
    assert len(read_store_manifest(out).shards) == 3
    return out, finished


def assert_same_store(got: Path, expected: Path, got_out: Path | None = None) -> None:
    """Every file byte-identical (config.yaml up to the --out it names: `got_out`, default `got`);
    the lock file left out."""
    files, reference = tree_bytes(got), tree_bytes(expected)
    assert files.pop("config.yaml").replace(str(got_out or got).encode(), b"OUT") == \
           reference.pop("config.yaml").replace(str(expected).encode(), b"OUT")
    assert files.keys() == reference.keys() and files == reference


def pages(size: int) -> int:
    return -(-size // PAGE)


def test_disk_full_while_writing_a_shard_then_rerun_is_byte_identical(inputs, reference, tmp_path: Path) -> None:
    store, _ = reference
    shards = read_store_manifest(store).shards
    # the lock, run.json, config.yaml, progress and shard 0 fit; shard 1 runs out of space half way
    size = PAGE // 1024 * (4 + pages(shards[0].bytes) + pages(shards[1].bytes) // 2)
    out = tmp_path / "out"
    runs = on_full_disk_then_rerun(extract_command(*inputs, out), out, size, tmp_path / "copies", environment())
    assert runs.failed.code == 2
    assert runs.failed.err == (f"eyas: error: {out / 'shard-00001.safetensors'}: disk full (No space left on device) "
                               "while writing it; free space and rerun the same command to resume\n")
    left = runs.left
    assert sorted(p.name for p in left.iterdir()) == [".eyas-lock", "config.yaml", "progress-rank0.json",
                                                      "run.json", "shard-00000.safetensors"]  # no temporary file, no manifest
    progress = json.loads((left / "progress-rank0.json").read_text())
    assert [s["file"] for s in progress["shards"]] == ["shard-00000.safetensors"]
    assert (left / "shard-00000.safetensors").read_bytes() == (store / "shard-00000.safetensors").read_bytes()
    assert runs.rerun.code == 0, runs.rerun.err
    assert_same_store(runs.result, store, out)


def test_sigterm_at_random_points_then_rerun_is_byte_identical(inputs, reference, tmp_path: Path) -> None:
    """One point anywhere in the run, one while it writes the store (imports and the model load take most of it)."""
    store, run = reference
    sigterm_at_random_points(lambda out: extract_command(*inputs, out), tmp_path, "manifest.json", run, 20240611,
                             lambda out: assert_same_store(out, store), environment())


def test_verify_reports_a_nan_in_stored_features(reference, run_cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    shutil.copytree(reference[0], store)
    assert run_cli("verify", store).code == 0
    sample = poison_sample(store, "shard-00001.safetensors", 2, "last")
    result = run_cli("verify", store)
    assert result.code == 1
    assert result.err == (f"eyas verify: {store / 'shard-00001.safetensors'}: sample {sample}: last features hold NaN "
                          "or Inf; extract the store again (eyas extract --overwrite)\n")


def listing(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_second_process_is_refused_at_once_and_a_killed_holder_releases_the_store(inputs, reference,
                                                                                   tmp_path: Path) -> None:
    out = tmp_path / "store"
    holder = subprocess.Popen(extract_command(*inputs, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=environment())
    lock = out / ".eyas-lock"
    deadline = time.monotonic() + 120
    while not (lock.is_file() and lock.read_text().strip() == str(holder.pid)):
        assert holder.poll() is None and time.monotonic() < deadline, "the first process never locked the store"
        time.sleep(0.01)
    os.kill(holder.pid, signal.SIGSTOP)  # it holds the lock, frozen wherever it was (a shard half written, maybe)
    try:
        before = listing(out)
        second = subprocess.run(extract_command(*inputs, out), capture_output=True, text=True, env=environment(),
                                timeout=120)
        assert second.returncode == 2
        assert second.stderr == (f"eyas: error: {out}: in use by another eyas process (pid {holder.pid}); wait for it "
                                 "to finish or use another --out\n")
        assert listing(out) == before  # nothing touched, not even the holder's temporary files
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    third = subprocess.run(extract_command(*inputs, out), capture_output=True, text=True, env=environment())
    assert third.returncode == 0, third.stderr
    assert lock.read_text().strip() != str(holder.pid)
    assert_same_store(out, reference[0])
