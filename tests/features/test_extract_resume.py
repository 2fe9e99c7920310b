"""`eyas extract` killed with SIGKILL resumes byte-identically; torchrun with 2 gloo ranks matches one process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import chat, kill_9_when, write_jsonl

from eyas.config import PrepareConfig
from eyas.data.prepare import run_prepare

WORDS = "draft target token hidden state layer speculative decoding accept verify sample the a of and".split()


@pytest.fixture(scope="module")
def workload(weighted_target, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("extract-workload")
    records = [chat(("user", " ".join(WORDS[(i + j) % len(WORDS)] for j in range(5 + i % 7))),
                    ("assistant", " ".join(WORDS[(i * j) % len(WORDS)] for j in range(10 + i % 23))))
               for i in range(240)]
    target = weighted_target("llama")
    run_prepare(PrepareConfig(target=target, data=[write_jsonl(root / "in.jsonl", records)], out=root / "ds"))
    return target, root / "ds"


def extract_command(target: Path, data: Path, out: Path, launcher: list[str] | None = None) -> list[str]:
    eyas = str(Path(sys.executable).parent / "eyas")
    prefix = [*launcher, eyas] if launcher else [eyas]
    return [*prefix, "extract", "--target", str(target), "--data", str(data), "--out", str(out), "--device", "cpu",
            "shard_tokens=600", "token_budget=256"]


def environment() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}  # two ranks on two cores: one thread each


def shard_bytes(store: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(store.glob("shard-*.safetensors"))}


def test_kill_9_then_resume_is_byte_identical(workload, tmp_path: Path) -> None:
    target, data = workload
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    subprocess.run(extract_command(target, data, clean), check=True, capture_output=True, env=environment())
    kill_9_when(extract_command(target, data, killed), killed / "progress-rank0.json", env=environment())
    assert not (killed / "manifest.json").exists()
    subprocess.run(extract_command(target, data, killed), check=True, capture_output=True, env=environment())
    expected = shard_bytes(clean)
    assert len(expected) > 5 and shard_bytes(killed) == expected
    assert (clean / "manifest.json").read_text() == (killed / "manifest.json").read_text()
    assert subprocess.run([str(Path(sys.executable).parent / "eyas"), "verify", str(killed)]).returncode == 0


def test_torchrun_two_gloo_ranks_match_a_single_process(workload, tmp_path: Path) -> None:
    target, data = workload
    single, ranked = tmp_path / "single", tmp_path / "ranked"
    subprocess.run(extract_command(target, data, single), check=True, capture_output=True, env=environment())
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    done = subprocess.run(extract_command(target, data, ranked, launcher), capture_output=True, text=True,
                          env=environment())
    assert done.returncode == 0, done.stderr[-3000:]
    assert shard_bytes(ranked) == shard_bytes(single)
    assert (ranked / "manifest.json").read_text() == (single / "manifest.json").read_text()
    assert not list(ranked.glob("progress-rank*.json"))
