"""The `eyas extract` stage: run the target over a prepared dataset and fill the feature store.

Samples are cut, in dataset order, into shards of about `shard_tokens` tokens (the plan depends
only on sample lengths). Within a shard, samples are batched longest-first under a padded-token
budget, so host and device memory grow with the budget and the shard size, never with the
dataset. Each sample also gets the target's full-vocabulary argmax, computed once here from its
`last` as stored (`eyas.models.argmax`), so that training never computes the full-vocabulary
logits. Shards are written atomically and recorded in a per-rank progress file; a killed run
resumes at the first unfinished shard and ends byte-identical to an uninterrupted run.
Under `torchrun`, rank r takes shards r, r+K, r+2K, ...; rank 0 merges the manifest.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from pydantic import BaseModel

from eyas import __version__
from eyas.config import ExtractConfig
from eyas.data.dataset import DatasetReader
from eyas.distributed import barrier, current_ranks, init_distributed, rank_device
from eyas.errors import ChecksFailed, EyasError
from eyas.features import store
from eyas.features.preflight import ExtractPlan, preflight_extract
from eyas.files import write_json_atomic
from eyas.precision import Precision, choose_dtype
from eyas.progress import stage_progress
from eyas.stage import Stage
from eyas.models.argmax import TargetArgmax
from eyas.models.capture import FeatureCapture
from eyas.models.head import head_of, load_target_head
from eyas.models.load import DTYPES, load_target

if TYPE_CHECKING:
    from eyas.backends.vllm.extractor import VllmFeatures

_PROGRESS = "progress-rank{rank}.json"


class _RankProgress(BaseModel):
    run_key: str
    shards: list[store.ShardInfo]
    backend: str | None = None  # what computed the shards so far
    vocab_size: int | None = None  # rows of the target's LM head, the shards' argmax ids are below it


def plan_shards(lengths: np.ndarray, shard_tokens: int) -> list[tuple[int, int]]:
    """Return contiguous `[start, stop)` sample ranges of about `shard_tokens` tokens each (at least one sample)."""
    ranges, start, tokens = [], 0, 0
    for index, length in enumerate(lengths.tolist()):
        if tokens and tokens + length > shard_tokens:
            ranges.append((start, index))
            start, tokens = index, 0
        tokens += length
    if start < len(lengths):
        ranges.append((start, len(lengths)))
    return ranges


def length_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Return batches of positions, longest first, each with `len(batch) * longest <= token_budget`
    (a sample longer than the budget runs alone)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for position in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= token_budget:
            batches[-1].append(position)
        else:
            batches.append([position])
    return batches


EXTRACT = Stage("extract", "an eyas feature store",
                ("shard-*.safetensors", "progress-rank*.json", store.MANIFEST, ".vllm-spool-*"),
                keyed=("progress-rank*.json", store.MANIFEST))


def _identities(plan: ExtractPlan) -> dict[str, object]:
    """Return what, besides the deciding config fields, decides the store's bytes."""
    return {"format_version": store.FORMAT_VERSION, "dataset": plan.dataset.fingerprint, "target": plan.target.id,
            "aux_ids": plan.aux_ids}


