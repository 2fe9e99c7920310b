"""`eyas prepare` killed with SIGKILL mid-run resumes to a byte-identical dataset."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

from conftest import chat, kill_9_when, write_jsonl

from eyas.files import LOCK_FILE

WORDS = "the quick brown fox jumps over a lazy dog while speculative decoding drafts tokens for targets".split()


def conversations(count: int) -> list[dict]:
    rng = random.Random(0)
    records = []
    for index in range(count):
        turns = []
        for _ in range(rng.randint(1, 3)):
            turns.append(("user", " ".join(rng.choices(WORDS, k=rng.randint(3, 30)))))
            turns.append(("assistant", " ".join(rng.choices(WORDS, k=rng.randint(3, 60)))))
        records.append(chat(*turns) if index % 50 else {"prompt": f"prompt {index}"})
    return records


def prepare_command(target: Path, data: Path, out: Path) -> list[str]:
    eyas = [sys.executable, "-c", "from eyas.cli import main; main()"]
    return [*eyas, "prepare", "--target", str(target), "--data", str(data), "--out", str(out),
            "--draft-vocab-size", "64", "records_per_shard=250", "batch_size=50"]


def test_kill_9_then_resume_is_byte_identical_to_an_uninterrupted_run(tiny_targets, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "in.jsonl", conversations(8000))
    target = tiny_targets["chatml"]
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    subprocess.run(prepare_command(target, data, clean), check=True, capture_output=True)

    kill_9_when(prepare_command(target, data, killed), killed / "progress.json")
    assert not (killed / "manifest.json").exists()
    finished_before_kill = len(list(killed.glob("data-*.parquet")))
    assert 0 < finished_before_kill < 32

    subprocess.run(prepare_command(target, data, killed), check=True, capture_output=True)
    skipped = ("config.yaml", LOCK_FILE)  # the lock file holds the pid of its last holder
    names = sorted(p.name for p in clean.iterdir() if p.is_file() and p.name not in skipped)
    assert names == sorted(p.name for p in killed.iterdir() if p.is_file() and p.name not in skipped)
    assert "manifest.json" in names and "prompts-00000.jsonl" in names and len(names) >= 32
    for name in names:
        assert (clean / name).read_bytes() == (killed / name).read_bytes(), name
    assert not list(killed.glob(".*tmp*"))
