"""Read raw records from JSON/JSONL files, directories of them, and local HF `datasets` dirs.

Every record comes with its location (`file:line`, or `dir:row` for a datasets dir) so that
any later error can name it. Malformed JSON is reported as an `InputError` in the stream
rather than raised, so that the caller decides between stopping and `--skip-invalid`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eyas.errors import EyasError, InputError, where

DATA_SUFFIXES = (".jsonl", ".json")
_DATASETS_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


@dataclass(frozen=True)
class RawRecord:
    """One decoded JSON object (or the error that prevented decoding it) and where it came from."""

    source: str
    value: Any | InputError


def is_datasets_dir(path: Path) -> bool:
    """Return True when `path` looks like a directory written by `datasets.save_to_disk`."""
    return path.is_dir() and any((path / m).is_file() for m in _DATASETS_MARKERS)


def expand_inputs(paths: list[Path]) -> list[Path]:
    """Return the input files/datasets dirs behind `paths`, directories walked in sorted order.

    Refuses a missing path, a file with another suffix, and a directory holding no data.
    """
    found: list[Path] = []
    for path in paths:
        if not path.exists():
            raise EyasError(f"{path}: no such file or directory (--data)")
        if path.is_file():
            if path.suffix not in DATA_SUFFIXES:
                raise EyasError(f"{path}: unsupported data file (expected .json or .jsonl)")
            found.append(path)
        elif is_datasets_dir(path):
            found.append(path)
        else:
            inside = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in DATA_SUFFIXES)
            if not inside:
                raise EyasError(f"{path}: directory holds no .json/.jsonl files and is not a datasets dir")
            found.extend(inside)
    return found


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _read_jsonl(path: Path) -> Iterator[RawRecord]:
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            source = where(path, number)
            try:
                yield RawRecord(source, json.loads(line))
            except json.JSONDecodeError as exc:
                yield RawRecord(source, InputError(source, "json", f"malformed JSON: {exc.msg} at column {exc.colno}", "malformed JSON"))


def _read_json(path: Path) -> Iterator[RawRecord]:
    """Yield the elements of a top-level JSON array (or the single top-level object) with their lines."""
    text = path.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    pos = len(text) - len(text.lstrip())
    if not text[pos:pos + 1] == "[":
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            source = where(path, exc.lineno)
            yield RawRecord(source, InputError(source, "json", f"malformed JSON: {exc.msg}", "malformed JSON"))
            return
        if text[end:].strip():
            source = where(path, _line_of(text, end))
            yield RawRecord(source, InputError(source, "json", "extra data after the top-level value", "malformed JSON"))
            return
        yield RawRecord(where(path, _line_of(text, pos)), value)
        return
    pos += 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        if pos < len(text) and text[pos] == "]":
            return
        source = where(path, _line_of(text, pos))
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            # the rest of the array cannot be located reliably after a syntax error
            yield RawRecord(source, InputError(source, "json", f"malformed JSON: {exc.msg}; rest of file unreadable", "malformed JSON"))
            return
        yield RawRecord(source, value)
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        if pos < len(text) and text[pos] == ",":
            pos += 1
        elif pos >= len(text) or text[pos] != "]":
            bad = where(path, _line_of(text, pos))
            yield RawRecord(bad, InputError(bad, "json", "malformed JSON: expected ',' or ']' in the top-level array", "malformed JSON"))
            return


def _datasets_splits(path: Path) -> list[tuple[str, Any]]:
    try:
        import datasets
    except ImportError:
        raise EyasError(f"{path}: reading a datasets dir needs the optional extra: pip install 'eyas[datasets]'") from None
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        return [(name, loaded[name]) for name in sorted(loaded)]
    return [("", loaded)]


def _read_datasets_dir(path: Path) -> Iterator[RawRecord]:
    for name, split in _datasets_splits(path):
        prefix = f"{path}/{name}" if name else str(path)
        for row, value in enumerate(split):
            yield RawRecord(where(prefix, f"row{row}"), value)


def read_records(path: Path) -> Iterator[RawRecord]:
    """Yield every record of one input (a .jsonl/.json file or a datasets dir) in file order."""
    if path.is_dir():
        return _read_datasets_dir(path)
    if path.suffix == ".jsonl":
        return _read_jsonl(path)
    return _read_json(path)


def count_records(path: Path) -> int:
    """Return how many records `read_records(path)` will yield (used for progress and ETA)."""
    if path.is_dir():
        return sum(len(split) for _, split in _datasets_splits(path))
    if path.suffix == ".jsonl":
        with open(path, encoding="utf-8") as handle:
            return sum(1 for line in handle if line.strip())
    return sum(1 for _ in read_records(path))
