"""Output directories of resumable stages: resume this run, replace another, never touch foreign files."""

from __future__ import annotations

import shutil
from pathlib import Path

from eyas.errors import EyasError


def claim_output_dir(out: Path, run_key: str, existing_keys: set[str], own: tuple[str, ...], overwrite: bool,
                     what: str) -> bool:
    """Make `out` ready for the run `run_key`; return True when it already holds (part of) this very run.

    `existing_keys` are the run keys found in `out`'s manifest or progress files, `own` the name
    patterns of every file the stage writes, `what` names its output ("an eyas dataset").
    Temporary files of a killed writer are removed. Unless `overwrite`, refuses a directory
    holding another run or files the stage never writes; otherwise removes the stage's own files
    (another run's, or those of a run killed before it recorded anything) and nothing else.
    """
    if out.exists() and not out.is_dir():
        raise EyasError(f"{out}: exists and is not a directory (--out)")
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(".*.tmp-*"):
        stale.unlink()
    if existing_keys == {run_key}:
        return True

    def is_own(path: Path) -> bool:
        return any(path.match(pattern) for pattern in own)

    if not overwrite and (existing_keys or not all(map(is_own, out.iterdir()))):
        held = f"{what} made from other inputs or settings" if existing_keys else f"files that are not {what}"
        raise EyasError(f"{out}: holds {held}; use another --out or --overwrite")
    for path in filter(is_own, out.iterdir()):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    return False