def right_padded(rows: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """Return `(input_ids [B, T] int64, attention_mask [B, T] int64)` for token rows, right-padded to the longest."""
    longest = max(len(ids) for ids in rows)
    input_ids = torch.zeros(len(rows), longest, dtype=torch.long)  # [B, T]
    attention = torch.zeros(len(rows), longest, dtype=torch.long)  # [B, T]
    for row, ids in enumerate(rows):
        input_ids[row, :len(ids)] = torch.from_numpy(ids.astype(np.int64))
        attention[row, :len(ids)] = 1
    return input_ids, attention


def sample_features(capture: FeatureCapture, reader: DatasetReader, indices: list[int], budget: int,
                    device: str) -> Iterator[tuple[int, store.SampleFeatures]]:
    """Yield `(tokens, features)` for the dataset rows `indices`, computed in length-sorted batches
    under the padded-token `budget` (in batch order, not in the order of `indices`)."""
    rows = [reader.row(i) for i in indices]
    lengths = [len(ids) for ids, _ in rows]
    first_device = device if device != "auto" else "cuda:0"  # device_map="auto" takes inputs on the first GPU
    for batch in length_batches(lengths, budget):
        input_ids, attention = right_padded([rows[position][0] for position in batch])
        captured = capture.run(input_ids.to(first_device), attention.to(first_device))
        for row, position in enumerate(batch):
            length = lengths[position]
            yield length, store.SampleFeatures(
                sample_id=indices[position],
                input_ids=torch.from_numpy(rows[position][0]),
                loss_mask=torch.from_numpy(rows[position][1].astype(bool)),
                aux=captured.aux[row, :length].cpu(),  # [T, A*H]
                last=captured.last[row, :length].cpu(),  # [T, H]
            )


def _engine_samples(engine: VllmFeatures, reader: DatasetReader, indices: list[int]
                    ) -> Iterator[tuple[int, store.SampleFeatures]]:
    """Yield `(tokens, sample)` for the dataset rows `indices` from a backend engine, in their order."""
    rows = [reader.row(i) for i in indices]
    where = [f"{reader.dir}: sample {i} (vLLM)" for i in indices]
    computed = engine.samples([ids for ids, _ in rows], where)
    for index, (ids, mask), (aux, last) in zip(indices, rows, computed, strict=True):
        yield len(ids), store.SampleFeatures(sample_id=index, input_ids=torch.from_numpy(ids),
                                             loss_mask=torch.from_numpy(mask.astype(bool)), aux=aux, last=last)


FeatureSource = Callable[[list[int]], Iterator[tuple[int, store.SampleFeatures]]]


@contextmanager
def _feature_source(config: ExtractConfig, plan: ExtractPlan, reader: DatasetReader,
                    device: str) -> Iterator[tuple[FeatureSource, str, TargetArgmax]]:
    """Load the target on `config.backend`; yield what computes the samples of dataset rows, the backend's
    description for the manifest (`hf`, `vllm VERSION (path)`) and the target's argmax head in the
    compute dtype (the loaded model's own head; beside vLLM, its tensors read once the engine holds its memory)."""
    if config.backend == "vllm":
        from eyas.backends.vllm.extractor import VllmFeatures

        with tempfile.TemporaryDirectory(dir=config.out, prefix=".vllm-spool-") as spool:
            engine = VllmFeatures(config.target, plan.aux_ids, plan.num_layers, Path(spool), config.dtype,
                                  config.tensor_parallel_size, int(reader.lengths().max()), config.trust_remote_code,
                                  config.model_impl)
            try:
                head = load_target_head(config.target, DTYPES[config.dtype], device, config.trust_remote_code)
                yield ((lambda indices: _engine_samples(engine, reader, indices)), engine.describe(),
                       TargetArgmax(head.final_norm, head.lm_head))
            finally:
                engine.close()
        return
    parts = load_target(config.target, DTYPES[config.dtype], device, config.trust_remote_code)
    head = head_of(parts)
    with FeatureCapture(parts, plan.aux_ids) as capture:
        yield ((lambda indices: sample_features(capture, reader, indices, config.token_budget, device)), "hf",
               TargetArgmax(head.final_norm, head.lm_head))


def with_argmax(features: store.SampleFeatures, argmax: TargetArgmax, storage: store.StorageDtype) -> store.SampleFeatures:
    """Return `features` with the target's argmax `[T]` (int32, CPU) of its `last` as a reader of a `storage`
    store gets it back, so the stored argmax is what `argmax` computes from the stored `last`."""
    features.argmax = argmax(store.as_read(features.last, storage, 1)).to(torch.int32).cpu()  # [T]
    return features


def _merge(config: ExtractConfig, plan: ExtractPlan, run_key: str, world: int, shard_count: int,
           backend: str, precision: Precision) -> store.StoreManifest:
    shards: list[store.ShardInfo] = []
    vocab_sizes = set()
    for rank in range(world):
        path = config.out / _PROGRESS.format(rank=rank)
        if path.is_file():
            progress = _RankProgress.model_validate_json(path.read_text(encoding="utf-8"))
            shards += progress.shards
            vocab_sizes |= {progress.vocab_size} if progress.shards else set()
    shards.sort(key=lambda s: s.index)
    if [s.index for s in shards] != list(range(shard_count)):
        raise EyasError(f"{config.out}: {shard_count - len(shards)} shard(s) unfinished; rerun the same command to resume")
    if len(vocab_sizes) != 1 or None in vocab_sizes:
        raise EyasError(f"{config.out}: the ranks' progress files record argmax vocabularies {sorted(map(str, vocab_sizes))}, "
                        "not one; extract the store again (--overwrite)")
    tokens = sum(s.tokens for s in shards)
    size = sum(s.bytes for s in shards)
    manifest = store.StoreManifest(
        eyas_version=__version__, run_key=run_key, target_path=str(config.target), target=plan.target,
        dataset_path=str(config.data), dataset_fingerprint=plan.dataset.fingerprint, layer_ids=plan.aux_ids,
        requested_layers={"ids": config.layers, "convention": config.layer_convention},
        num_layers=plan.num_layers, hidden_size=plan.hidden_size, storage_dtype=config.storage_dtype,
        compute_dtype=config.dtype, precision=precision.record(), backend=backend, samples=sum(s.samples for s in shards), tokens=tokens, bytes=size,
        bytes_per_token=round(size / max(tokens, 1), 2),
        teacher_argmax=store.ArgmaxInfo(vocab_size=vocab_sizes.pop()), shards=shards,
    )
    write_json_atomic(config.out / store.MANIFEST, manifest.model_dump(mode="json"))
    for rank in range(world):
        (config.out / _PROGRESS.format(rank=rank)).unlink(missing_ok=True)
    return manifest


def run_extract(config: ExtractConfig, plan: ExtractPlan | None = None) -> tuple[store.StoreManifest, bool]:
    """Extract (or resume, or reuse) the store in `config.out`; return its manifest and whether it was reused.

    Runs the weightless preflight first (unless `plan` is given; with preflight off, only the plan
    is resolved) and refuses to load weights when it finds any problem.
    """
    ranks = current_ranks()
    precision = choose_dtype(config.dtype, config.device, config.target)
    config = config.model_copy(update={"dtype": precision.dtype})
    if config.backend == "vllm":  # an engine this machine cannot run: exit 3 before any check or claim
        from eyas.backends.vllm.extractor import usable_path

        usable_path()
    plan = plan or preflight_extract(config, checks=config.preflight)
    if not plan.ok:
        raise ChecksFailed(f"preflight found {len(plan.problems)} problem(s): " + " | ".join(plan.problems))
    reader = DatasetReader(config.data)  # refuses a shard that cannot be read before anything is claimed
    init_distributed(ranks, plan.device)
    device = rank_device(ranks, plan.device)
    run_key = EXTRACT.claim(config, _identities(plan), (precision.note("dtype"),), primary=ranks.rank == 0).key
    if ranks.rank == 0:
        precision.announce("extract dtype")
    barrier(ranks)
    if (config.out / store.MANIFEST).is_file():  # claimed: a manifest left in place is this very run's
        return store.read_store_manifest(config.out), True

    spans = plan_shards(reader.lengths(), config.shard_tokens)
    progress_path = config.out / _PROGRESS.format(rank=ranks.rank)
    progress = (_RankProgress.model_validate_json(progress_path.read_text(encoding="utf-8"))
                if progress_path.is_file() else _RankProgress(run_key=run_key, shards=[]))
    done = {s.index for s in progress.shards}
    mine = [i for i in range(len(spans)) if i % ranks.world == ranks.rank and i not in done]
    backend = progress.backend or config.backend
    if mine:
        started, tokens_done, bytes_done = time.monotonic(), 0, 0
        with stage_progress() as bar, _feature_source(config, plan, reader, device) as (features_of, backend, argmax):
            progress.backend, progress.vocab_size = backend, argmax.vocab_size
            total = sum(spans[i][1] - spans[i][0] for i in mine)
            task = bar.add_task(f"extract (rank {ranks.rank})" if ranks.distributed else "extract", total=total, rate="")
            for index in mine:
                samples = []
                indices = list(range(*spans[index]))
                for tokens, features in features_of(indices):
                    samples.append(with_argmax(features, argmax, config.storage_dtype))
                    tokens_done += tokens
                    rate = tokens_done / max(time.monotonic() - started, 1e-9)
                    bar.update(task, advance=1, rate=f"{rate:,.0f} tok/s, {bytes_done / 2**20:,.0f} MiB written")
                samples.sort(key=lambda s: s.sample_id)
                info = store.write_shard(config.out / store.shard_name(index), index, samples,
                                         config.storage_dtype, len(plan.aux_ids), argmax.vocab_size)
                bytes_done += info.bytes
                progress.shards.append(info)
                write_json_atomic(progress_path, progress.model_dump(mode="json"))
    barrier(ranks)
    manifest = _merge(config, plan, run_key, ranks.world, len(spans), backend, precision) if ranks.rank == 0 else None
    barrier(ranks)
    if ranks.rank != 0:
        manifest = store.read_store_manifest(config.out)
    return manifest, False
