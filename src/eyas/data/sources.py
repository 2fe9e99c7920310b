"""Read raw records from JSON/JSONL, Parquet and Arrow files, directories of them, and local HF `datasets` dirs.

Every record comes with its location (`file:line`; `file:rowN` for a Parquet or Arrow file and
`dir:rowN` for a datasets dir, rows numbered from 0) so that any later error can name it. A row of
a columnar file is read as the JSON object its columns make, a null column or struct field being
absent (Arrow holds every column for every row, null where a record lacks it). A record that cannot be decoded (malformed JSON, a line that is not
UTF-8, nesting too deep to parse, an integer too long to convert) is reported as an `InputError` in
the stream rather than raised, so that the caller decides between stopping and `--skip-invalid`.
A file that cannot be read at all (permissions, I/O errors, a `.json` document that is not UTF-8, a
corrupt Parquet or Arrow file) is refused as one `UnreadableInput` line naming it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eyas.errors import EyasError, InputError, where
from eyas.files import reading

DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".arrow")
_COLUMNAR_BATCH = 1024  # rows decoded into Python at a time
_DATASETS_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
_JSON_SPACE = " \t\r\n"
_REST_UNREADABLE = "; rest of file unreadable"  # after a bad array element its end cannot be found
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class RawRecord:
    """One decoded JSON object (or the error that prevented decoding it) and where it came from."""

    source: str
    value: Any | InputError


def is_datasets_dir(path: Path) -> bool:
    """Return True when `path` looks like a directory written by `datasets.save_to_disk`."""
    return path.is_dir() and any((path / m).is_file() for m in _DATASETS_MARKERS)


def _identity(path: Path) -> tuple[int, int]:
    """Return the (device, inode) of what `path` leads to, symlinks followed."""
    with reading(path):
        status = path.stat()
    return status.st_dev, status.st_ino


def _data_files(root: Path) -> list[Path]:
    """Return the data files (DATA_SUFFIXES) and datasets dirs under the directory `root`, in sorted
    order, symlinked directories followed (named by the link's path), a datasets dir taken whole;
    refuses a directory symlink that leads back to
    one of its own ancestors (a loop), a link to itself, a broken link named as data (`x.jsonl`) and a
    directory that cannot be listed."""
    found: list[Path] = []
    pending: list[tuple[Path, dict[tuple[int, int], Path]]] = [(root, {_identity(root): root})]
    while pending:
        directory, ancestors = pending.pop()
        with reading(directory):
            entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
        for entry in entries:
            path = Path(entry.path)
            with reading(path):  # a link to itself fails with ELOOP; a broken link is neither
                is_dir = entry.is_dir()
            if is_dir and is_datasets_dir(path):
                found.append(path)
            elif is_dir:
                identity = _identity(path)
                if identity in ancestors:
                    raise EyasError(f"{path}: a symlink loop: it leads back to {ancestors[identity]} (--data)")
                pending.append((path, {**ancestors, identity: path}))
            elif path.suffix in DATA_SUFFIXES:
                if not entry.is_file():
                    raise EyasError(f"{path}: a broken symlink (it points to {os.readlink(path)}, which is not a "
                                    "file) (--data)")
                found.append(path)
    return sorted(found)


def expand_inputs(paths: list[Path]) -> list[Path]:
    """Return the input files/datasets dirs behind `paths`, directories walked in sorted order with
    their symlinked sub-directories.

    Refuses a missing path, a file with another suffix, a directory holding no data, a symlink loop
    and a directory that cannot be listed.
    """
    found: list[Path] = []
    for path in paths:
        if not path.exists():
            raise EyasError(f"{path}: no such file or directory (--data)")
        if path.is_file():
            if path.suffix not in DATA_SUFFIXES:
                raise EyasError(f"{path}: unsupported data file (expected .json, .jsonl, .parquet or .arrow)")
            found.append(path)
        elif is_datasets_dir(path):
            found.append(path)
        else:
            inside = _data_files(path)
            if not inside:
                raise EyasError(f"{path}: directory holds no .json/.jsonl files, no .parquet/.arrow files and no "
                                "datasets dir")
            found.extend(inside)
    return found


def text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield `(line number, line)` for each non-blank line of the text file `path`, numbered from 1.

    A byte that is not UTF-8 stays in its line as a lone surrogate (Python's `surrogateescape`), for
    `load_json_line` to refuse that line alone; a file that cannot be read raises `UnreadableInput`.
    """
    with reading(path), open(path, encoding="utf-8", errors="surrogateescape") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                yield number, line


def _undecodable(source: str, error: RecursionError | ValueError, rest: str = "") -> InputError:
    """Return the InputError (`rest` appended to its problem) for a JSON value Python cannot build:
    nested too deeply, or an integer longer than Python converts (the only ValueError json raises
    besides its JSONDecodeError)."""
    if isinstance(error, RecursionError):
        return InputError(source, "json", f"nested too deeply to parse{rest}", "nested too deeply")
    return InputError(source, "json", f"an integer of more than {sys.get_int_max_str_digits()} digits{rest}",
                      "integer too long")


def load_json_line(source: str, line: str) -> Any:
    """Return the JSON value of one line of `text_lines`.

    Refuses, as an InputError naming `source` and the field `json`: a byte that is not UTF-8, nesting
    too deep to parse, an integer too long to convert. Malformed JSON raises `json.JSONDecodeError`,
    which each reader words its own way.
    """
    try:
        line.encode("utf-8")
    except UnicodeEncodeError as error:
        byte = ord(line[error.start]) - 0xDC00  # surrogateescape kept the byte as U+DC80..U+DCFF
        raise InputError(source, "json", f"not UTF-8 text (byte 0x{byte:02x} at column {error.start + 1})",
                         "not UTF-8") from None
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        raise
    except (RecursionError, ValueError) as error:
        raise _undecodable(source, error) from None


def _jsonl_value(source: str, line: str) -> Any | InputError:
    """Return the value of one JSONL line, or the InputError that refuses it."""
    try:
        return load_json_line(source, line)
    except json.JSONDecodeError as error:
        return InputError(source, "json", f"malformed JSON: {error.msg} at column {error.colno}", "malformed JSON")
    except InputError as error:
        return error


def _read_jsonl(path: Path) -> Iterator[RawRecord]:
    for number, line in text_lines(path):
        source = where(path, number)
        yield RawRecord(source, _jsonl_value(source, line))


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _skip_space(text: str, pos: int) -> int:
    """Return the position of the first non-whitespace character of `text` from `pos` on."""
    while pos < len(text) and text[pos] in _JSON_SPACE:
        pos += 1
    return pos


def _value_at(path: Path, text: str, pos: int, rest: str = "") -> tuple[Any, int]:
    """Return the JSON value starting at `text[pos]` and the position after it.

    Refuses, as an InputError (`rest` appended to the problem): malformed JSON (naming the line of the
    error), nesting too deep to parse and an integer too long to convert (naming the value's line).
    """
    try:
        return _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError as error:
        source = where(path, error.lineno)
        raise InputError(source, "json", f"malformed JSON: {error.msg}{rest}", "malformed JSON") from None
    except (RecursionError, ValueError) as error:
        raise _undecodable(where(path, _line_of(text, pos)), error, rest) from None


def _json_records(path: Path, text: str) -> Iterator[RawRecord]:
    """Yield the elements of a top-level JSON array (or the single top-level object) with their lines;
    raises an InputError where the document stops being readable."""
    pos = len(text) - len(text.lstrip())
    if text[pos:pos + 1] != "[":
        value, end = _value_at(path, text, pos)
        if text[end:].strip():
            raise InputError(where(path, _line_of(text, end)), "json", "extra data after the top-level value",
                             "malformed JSON")
        yield RawRecord(where(path, _line_of(text, pos)), value)
        return
    pos = _skip_space(text, pos + 1)
    while text[pos:pos + 1] != "]":
        value, end = _value_at(path, text, pos, _REST_UNREADABLE)
        yield RawRecord(where(path, _line_of(text, pos)), value)
        pos = _skip_space(text, end)
        if text[pos:pos + 1] == ",":
            pos = _skip_space(text, pos + 1)
        elif text[pos:pos + 1] != "]":
            raise InputError(where(path, _line_of(text, pos)), "json",
                             "malformed JSON: expected ',' or ']' in the top-level array", "malformed JSON")


def _read_json(path: Path) -> Iterator[RawRecord]:
    """Yield the records of a .json file, the first unreadable spot as a last InputError record;
    raises `UnreadableInput` for a file that cannot be read or is not UTF-8."""
    with reading(path):
        text = path.read_text(encoding="utf-8")
    try:
        yield from _json_records(path, text)
    except InputError as error:
        yield RawRecord(error.source, error)


def _datasets_splits(path: Path) -> list[tuple[str, Any]]:
    try:
        import datasets
    except ImportError:
        raise EyasError(f"{path}: reading a datasets dir needs the optional extra: pip install 'eyas[datasets]'") from None
    with reading(path):
        loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        return [(name, loaded[name]) for name in sorted(loaded)]
    return [("", loaded)]


def _read_datasets_dir(path: Path) -> Iterator[RawRecord]:
    for name, split in _datasets_splits(path):
        prefix = f"{path}/{name}" if name else str(path)
        with reading(path):
            for row, value in enumerate(split):
                yield RawRecord(where(prefix, f"row{row}"), without_nulls(value))


def without_nulls(value: Any) -> Any:
    """Return `value` (a row of a columnar file) with every null-valued object key left out, at any depth."""
    if isinstance(value, dict):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_nulls(item) for item in value]
    return value


