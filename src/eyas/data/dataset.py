"""The prepared dataset on disk: Parquet shards, prompt files, token counts and the manifest.

Layout of a dataset dir:
  data-00000.parquet    input_ids list<int32>, loss_mask list<bool>, source string (file:line)
  prompts-00000.jsonl   prompt-only records ({"prompt", "source"}) for `eyas regenerate`
  token_counts.safetensors  counts [V] int64 of loss-masked target tokens
  vocab.safetensors     d2t / t2d when a draft vocabulary size was asked for
  manifest.json         provenance, per-shard sha256, counts (written last: marks completion)
  progress.json         finished shards of an unfinished run (removed on completion)
  config.yaml           the resolved `prepare` config
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, Field, ValidationError

from eyas.data.chat_tokens import Encoded
from eyas.errors import EyasError
from eyas.files import reading, write_atomic
from eyas.stage import MANIFEST_FILE, StageManifest

FORMAT_VERSION = 1
MANIFEST = MANIFEST_FILE
PROGRESS = "progress.json"
TOKEN_COUNTS = "token_counts.safetensors"
VOCAB = "vocab.safetensors"

SCHEMA = pa.schema([
    ("input_ids", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.bool_())),
    ("source", pa.string()),
])


class ShardStats(BaseModel):
    """What one shard (a fixed range of input records) produced."""

    index: int
    records: int = 0
    rows: int = 0
    prompts: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    truncated: int = 0
    dropped_no_loss: int = 0
    reasoning_not_rendered: int = 0  # records with assistant reasoning the chat template did not render
    skipped: dict[str, int] = Field(default_factory=dict)
    skipped_examples: list[str] = Field(default_factory=list)
    data_file: str | None = None
    data_sha256: str | None = None
    prompts_file: str | None = None
    prompts_sha256: str | None = None


class Progress(BaseModel):
    """Finished shards of an interrupted run, keyed to the run's inputs and settings."""

    run_key: str
    shards: list[ShardStats] = Field(default_factory=list)


class VocabInfo(BaseModel):
    size: int
    coverage: float
    file: str


class DatasetManifest(StageManifest):
    """`manifest.json` of a finished dataset."""

    kind: str = "eyas.dataset"
    format_version: int = FORMAT_VERSION
    fingerprint: str
    inputs: list[dict[str, str]]
    counts: dict[str, int]
    skipped: dict[str, int]
    skipped_examples: list[str]
    shards: list[ShardStats]
    token_counts_file: str = TOKEN_COUNTS
    vocab: VocabInfo | None = None


def shard_name(index: int, kind: str) -> str:
    """Return the file name of shard `index` (`kind` is "data" or "prompts")."""
    return f"data-{index:05d}.parquet" if kind == "data" else f"prompts-{index:05d}.jsonl"


def write_data_shard(path: Path, rows: list[Encoded]) -> None:
    """Atomically write encoded samples to a Parquet shard (zstd, deterministic bytes)."""
    lengths = np.fromiter((len(r.input_ids) for r in rows), dtype=np.int32, count=len(rows))
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    ids = np.concatenate([r.input_ids for r in rows]).astype(np.int32)  # [sum T]
    mask = np.concatenate([r.loss_mask for r in rows])  # [sum T] bool
    table = pa.Table.from_arrays(
        [
            pa.ListArray.from_arrays(offsets, pa.array(ids)),
            pa.ListArray.from_arrays(offsets, pa.array(mask)),
            pa.array([r.source for r in rows], pa.string()),
        ],
        schema=SCHEMA,
    )
    write_atomic(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))


def _parquet(path: Path) -> pq.ParquetFile:
    """Return the Parquet shard `path`, opened (its footer read); refuses one that cannot be read."""
    with reading(path):
        return pq.ParquetFile(path)


def _read_columns(path: Path, columns: list[str]) -> pa.Table:
    """Return `columns` of the Parquet shard `path`; refuses one that cannot be read."""
    with reading(path):
        return pq.read_table(path, columns=columns)


