"""The feature store: sharded safetensors of per-token features, and a manifest.

Each shard `shard-CCCCC.safetensors` holds a contiguous range of dataset samples, packed:
  input_ids  [N] int32        loss_mask [N] bool
  offsets    [S+1] int64      sample_ids [S] int64   (dataset row index of each sample)
  aux        [N, A*H]         the A auxiliary hidden states, concatenated (A = len(layer_ids))
  last       [N, H]           the last layer's output before the final norm (teacher input)
  aux_scale  [N, A] float32   last_scale [N, 1] float32   (fp8 storage only, see fp8.py)
where N is the shard's token count and S its sample count. `manifest.json` lists every shard
with its size, sample range and sha256. `eyas verify` recomputes every checksum and reads every
sample; `open_store`, through which `eyas train` reads, checks the same but the features as it
opens the shards.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NoReturn

import torch
from pydantic import BaseModel, Field
from safetensors import safe_open
from safetensors.torch import save_file

from eyas.errors import EyasError
from eyas.features import fp8
from eyas.files import reading, sha256_file, write_atomic
from eyas.stage import MANIFEST_FILE, StageManifest

FORMAT_VERSION = 1
MANIFEST = MANIFEST_FILE
StorageDtype = Literal["bf16", "fp8", "fp32"]
TORCH_STORAGE = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp8": fp8.FP8}
SAFETENSORS_DTYPE = {"bf16": "BF16", "fp32": "F32", "fp8": "F8_E4M3"}
_METADATA_KEY = "eyas.features"
DAMAGED = "the store is damaged or mixed with another: `eyas verify {store}` lists every problem; extract it again " \
          "(eyas extract --overwrite)"


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def bytes_per_token(hidden_size: int, num_aux: int, storage: StorageDtype) -> int:
    """Return the stored bytes per token: features, ids, mask and (fp8) scales."""
    width = {"bf16": 2, "fp32": 4, "fp8": 1}[storage]
    scales = 4 * (num_aux + 1) if storage == "fp8" else 0
    return (num_aux + 1) * hidden_size * width + scales + 4 + 1


@dataclass
class SampleFeatures:
    """Features of one sample: `input_ids [T]`, `loss_mask [T]`, `aux [T, A*H]`, `last [T, H]`."""

    sample_id: int
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    aux: torch.Tensor
    last: torch.Tensor


class ShardInfo(BaseModel):
    index: int
    file: str
    sha256: str
    samples: int
    tokens: int
    bytes: int
    first_sample: int


class StoreManifest(StageManifest):
    """`manifest.json` of a finished feature store."""

    kind: str = "eyas.features"
    format_version: int = FORMAT_VERSION
    dataset_path: str
    dataset_fingerprint: str
    layer_ids: list[int] = Field(description="auxiliary layer ids in layer_convention")
    layer_convention: Literal["input"] = "input"
    requested_layers: dict[str, object] = Field(description="the ids and convention as the user gave them")
    num_layers: int
    hidden_size: int
    storage_dtype: StorageDtype
    compute_dtype: str
    precision: dict[str, object] | None = Field(None, description="how compute_dtype was chosen (eyas.precision)")
    backend: str = Field("hf", description="what computed the features: hf, or vllm VERSION (path)")
    samples: int
    tokens: int
    bytes: int
    bytes_per_token: float
    shards: list[ShardInfo]


def write_shard(path: Path, index: int, samples: list[SampleFeatures], storage: StorageDtype, num_aux: int) -> ShardInfo:
    """Atomically write `samples` (in order) as one shard; return its manifest entry."""
    lengths = torch.tensor([len(s.input_ids) for s in samples], dtype=torch.int64)
    tensors = {
        "input_ids": torch.cat([s.input_ids for s in samples]).to(torch.int32),  # [N]
        "loss_mask": torch.cat([s.loss_mask for s in samples]).to(torch.bool),  # [N]
        "offsets": torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]),  # [S+1]
        "sample_ids": torch.tensor([s.sample_id for s in samples], dtype=torch.int64),  # [S]
    }
    aux = torch.cat([s.aux for s in samples])  # [N, A*H]
    last = torch.cat([s.last for s in samples])  # [N, H]
    if storage == "fp8":
        tensors["aux"], tensors["aux_scale"] = fp8.quantize(aux, num_aux)
        tensors["last"], tensors["last_scale"] = fp8.quantize(last, 1)
    else:
        tensors["aux"], tensors["last"] = aux.to(TORCH_STORAGE[storage]), last.to(TORCH_STORAGE[storage])
    metadata = {_METADATA_KEY: json.dumps({"index": index, "storage_dtype": storage, "num_aux": num_aux}, sort_keys=True)}
    tensors = {name: t.contiguous() for name, t in tensors.items()}
    write_atomic(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
    return ShardInfo(index=index, file=path.name, sha256=sha256_file(path), samples=len(samples),
                     tokens=int(lengths.sum()), bytes=path.stat().st_size, first_sample=samples[0].sample_id)


def _storage_of(path: Path, metadata: dict[str, str] | None) -> StorageDtype:
    """Return the storage dtype a shard's metadata records; refuses a shard without one (not written by
    `write_shard`: its features could be any dtype)."""
    try:
        storage = json.loads((metadata or {})[_METADATA_KEY])["storage_dtype"]
    except (KeyError, TypeError, json.JSONDecodeError):
        storage = None
    if storage not in TORCH_STORAGE:
        raise EyasError(f"{path}: metadata: no {_METADATA_KEY} storage_dtype ({'/'.join(TORCH_STORAGE)}), so its "
                        "features cannot be read; not a shard written by `eyas extract` (extract the store again)")
    return storage


class FeatureShard:
    """Memory-mapped read access to one shard; features come back dequantized in float32."""

    def __init__(self, path: Path) -> None:
        """Open the shard `path`; refuses one that cannot be read (missing, truncated, not safetensors) or
        whose metadata does not record its storage dtype, in one line naming it."""
        self.path = path
        with reading(path):
            self._file = safe_open(str(path), framework="pt")
            self.storage: StorageDtype = _storage_of(path, self._file.metadata())
            self.offsets = self._file.get_tensor("offsets")  # [S+1]
            self.sample_ids = self._file.get_tensor("sample_ids")  # [S]

    def __len__(self) -> int:
        return len(self.sample_ids)

    def header(self) -> dict[str, tuple[list[int], str]]:
        """Return the shape and safetensors dtype (`BF16`, ...) of every tensor in the shard, from its header."""
        with reading(self.path):
            return {name: (self._file.get_slice(name).get_shape(), self._file.get_slice(name).get_dtype())
                    for name in self._file.keys()}

    def sample(self, position: int) -> dict[str, torch.Tensor]:
        """Return the tensors of the shard's `position`-th sample (features in float32); refuses
        features holding a NaN or an infinity, naming the shard and the sample id."""
        start, stop = int(self.offsets[position]), int(self.offsets[position + 1])
        out = {}
        with reading(self.path):
            for name in ("input_ids", "loss_mask", "aux", "last"):
                sliced = self._file.get_slice(name)[start:stop]
                if name in ("aux", "last"):
                    if self.storage == "fp8":
                        sliced = fp8.dequantize(sliced, self._file.get_slice(f"{name}_scale")[start:stop])
                    sliced = sliced.float()
                out[name] = sliced
        bad = [name for name in ("aux", "last") if not bool(torch.isfinite(out[name]).all())]
        if bad:
            raise EyasError(f"{self.path}: sample {int(self.sample_ids[position])}: {' and '.join(bad)} "
                            "features hold NaN or Inf; extract the store again (eyas extract --overwrite)")
        return out


def read_store_manifest(store: Path) -> StoreManifest:
    """Return the manifest of a finished store; refuses a missing or unreadable one."""
    return StoreManifest.read(store, "eyas feature-store", "eyas extract")


def _manifest_problems(store: Path, manifest: StoreManifest) -> list[str]:
    """Return where the manifest contradicts itself: totals other than the shards' sums, shards out of order
    or not covering the samples one after another."""
    path, problems = store / MANIFEST, []
    for field in ("samples", "tokens"):
        held = sum(getattr(s, field) for s in manifest.shards)
        if held != getattr(manifest, field):
            problems.append(f"{path}: {field}: {getattr(manifest, field)} but the shards hold {held}")
    first = 0
    for position, info in enumerate(manifest.shards):
        if info.index != position or info.first_sample != first:
            problems.append(f"{path}: shards: entry {position} ({info.file}) is shard {info.index} starting at sample "
                            f"{info.first_sample}, expected shard {position} starting at sample {first}")
            break
        first += info.samples
    return problems


def _span(ids: torch.Tensor) -> str:
    """Return `first..last` of sample ids `[S]` in stored order, for messages."""
    return f"{int(ids[0])}..{int(ids[-1])}" if len(ids) else "none"


def _layout_problems(shard: FeatureShard, info: ShardInfo, manifest: StoreManifest) -> list[str]:
    """Return how an opened shard differs from its manifest entry `info`: storage dtype, tensor shapes and
    dtypes, sample ids other than the entry's consecutive samples, offsets not running from 0 to its tokens.
    Reads the header, `sample_ids` and `offsets` only."""
    path, width = shard.path, len(manifest.layer_ids) * manifest.hidden_size
    if shard.storage != manifest.storage_dtype:
        return [f"{path}: storage dtype {shard.storage} but the manifest says {manifest.storage_dtype}"]
    header = shard.header()
    shapes = {name: shape for name, (shape, _) in header.items()}
    dtypes = {name: header[name][1] for name in ("aux", "last") if name in header}
    expected = {"input_ids": [info.tokens], "loss_mask": [info.tokens], "offsets": [info.samples + 1],
                "sample_ids": [info.samples], "aux": [info.tokens, width], "last": [info.tokens, manifest.hidden_size]}
    problems = [f"{path}: {name}: shape {shapes.get(name)} but the manifest implies {shape}"
                for name, shape in expected.items() if shapes.get(name) != shape]
    problems += [f"{path}: {name}: dtype {dtype} but the manifest says {manifest.storage_dtype}"
                 for name, dtype in dtypes.items() if dtype != SAFETENSORS_DTYPE[manifest.storage_dtype]]
    if problems:
        return problems
    listed = torch.arange(info.first_sample, info.first_sample + info.samples)  # [S]
    if not torch.equal(shard.sample_ids, listed):
        problems.append(f"{path}: sample_ids: samples {_span(shard.sample_ids)} but the manifest lists "
                        f"{_span(listed)} for {info.file} (shards swapped, or one of another store)")
    offsets = shard.offsets  # [S+1]
    if int(offsets[0]) != 0 or int(offsets[-1]) != info.tokens or bool((offsets.diff() < 0).any()):
        problems.append(f"{path}: offsets: do not run from 0 up to its {info.tokens} tokens")
    return problems


def _opened(store: Path, info: ShardInfo, manifest: StoreManifest) -> tuple[FeatureShard | None, list[str]]:
    """Return the shard of manifest entry `info`, opened, and what a cheap look at it finds (`shard_problems`);
    no shard when it is missing, of another size or unreadable."""
    path = store / info.file
    if not path.is_file():
        return None, [f"{path}: missing (listed in {store / MANIFEST})"]
    size = path.stat().st_size
    if size != info.bytes:
        return None, [f"{path}: {size} bytes but the manifest lists {info.bytes} (truncated, or another shard: "
                      "swapped, or from another store)"]
    try:
        shard = FeatureShard(path)
    except EyasError as error:
        return None, [str(error)]
    return shard, _layout_problems(shard, info, manifest)


def shard_problems(store: Path, info: ShardInfo, manifest: StoreManifest) -> list[str]:
    """Return what a cheap look at the shard of manifest entry `info` finds (empty: it looks as listed), one
    line each naming it: missing, another size, unreadable, or `_layout_problems`. Reads no features and
    computes no checksum."""
    return _opened(store, info, manifest)[1]


def _checksum_problems(path: Path, info: ShardInfo) -> list[str]:
    """Return the problem of a shard whose sha256 is not its manifest entry's, or that cannot be read (else empty)."""
    try:
        with reading(path):
            digest = sha256_file(path)
    except EyasError as error:
        return [str(error)]
    return [] if digest == info.sha256 else [f"{path}: sha256 mismatch (file changed or corrupted)"]


