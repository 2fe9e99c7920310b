"""Draft vocabulary: the N most frequent loss-masked target tokens, as `d2t` / `t2d`.

`d2t[i] = id_i - i` for the selected ids sorted ascending (so `target_id = i + d2t[i]`), and
`t2d` is a bool mask over the target vocabulary. Ties in frequency go to the lower token id.
Vocabularies are cached per (dataset fingerprint, N) and the fingerprint is checked on every
read, so a vocabulary is never reused for another dataset.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from eyas.errors import EyasError
from eyas.files import parse_json_object, reading, write_atomic

CACHE_DIR = "vocab-cache"
METADATA_KEY = "eyas.draft_vocab"


@dataclass(frozen=True)
class DraftVocab:
    """`d2t [N] int64` offsets, `t2d [V] bool` mask, and the share of loss tokens covered."""

    d2t: np.ndarray
    t2d: np.ndarray
    coverage: float

    @property
    def token_ids(self) -> np.ndarray:
        """Return the selected target ids `[N]`, ascending."""
        return np.arange(len(self.d2t), dtype=np.int64) + self.d2t


def check_draft_vocab_size(size: int, vocab_size: int) -> int:
    """Return `size`; refuses a draft vocabulary size outside 1..`vocab_size` (the target's), as
    `eyas prepare` and `eyas train` both do."""
    if not 0 < size <= vocab_size:
        raise EyasError(f"draft_vocab_size: {size} must be between 1 and the target vocabulary size {vocab_size}")
    return size


def select_draft_vocab(counts: np.ndarray, size: int) -> DraftVocab:
    """Return the draft vocabulary of the `size` most frequent ids in `counts [V]`.

    Refuses a size `check_draft_vocab_size` refuses. Ids that never occur fill the remaining
    places in ascending order when fewer than `size` ids occur.
    """
    vocab_size = len(counts)
    check_draft_vocab_size(size, vocab_size)
    by_frequency = np.argsort(-counts, kind="stable")  # [V] ids, most frequent first, ties by id
    chosen = np.sort(by_frequency[:size])  # [N] ascending ids
    d2t = chosen - np.arange(size, dtype=np.int64)
    t2d = np.zeros(vocab_size, dtype=bool)
    t2d[chosen] = True
    total = int(counts.sum())
    coverage = float(counts[chosen].sum() / total) if total else 0.0
    return DraftVocab(d2t.astype(np.int64), t2d, coverage)


def save_draft_vocab(path: Path, vocab: DraftVocab, dataset_fingerprint: str) -> None:
    """Atomically write `d2t` and `t2d` to a safetensors file tagged with the dataset fingerprint."""
    # one metadata key holding sorted JSON: safetensors stores metadata in a hash map, so several
    # keys would be written in a different order by each process and break byte-identical output
    info = {"dataset_fingerprint": dataset_fingerprint, "draft_vocab_size": len(vocab.d2t), "coverage": vocab.coverage}
    metadata = {METADATA_KEY: json.dumps(info, sort_keys=True)}
    write_atomic(path, lambda tmp: save_file({"d2t": vocab.d2t, "t2d": vocab.t2d}, str(tmp), metadata=metadata))


def load_draft_vocab(path: Path, dataset_fingerprint: str | None = None) -> DraftVocab:
    """Return the vocabulary in `path`; refuses a file that cannot be read (missing, truncated, no `d2t`/`t2d`:
    `eyas.files.reading`) and one made for another dataset when a fingerprint is given."""
    with reading(path), safe_open(str(path), framework="numpy") as handle:
        info = parse_json_object((handle.metadata() or {}).get(METADATA_KEY, "{}"), f"{path}: metadata {METADATA_KEY}")
        if dataset_fingerprint is not None and info.get("dataset_fingerprint") != dataset_fingerprint:
            raise EyasError(f"{path}: dataset_fingerprint: made for another dataset ({info.get('dataset_fingerprint')})")
        return DraftVocab(handle.get_tensor("d2t"), handle.get_tensor("t2d"), float(info.get("coverage", "nan")))


def cached_draft_vocab(dataset_dir: Path, dataset_fingerprint: str, counts: np.ndarray, size: int) -> tuple[DraftVocab, bool]:
    """Return the vocabulary of `size` for this dataset and whether it came from the cache.

    The cache entry is named by fingerprint and size and its stored fingerprint is compared in
    full, so a changed dataset always recomputes.
    """
    path = dataset_dir / CACHE_DIR / f"{dataset_fingerprint[:16]}-{size}.safetensors"
    if path.is_file():
        try:
            vocab = load_draft_vocab(path, dataset_fingerprint)
            if len(vocab.d2t) == size and len(vocab.t2d) == len(counts):
                return vocab, True
        except EyasError:
            pass  # another dataset's entry under a colliding prefix: rebuild it below
    vocab = select_draft_vocab(counts, size)
    save_draft_vocab(path, vocab, dataset_fingerprint)
    return vocab, False
