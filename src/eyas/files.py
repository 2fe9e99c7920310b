"""Crash-safe file writes and content hashes shared by every stage."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eyas.errors import EyasError

_CHUNK = 1 << 20
_UMASK = os.umask(0)
os.umask(_UMASK)


def sha256_file(path: Path) -> str:
    """Return the hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def sha256_tree(path: Path) -> str:
    """Return a hex sha256 over every file under `path` (relative names and contents), or of `path` itself if a file."""
    if path.is_file():
        return sha256_file(path)
    digest = hashlib.sha256()
    for child in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{child.relative_to(path)}\0{sha256_file(child)}\n".encode())
    return digest.hexdigest()


def sha256_text(text: str) -> str:
    """Return the hex sha256 of a string's UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Call `write(tmp)` on a temporary sibling of `path`, fsync it, then rename it to `path`.

    A reader (or a resumed run) sees either the old file or the complete new one, never a
    partial file. The temporary file is removed if `write` raises.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # some writers (safetensors) create 0600 files
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: Path, text: str) -> None:
    """Atomically replace `path` with `text` (UTF-8)."""
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json_atomic(path: Path, obj: Any) -> None:
    """Atomically replace `path` with `obj` as indented, key-sorted JSON."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json_object(path: Path, missing: str = "") -> dict[str, Any]:
    """Return the JSON object in `path`; refuses a missing file (`missing` is added to the message),
    malformed JSON (naming the line) and any other JSON value."""
    if not path.is_file():
        raise EyasError(f"{path}: not found{'; ' + missing if missing else ''}")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise EyasError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise EyasError(f"{path}: expected a JSON object")
    return value