def _refuse(store: Path, problems: list[str]) -> NoReturn:
    """Refuse a damaged store in one line: its first problem, how many more, and what to do."""
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    raise EyasError(f"{problems[0]}{more}; {DAMAGED.format(store=store)}")


def open_store(store: Path, manifest: StoreManifest, checksums: bool = True) -> list[FeatureShard]:
    """Return the store's shards, opened, in manifest order.

    Refuses, in one line naming the first shard that differs and how (exit 2), what `eyas verify` would
    report before reading a feature: a store holding no samples, a manifest that contradicts itself, a
    shard missing, of another size, unreadable, or holding other tensors, sample ids or offsets than its
    entry lists (`shard_problems`: header, sample ids and offsets only); with `checksums`, also a shard
    whose sha256 is not the manifest's (each shard is read once more, on as many threads as there are
    cores: bench/store_open.py).
    Non-finite features are refused as each sample is read (`FeatureShard.sample`).
    """
    if manifest.samples == 0:
        raise EyasError(f"{store}: holds no samples (extracted from {manifest.dataset_path}, a dataset without a "
                        "record carrying a loss token); prepare conversations (prompts only: answer them with "
                        "`eyas regenerate` first), extract them, then train")
    if problems := _manifest_problems(store, manifest):
        _refuse(store, problems)
    shards = []
    for info in manifest.shards:
        shard, problems = _opened(store, info, manifest)
        if shard is None or problems:
            _refuse(store, problems)
        shards.append(shard)
    if checksums:
        workers = min(len(manifest.shards), os.cpu_count() or 1)  # hashlib hashes outside the GIL
        with ThreadPoolExecutor(max_workers=workers) as pool:
            found = pool.map(lambda info: _checksum_problems(store / info.file, info), manifest.shards)
            if problems := [problem for each in found for problem in each]:
                _refuse(store, problems)
    return shards