def iter_shard_tokens(path: Path) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield `(input_ids [T] int32, loss_mask [T] bool)` flattened over each row group of a shard; refuses a
    shard that cannot be read (`eyas.files.reading`)."""
    parquet = _parquet(path)
    for group in range(parquet.num_row_groups):
        with reading(path):
            table = parquet.read_row_group(group, columns=["input_ids", "loss_mask"])
        ids = table.column("input_ids").combine_chunks().flatten().to_numpy()
        mask = table.column("loss_mask").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        yield ids, mask


def count_loss_tokens(dataset_dir: Path, data_files: list[str], vocab_size: int) -> np.ndarray:
    """Return `counts [V] int64`: how often each target id occurs under the loss mask."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for name in data_files:
        for ids, mask in iter_shard_tokens(dataset_dir / name):
            counts += np.bincount(ids[mask], minlength=vocab_size)[:vocab_size]
    return counts


def read_manifest(dataset_dir: Path) -> DatasetManifest:
    """Return the manifest of a finished dataset; refuses a missing or unreadable one."""
    return DatasetManifest.read(dataset_dir, "eyas dataset", "eyas prepare")


def no_samples_problem(dataset_dir: Path, manifest: DatasetManifest) -> str | None:
    """Return why the dataset gives nothing to extract or train on (no row: no record carried a loss token), or
    None when it has rows. Prompt-only records are for `eyas regenerate` (and `eyas eval`), which answer them."""
    if manifest.counts.get("rows", 0) > 0:
        return None
    prompts = manifest.counts.get("prompts", 0)
    remedy = (f"its {prompts} record(s) are prompts only, for `eyas regenerate` and `eyas eval`: have the target "
              f"answer them (eyas regenerate --prompts {dataset_dir} --target MODEL --out DIR), then prepare "
              "DIR/conversations.jsonl" if prompts else "prepare conversations that have assistant turns")
    return f"{dataset_dir}: holds no samples (no record carrying a loss token); {remedy}"


def read_progress(dataset_dir: Path) -> Progress | None:
    """Return the progress of an unfinished run in `dataset_dir`, or None when there is none."""
    path = dataset_dir / PROGRESS
    if not path.is_file():
        return None
    try:
        return Progress.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, ValidationError) as exc:
        raise EyasError(f"{path}: unreadable progress file ({str(exc).splitlines()[0]}); rerun with --overwrite") from None


class DatasetReader:
    """Random access by global row index to the samples of a finished dataset, in dataset order."""

    def __init__(self, dataset_dir: Path) -> None:
        self.dir = dataset_dir
        self.manifest = read_manifest(dataset_dir)
        self.files = [dataset_dir / s.data_file for s in self.manifest.shards if s.data_file]
        missing = [str(p) for p in self.files if not p.is_file()]
        if missing:
            raise EyasError(f"{missing[0]}: listed in {dataset_dir / MANIFEST} but missing")
        counts = [_parquet(p).metadata.num_rows for p in self.files]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # [files+1]
        self._cached: tuple[int, pa.Table] | None = None

    def __len__(self) -> int:
        return int(self.starts[-1])

    def lengths(self) -> np.ndarray:
        """Return `[S] int64`: the token count of every sample, read from the list offsets only."""
        parts = [_read_columns(p, ["input_ids"]).column("input_ids").combine_chunks() for p in self.files]
        return np.concatenate([np.diff(c.offsets.to_numpy()) for c in parts] or [np.zeros(0)]).astype(np.int64)

    def _table(self, file_index: int) -> pa.Table:
        if self._cached is None or self._cached[0] != file_index:
            self._cached = (file_index, _read_columns(self.files[file_index], ["input_ids", "loss_mask"]))
        return self._cached[1]

    def row(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Return `(input_ids [T] int32, loss_mask [T] bool)` of global row `index`."""
        file_index = int(np.searchsorted(self.starts, index, side="right")) - 1
        table = self._table(file_index)
        local = index - int(self.starts[file_index])
        ids = table.column("input_ids")[local].values.to_numpy(zero_copy_only=False, writable=True)
        mask = table.column("loss_mask")[local].values.to_numpy(zero_copy_only=False, writable=True)
        return ids, mask
