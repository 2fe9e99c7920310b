"""Crash-safe file writes and content hashes shared by every stage."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from safetensors import SafetensorError

from eyas.errors import DiskFull, EyasError, UnreadableInput

if TYPE_CHECKING:  # torch stays out of the CLI's start-up: read_tensors imports it when called
    import torch

_CHUNK = 1 << 20
_UMASK = os.umask(0)
os.umask(_UMASK)
LOCK_FILE = ".eyas-lock"  # an output directory's lock (eyas.outputs); part of no content hash
_FULL = (errno.ENOSPC, errno.EDQUOT)
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # how safetensors' Rust writer reports an I/O errno


def eyas_cache() -> Path:
    """Return eyas's cache directory: `$EYAS_CACHE`, default `~/.cache/eyas` (not created here)."""
    return Path(os.environ.get("EYAS_CACHE", Path.home() / ".cache" / "eyas"))


def sha256_file(path: Path) -> str:
    """Return the hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def sha256_tree(path: Path) -> str:
    """Return a hex sha256 over every file under `path` (relative names and contents; an output
    directory's lock file left out), or of `path` itself if a file."""
    if path.is_file():
        return sha256_file(path)
    digest = hashlib.sha256()
    for child in sorted(p for p in path.rglob("*") if p.is_file() and p.name != LOCK_FILE):
        digest.update(f"{child.relative_to(path)}\0{sha256_file(child)}\n".encode())
    return digest.hexdigest()


def sha256_text(text: str) -> str:
    """Return the hex sha256 of a string's UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _full_disk_reason(error: BaseException) -> str | None:
    """Return the OS's words for a full disk or quota when `error` (an OSError, or safetensors' Rust
    I/O error) reports one, else None."""
    code = error.errno if isinstance(error, OSError) else None
    if isinstance(error, SafetensorError) and (found := _RUST_OS_ERROR.search(str(error))):
        code = int(found.group(1))
    return os.strerror(code) if code in _FULL else None


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Run a block that writes `path`; a full disk or quota becomes one `DiskFull` error naming `path`.

    The one place eyas turns ENOSPC/EDQUOT into a user error: from Python writes (OSError) and from
    safetensors' Rust writer (SafetensorError). Nested blocks name the outermost `path` (a checkpoint
    directory rather than a file in its temporary twin). Any other error passes unchanged.
    """
    try:
        yield
    except DiskFull as full:
        raise DiskFull(path, full.reason) from None
    except (OSError, SafetensorError) as error:
        reason = _full_disk_reason(error)
        if reason is None:
            raise
        raise DiskFull(path, reason) from None


def _unreadable_reason(error: BaseException, path: Path | str) -> str | None:
    """Return one line saying why reading the input `path` failed, when `error` is a failure to read (not a bug)."""
    if isinstance(error, OSError):
        if error.strerror:
            return error.strerror
        words, _, tail = str(error).rpartition(": ")  # safetensors: "No such file or directory: PATH"
        return (words if os.sep in tail else str(error)) or type(error).__name__
    if isinstance(error, UnicodeDecodeError):
        return f"not UTF-8 text (byte 0x{error.object[error.start]:02x} at offset {error.start})"
    if isinstance(error, SafetensorError):
        return f"not a readable safetensors file ({str(error).splitlines()[0] if str(error) else 'truncated'})"
    if isinstance(error, RecursionError):
        return "nested too deeply to read"
    if type(error).__module__.startswith("pyarrow") and isinstance(error, ValueError | OSError):
        kind = "Arrow" if str(path).endswith(".arrow") else "Parquet"  # pyarrow reads both columnar formats
        return f"not a readable {kind} file ({str(error).splitlines()[0]})"
    return None


@contextmanager
def reading(path: Path | str) -> Iterator[None]:
    """Run a block that reads the input `path`; a failure to read it becomes one `UnreadableInput` line.

    The one boundary where eyas turns a failure to *read* an input into a user error (exit 2) naming the
    file and the reason: an `OSError` (missing, unreadable, EIO, a directory), bytes that are not UTF-8,
    a truncated or foreign safetensors file, a corrupt Parquet or Arrow file (pyarrow's `ArrowInvalid`), a
    document nested too deeply to parse. Anything else (a bug in eyas) passes unchanged, traceback and
    all; so do eyas's own errors. Nested blocks name the innermost path (the file, not its directory).
    """
    try:
        yield
    except EyasError:
        raise
    except (OSError, UnicodeDecodeError, SafetensorError, RecursionError, ValueError) as error:
        reason = _unreadable_reason(error, path)
        if reason is None:
            raise
        raise UnreadableInput(path, reason) from None


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Return every tensor of the safetensors file `path`; refuses one that cannot be read (missing,
    truncated, not safetensors) in one line naming it (`reading`)."""
    from safetensors.torch import load_file

    with reading(path):
        return load_file(str(path))


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Call `write(tmp)` on a temporary sibling of `path`, fsync it, then rename it to `path`.

    A reader (or a resumed run) sees either the old file or the complete new one, never a
    partial file. The temporary file is removed if `write` raises; a full disk raises `DiskFull`.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with writing(path):
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


class LineLog:
    """An append-only text file of lines (JSONL) that never keeps a partial line of its own.

    Each `append` is written unbuffered and whole; a write that fails or is interrupted part way
    (full disk, signal) is cut back to where it started, so the file ends at a complete line.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        with writing(path):
            self._handle = open(path, "ab", buffering=0)

    def append(self, line: str) -> None:
        """Append `line` and a newline; raises `DiskFull` (naming the file) when the disk is full."""
        data = memoryview((line + "\n").encode("utf-8"))
        start = os.fstat(self._handle.fileno()).st_size
        with writing(self.path):
            try:
                while data:
                    data = data[self._handle.write(data):]
            except BaseException:
                os.ftruncate(self._handle.fileno(), start)
                raise

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> LineLog:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


def parse_json_object(text: str, source: str, numbered: bool = False) -> dict[str, Any]:
    """Return the JSON object `text`, read from `source` (a file, a `file:line`, a metadata field); refuses
    malformed JSON (naming `source`, and the line within `text` when `numbered`) and any other JSON value."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EyasError(f"{source}{f':{exc.lineno}' if numbered else ''}: malformed JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise EyasError(f"{source}: expected a JSON object")
    return value


def read_json_object(path: Path, missing: str = "") -> dict[str, Any]:
    """Return the JSON object in `path`; refuses a missing or unreadable file (`missing` is added to the
    message), malformed JSON (naming the line) and any other JSON value."""
    if not path.is_file():
        raise EyasError(f"{path}: not found{'; ' + missing if missing else ''}")
    with reading(path):
        text = path.read_text(encoding="utf-8")
    return parse_json_object(text, str(path), numbered=True)