def _nonfinite_samples(path: Path) -> list[str]:
    """Return one problem per sample of the shard `path` whose features hold a NaN or an infinity (or the
    one problem of a shard that cannot be read)."""
    try:
        shard, problems = FeatureShard(path), []
    except EyasError as error:
        return [str(error)]
    for position in range(len(shard)):
        try:
            shard.sample(position)
        except EyasError as error:
            problems.append(str(error))
    return problems


def verify_store(store: Path) -> list[str]:
    """Return every problem found in `store` (empty when it is intact).

    Checks the manifest against itself, that no shard file is missing or unlisted, each shard against
    its entry (`shard_problems`: size, tensors, sample ids, offsets), recomputes each sha256, and that
    every sample's features are finite (one problem per sample holding a NaN or an infinity).
    """
    try:
        manifest = read_store_manifest(store)
    except EyasError as error:
        return [str(error)]
    listed = {s.file for s in manifest.shards}
    problems = [f"{p}: shard file not listed in the manifest" for p in sorted(store.glob("shard-*.safetensors"))
                if p.name not in listed]
    problems += _manifest_problems(store, manifest)
    for info in manifest.shards:
        path = store / info.file
        found = _checksum_problems(path, info) if path.is_file() else []
        found += [problem for problem in shard_problems(store, info, manifest) if problem not in found]
        problems += found or _nonfinite_samples(path)
    return problems
