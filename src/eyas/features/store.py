"""The feature store: sharded safetensors of per-token features, and a manifest.

Each shard `shard-CCCCC.safetensors` holds a contiguous range of dataset samples, packed:
  input_ids  [N] int32        loss_mask [N] bool
  offsets    [S+1] int64      sample_ids [S] int64   (dataset row index of each sample)
  aux        [N, A*H]         the A auxiliary hidden states, concatenated (A = len(layer_ids))
  last       [N, H]           the last layer's output before the final norm (teacher input)
  aux_scale  [N, A] float32   last_scale [N, 1] float32   (fp8 storage only, see fp8.py)
  argmax     [N] int32        the target's greedy token after each position (`eyas.models.argmax`,
                              computed from `last` as stored; format 2 on, absent from format-1 stores)
where N is the shard's token count and S its sample count. `manifest.json` lists every shard
with its size, sample range and sha256, and describes the argmax (`teacher_argmax`). `eyas verify`
recomputes every checksum and reads every sample; `open_store`, through which `eyas train` reads,
checks the same but the features as it opens the shards.
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

FORMAT_VERSION = 2  # 2: the per-token `argmax` (format 1 stores still read; training computes it)
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
    """Return the stored bytes per token: features, ids, mask, argmax and (fp8) scales."""
    width = {"bf16": 2, "fp32": 4, "fp8": 1}[storage]
    scales = 4 * (num_aux + 1) if storage == "fp8" else 0
    return (num_aux + 1) * hidden_size * width + scales + 4 + 1 + 4


@dataclass
class SampleFeatures:
    """Features of one sample: `input_ids [T]`, `loss_mask [T]`, `aux [T, A*H]`, `last [T, H]` and the
    target's argmax `[T]` (target ids; computed from `last` as stored: `as_read`)."""

    sample_id: int
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    aux: torch.Tensor
    last: torch.Tensor
    argmax: torch.Tensor | None = None


def as_read(features: torch.Tensor, storage: StorageDtype, blocks: int) -> torch.Tensor:
    """Return `features [N, D]` as a reader gets them back from a shard of `storage` (float32): rounded to the
    storage dtype, or fp8-quantized with one scale per token and block (`blocks`: 1 for `last`)."""
    if storage == "fp8":
        return fp8.dequantize(*fp8.quantize(features, blocks)).float()
    return features.to(TORCH_STORAGE[storage]).float()


class ShardInfo(BaseModel):
    index: int
    file: str
    sha256: str
    samples: int
    tokens: int
    bytes: int
    first_sample: int


ARGMAX_COMPUTED = ("argmax over the target's whole vocabulary of float32 logits lm_head(final_norm(last)), from `last` "
                   "as stored; final norm in float32, LM-head weights as extraction loaded them (compute_dtype), soft cap "
                   "left out (monotone), ties to the lowest id (eyas.models.argmax)")


class ArgmaxInfo(BaseModel):
    """How the shards' per-token `argmax` tensor was computed."""

    tensor: Literal["argmax"] = "argmax"
    dtype: Literal["int32"] = "int32"
    vocab_size: int = Field(description="rows of the target's LM head: every stored id is below it")
    computed: str = ARGMAX_COMPUTED


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
    teacher_argmax: ArgmaxInfo | None = Field(None, description="the per-token argmax the shards hold (none: a "
                                                                "format-1 store, extracted before eyas stored it)")
    shards: list[ShardInfo]


def write_shard(path: Path, index: int, samples: list[SampleFeatures], storage: StorageDtype, num_aux: int,
                vocab_size: int | None = None) -> ShardInfo:
    """Atomically write `samples` (in order) as one shard; return its manifest entry. With `vocab_size` (the
    target's LM-head rows) every sample carries its argmax, written as `argmax`; without, none does."""
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
    described = {"index": index, "storage_dtype": storage, "num_aux": num_aux}
    if vocab_size is not None:
        tensors["argmax"] = torch.cat([s.argmax for s in samples]).to(torch.int32)  # type: ignore[misc]  # [N]
        described["vocab_size"] = vocab_size
    metadata = {_METADATA_KEY: json.dumps(described, sort_keys=True)}
    tensors = {name: t.contiguous() for name, t in tensors.items()}
    write_atomic(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
    return ShardInfo(index=index, file=path.name, sha256=sha256_file(path), samples=len(samples),
                     tokens=int(lengths.sum()), bytes=path.stat().st_size, first_sample=samples[0].sample_id)


def _described(path: Path, metadata: dict[str, str] | None) -> tuple[StorageDtype, int | None]:
    """Return the storage dtype and the argmax's vocabulary size (None: no argmax) a shard's metadata records;
    refuses a shard without a storage dtype (not written by `write_shard`: its features could be any dtype)."""
    try:
        described = json.loads((metadata or {})[_METADATA_KEY])
        storage, vocab_size = described["storage_dtype"], described.get("vocab_size")
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError):
        storage, vocab_size = None, None
    if storage not in TORCH_STORAGE:
        raise EyasError(f"{path}: metadata: no {_METADATA_KEY} storage_dtype ({'/'.join(TORCH_STORAGE)}), so its "
                        "features cannot be read; not a shard written by `eyas extract` (extract the store again)")
    return storage, vocab_size if isinstance(vocab_size, int) and vocab_size > 0 else None


