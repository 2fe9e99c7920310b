"""The output-directory lock of `claim_output_dir`: held for the process's life, refused to another
process (naming the holder), taken again after the directory is made anew, and never a foreign file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eyas.errors import EyasError
from eyas.files import LOCK_FILE
from eyas.outputs import claim_output_dir

OWN = ("result.json",)


def claim_elsewhere(out: Path) -> subprocess.CompletedProcess[str]:
    """Claim `out` from another Python process (it exits at once, releasing what it took)."""
    code = ("import sys; from pathlib import Path; from eyas.errors import EyasError; "
            "from eyas.outputs import claim_output_dir\n"
            "try: claim_output_dir(Path(sys.argv[1]), 'key', set(), ('result.json',), False, 'a test output')\n"
            "except EyasError as error: sys.exit(f'eyas: error: {error}')")
    return subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True)


def in_use(out: Path) -> str:
    """The refusal another process gets while this one holds `out`."""
    return (f"eyas: error: {out}: in use by another eyas process (pid {os.getpid()}); wait for it to finish or use "
            "another --out\n")


def test_the_holder_keeps_it_and_another_process_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert claim_output_dir(out, "key", set(), OWN, False, "a test output") is False
    assert (out / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    assert claim_output_dir(out, "key", {"key"}, OWN, False, "a test output") is True  # the holder again: no-op
    assert claim_elsewhere(out).stderr == in_use(out)


def test_a_directory_made_anew_is_locked_anew(tmp_path: Path) -> None:
    out = tmp_path / "out"
    claim_output_dir(out, "key", set(), OWN, False, "a test output")
    shutil.rmtree(out)  # the lock this process holds is now on a deleted file
    assert claim_elsewhere(out).returncode == 0  # so another process may take the new directory
    claim_output_dir(out, "key", set(), OWN, False, "a test output")
    assert claim_elsewhere(out).stderr == in_use(out)


def test_the_lock_file_is_never_foreign_nor_removed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert claim_elsewhere(out).returncode == 0  # leaves its lock file behind, and nothing else
    assert [p.name for p in out.iterdir()] == [LOCK_FILE]
    assert claim_output_dir(out, "key", set(), OWN, False, "a test output") is False  # not "files that are not ..."
    (out / "result.json").write_text("{}")
    claim_output_dir(out, "other", {"key"}, OWN, True, "a test output")  # --overwrite: the stage's own files go
    assert [p.name for p in out.iterdir()] == [LOCK_FILE]
    (out / "notes.txt").write_text("mine")
    with pytest.raises(EyasError, match="holds files that are not a test output"):
        claim_output_dir(out, "key", set(), OWN, False, "a test output")
