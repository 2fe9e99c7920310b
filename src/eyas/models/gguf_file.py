"""A GGUF file's own metadata, read without transformers: the raw bytes of every key-value entry and
the storage type of every tensor, so that eyas can fingerprint a GGUF target the same way under any
transformers line and tell a packed (quantized) file from a float one.

`gguf.GGUFReader` builds a numpy view per array element, which takes seconds per 100k-token
vocabulary (4.5 s on SmolLM2's 49k tokens and merges); this walk reads the same layout (the GGUF
spec, v2 and v3, little-endian; the `gguf` package's value types) and keeps each entry as its bytes
in the file, in about a tenth of a second. tests/models/test_gguf_fingerprint.py holds it to
`gguf.GGUFReader`.
"""

from __future__ import annotations

import functools
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from eyas.errors import EyasError
from eyas.files import reading

MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
FLOAT_TYPES = frozenset({0, 1, 30})  # GGMLQuantizationType F32, F16, BF16: stored as plain numbers, not blocks


@dataclass(frozen=True)
class GgufMetadata:
    """A GGUF file's key-value entries (key -> the entry's value bytes, type tag included) with the
    scalars and strings decoded (`values`; arrays as their length), and each tensor's ggml type."""

    entries: dict[str, bytes]
    values: dict[str, object]
    tensor_types: dict[str, int]

    @property
    def architecture(self) -> str:
        """Return `general.architecture` (llama.cpp's name: llama, gemma3, qwen3, ...)."""
        return str(self.values.get("general.architecture", ""))

    @property
    def packed(self) -> bool:
        """Return whether any tensor is stored in quantized blocks (Q4_K, Q8_0, ...) rather than as numbers."""
        return any(kind not in FLOAT_TYPES for kind in self.tensor_types.values())

    @property
    def vocab_size(self) -> int:
        """Return the vocabulary size: `ARCH.vocab_size` where the file states it, else its token count."""
        stated = self.values.get(f"{self.architecture}.vocab_size")
        return int(stated) if isinstance(stated, int) else int(self.values.get("tokenizer.ggml.tokens", 0))  # type: ignore[arg-type]


def is_gguf_file(path: Path) -> bool:
    """Return whether `path` is a file that starts with the GGUF magic bytes."""
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == MAGIC
    except OSError:
        return False


class _Cursor:
    """Little-endian reads at a moving offset of a memory-mapped file."""

    def __init__(self, data: mmap.mmap) -> None:
        self.data, self.at = data, 0

    def unpack(self, layout: str) -> object:
        (value,) = struct.unpack_from(layout, self.data, self.at)
        self.at += struct.calcsize(layout)
        return value

    def string(self) -> str:
        length = int(self.unpack("<Q"))  # type: ignore[arg-type]
        self.at += length
        return bytes(self.data[self.at - length:self.at]).decode("utf-8", errors="replace")

    def value(self, kind: int) -> object:
        """Return a scalar or string at the cursor; an array is skipped and its length returned."""
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise ValueError(f"unknown value type {kind}")
        item, count = int(self.unpack("<I")), int(self.unpack("<Q"))  # type: ignore[arg-type]
        if item in _SCALARS:
            self.at += count * struct.calcsize(_SCALARS[item])
        else:
            for _ in range(count):
                self.value(item)
        return count


@functools.lru_cache(maxsize=8)
def _read(path: Path, size: int, mtime: int) -> GgufMetadata:
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cursor = _Cursor(data)
        if data[:4] != MAGIC:
            raise ValueError("not a GGUF file (no GGUF magic bytes)")
        cursor.at = 4
        version = cursor.unpack("<I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version}: eyas reads little-endian GGUF v2 and v3")
        tensors, count = int(cursor.unpack("<Q")), int(cursor.unpack("<Q"))  # type: ignore[arg-type]
        entries: dict[str, bytes] = {}
        values: dict[str, object] = {}
        for _ in range(count):
            key = cursor.string()
            start = cursor.at
            values[key] = cursor.value(int(cursor.unpack("<I")))  # type: ignore[arg-type]
            entries[key] = bytes(data[start:cursor.at])
        tensor_types: dict[str, int] = {}
        for _ in range(tensors):
            name = cursor.string()
            dimensions = int(cursor.unpack("<I"))  # type: ignore[arg-type]
            cursor.at += 8 * dimensions
            tensor_types[name] = int(cursor.unpack("<I"))  # type: ignore[arg-type]
            cursor.at += 8  # the data offset
    return GgufMetadata(entries, values, tensor_types)


def read_gguf_metadata(path: Path) -> GgufMetadata:
    """Return the metadata of the GGUF file `path` (cached per path, size and mtime); refuses a file that
    is not GGUF, a big-endian or v1 file, and a truncated one, in one line naming the file."""
    with reading(path):
        stat = path.stat()
        try:
            return _read(path.absolute(), stat.st_size, stat.st_mtime_ns)
        except (ValueError, struct.error, UnicodeDecodeError) as error:
            raise EyasError(f"{path}: not a readable GGUF file ({error})") from None