def _batches(path: Path) -> Iterator[Any]:
    """Yield the record batches of a Parquet file, or of an Arrow IPC file or stream (the stream is what
    `datasets` writes); raises `UnreadableInput` for a file pyarrow cannot read."""
    import pyarrow.parquet as pq

    with reading(path):
        if path.suffix == ".parquet":
            yield from pq.ParquetFile(path).iter_batches(batch_size=_COLUMNAR_BATCH)
        else:
            yield from _ipc_batches(path)


def _ipc_batches(path: Path) -> Iterator[Any]:
    import pyarrow as pa

    source = pa.memory_map(str(path))
    try:
        reader = pa.ipc.open_file(source)
    except pa.ArrowInvalid:  # not the file format: the stream format has no footer
        source.seek(0)
        yield from pa.ipc.open_stream(source)
        return
    for index in range(reader.num_record_batches):
        yield reader.get_batch(index)


def _read_columnar(path: Path) -> Iterator[RawRecord]:
    row = 0
    for batch in _batches(path):
        for value in batch.to_pylist():
            yield RawRecord(where(path, f"row{row}"), without_nulls(value))
            row += 1


def read_records(path: Path) -> Iterator[RawRecord]:
    """Yield every record of one input (a .jsonl/.json/.parquet/.arrow file or a datasets dir) in file order.

    A record that cannot be decoded comes as an InputError value; a file that cannot be read raises
    `UnreadableInput` naming it.
    """
    if path.is_dir():
        return _read_datasets_dir(path)
    if path.suffix == ".jsonl":
        return _read_jsonl(path)
    if path.suffix in (".parquet", ".arrow"):
        return _read_columnar(path)
    return _read_json(path)


def count_records(path: Path) -> int:
    """Return how many records `read_records(path)` will yield (used for progress and ETA); raises
    `UnreadableInput` for a file that cannot be read."""
    if path.is_dir():
        return sum(len(split) for _, split in _datasets_splits(path))
    if path.suffix == ".jsonl":
        return sum(1 for _ in text_lines(path))
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        with reading(path):
            return pq.ParquetFile(path).metadata.num_rows
    if path.suffix == ".arrow":
        return sum(batch.num_rows for batch in _batches(path))
    return sum(1 for _ in read_records(path))
