"""Output directories of resumable stages: one process at a time, resume this run, replace another,
never touch foreign files."""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

from eyas.errors import EyasError
from eyas.files import LOCK_FILE, writing

_HELD: dict[Path, int] = {}  # resolved output dir -> open fd of its locked LOCK_FILE, for the process's life


def _is_held(out: Path) -> bool:
    """Return whether this process holds the lock on `out` (its lock file is still the one locked)."""
    fd = _HELD.get(out.resolve())
    if fd is None:
        return False
    try:
        return os.path.samestat(os.fstat(fd), os.stat(out / LOCK_FILE))
    except FileNotFoundError:
        return False


def _lock_output_dir(out: Path) -> None:
    """Hold an exclusive lock on the existing directory `out` until this process ends; refuses a
    directory another live process holds (naming its pid). The kernel drops the lock of a process
    that dies, however it dies; taking it again in the same process is a no-op."""
    if _is_held(out):
        return
    key = out.resolve()
    if key in _HELD:  # the directory was removed and made again since this process locked it
        os.close(_HELD.pop(key))
    path = out / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise EyasError(f"{out}: in use by another eyas process (pid {holder}); wait for it to finish or use "
                        "another --out") from None
    except OSError as error:
        os.close(fd)
        raise EyasError(f"{path}: cannot lock the output directory ({error.strerror}); use another --out") from None
    with writing(path):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    _HELD[key] = fd


def claim_output_dir(out: Path, run_key: str, existing_keys: set[str], own: tuple[str, ...], overwrite: bool,
                     what: str, kept: tuple[str, ...] = ()) -> bool:
    """Make `out` ready for the run `run_key`; return True when it already holds (part of) this very run.

    `existing_keys` are the run keys found in `out`'s manifest or progress files, `own` the name
    patterns of every file the stage writes, `what` names its output ("an eyas dataset").
    First locks `out` for this process (a second process on it is refused at
    once). Temporary files of a killed writer are removed. Unless `overwrite`, refuses a directory
    holding another run or files the stage never writes; otherwise removes the stage's own files
    (another run's, or those of a run killed before it recorded anything) and nothing else.
    The lock file is nobody's: never foreign, never removed; so are the name patterns `kept` (other
    stages' outputs nested in `out`, which claim their own directories). Only one process of a run
    claims (rank 0 under torchrun).
    """
    if out.exists() and not out.is_dir():
        raise EyasError(f"{out}: exists and is not a directory (--out)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise EyasError(f"{out}: cannot make the output directory ({error.strerror}); use another --out") from None
    _lock_output_dir(out)
    for stale in out.glob(".*.tmp-*"):
        stale.unlink()
    if existing_keys == {run_key}:
        return True

    def is_own(path: Path) -> bool:
        return any(path.match(pattern) for pattern in own)

    contents = [path for path in out.iterdir()
                if path.name != LOCK_FILE and not any(path.match(pattern) for pattern in kept)]
    if not overwrite and (existing_keys or not all(map(is_own, contents))):
        held = f"{what} made from other inputs or settings" if existing_keys else f"files that are not {what}"
        raise EyasError(f"{out}: holds {held}; use another --out or --overwrite")
    for path in filter(is_own, contents):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    return False