class FeatureShard:
    """Memory-mapped read access to one shard; features come back dequantized in float32."""

    def __init__(self, path: Path) -> None:
        """Open the shard `path`; refuses one that cannot be read (missing, truncated, not safetensors) or
        whose metadata does not record its storage dtype, in one line naming it. `vocab_size` is the
        target's, when the metadata describes an argmax (its `argmax` is then read with each sample)."""
        self.path = path
        with reading(path):
            self._file = safe_open(str(path), framework="pt")
            self.storage, self.vocab_size = _described(path, self._file.metadata())
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
        """Return the tensors of the shard's `position`-th sample (features in float32, `argmax` int32 when the
        shard holds one); refuses features holding a NaN or an infinity, and an argmax outside the target's
        vocabulary, naming the shard and the sample id."""
        start, stop = int(self.offsets[position]), int(self.offsets[position + 1])
        out = {}
        names = ("input_ids", "loss_mask", "aux", "last") + (("argmax",) if self.vocab_size is not None else ())
        with reading(self.path):
            for name in names:
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
        if "argmax" in out and bool(((out["argmax"] < 0) | (out["argmax"] >= self.vocab_size)).any()):
            raise EyasError(f"{self.path}: sample {int(self.sample_ids[position])}: argmax holds token ids outside "
                            f"the target's vocabulary 0..{self.vocab_size - 1}; extract the store again "
                            "(eyas extract --overwrite)")
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
    dtypes, an argmax missing or of another vocabulary than the manifest's `teacher_argmax` (or one it does
    not describe), sample ids other than the entry's consecutive samples, offsets not running from 0 to its
    tokens. Reads the header, `sample_ids` and `offsets` only."""
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
    problems += _argmax_problems(shard, info, manifest.teacher_argmax, header)
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


def _argmax_problems(shard: FeatureShard, info: ShardInfo, described: ArgmaxInfo | None,
                     header: dict[str, tuple[list[int], str]]) -> list[str]:
    """Return how a shard's `argmax` tensor and metadata differ from the manifest's description `described`."""
    path, held = shard.path, header.get("argmax")
    if described is None:
        return [] if held is None and shard.vocab_size is None else [
            f"{path}: argmax: in the shard, but the manifest describes none (a shard of another store?)"]
    if held is None:
        return [f"{path}: argmax: missing, but the manifest's teacher_argmax says every shard holds it"]
    problems = []
    if held != ([info.tokens], "I32"):
        problems.append(f"{path}: argmax: shape {held[0]} {held[1]} but the manifest implies [{info.tokens}] I32")
    if shard.vocab_size != described.vocab_size:
        held_vocab = "no vocabulary" if shard.vocab_size is None else f"a vocabulary of {shard.vocab_size}"
        problems.append(f"{path}: metadata: argmax over {held_vocab} but the manifest says {described.vocab_size}")
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
    shard missing, of another size, unreadable, or holding other tensors (an argmax missing, of another
    dtype or vocabulary, or one the manifest does not describe), sample ids or offsets than its entry
    lists (`shard_problems`: header, metadata, sample ids and offsets only); with `checksums`, also a
    shard whose sha256 is not the manifest's (each shard is read once more, on as many threads as there
    are cores: bench/store_open.py).
    Non-finite features and argmax ids outside the vocabulary are refused as each sample is read
    (`FeatureShard.sample`).
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
    """Return one problem per sample of the shard `path` that `FeatureShard.sample` refuses (features holding
    a NaN or an infinity, an argmax outside the vocabulary), or the one problem of a shard that cannot be read."""
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
    its entry (`shard_problems`: size, tensors and the argmax, sample ids, offsets), recomputes each
    sha256, and that every sample's features are finite and its argmax ids inside the vocabulary (one
    problem per sample that is not).
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
