"""The `eyas prepare` stage: conversations -> tokenized, loss-masked Parquet dataset + vocabulary.

Input records are processed in fixed shards of `records_per_shard` records, in input order.
Each finished shard is renamed into place and then listed in `progress.json`, so a killed run
resumes at the first unfinished shard and produces the same bytes as an uninterrupted one.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from safetensors.numpy import load_file, save_file

from eyas import __version__
from eyas.config import PrepareConfig, recorded_section
from eyas.data import dataset as ds
from eyas.data.chat_tokens import ChatEncoder, Encoded
from eyas.data.records import Conversation, Document, Prompt, parse_record
from eyas.data.sources import RawRecord, count_records, expand_inputs, read_records
from eyas.data.vocab import CACHE_DIR, cached_draft_vocab, save_draft_vocab
from eyas.errors import EyasError, InputError
from eyas.files import reading, sha256_file, sha256_text, sha256_tree, write_atomic, write_json_atomic, write_text_atomic
from eyas.progress import stage_progress
from eyas.stage import Stage
from eyas.models.fingerprint import OTHER_VERSION, TargetFingerprint, target_fingerprint
from eyas.models.tokenizer import load_tokenizer, template_in_use, template_mismatch

MAX_SKIPPED_EXAMPLES = 20
Item = TypeVar("Item")


def _batched(items: Iterable[Item], size: int) -> Iterator[list[Item]]:
    iterator = iter(items)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


PREPARE = Stage("prepare", "an eyas dataset",
                ("data-*.parquet", "prompts-*.jsonl", ds.MANIFEST, ds.PROGRESS, ds.TOKEN_COUNTS, ds.VOCAB, CACHE_DIR),
                keyed=(ds.MANIFEST, ds.PROGRESS))


def _identities(target: TargetFingerprint, inputs: list[dict[str, str]]) -> dict[str, object]:
    """Return what, besides the deciding config fields, decides the dataset's bytes (not the paths)."""
    return {"format_version": ds.FORMAT_VERSION, "tokenizer": target.tokenizer, "chat_template": target.chat_template,
            "vocab_size": target.vocab_size, "inputs": [i["sha256"] for i in inputs]}


def recorded_template(out_dir: Path, stage: str) -> str | None:
    """Return how the `stage` run that wrote `out_dir` gave its chat template (`template_in_use`), from the
    config it recorded there; None when it recorded none that can be read."""
    section = recorded_section(out_dir, stage)
    if section is None:
        return None
    given = section.get("chat_template")
    return template_in_use(Path(given) if isinstance(given, str) else None)


def dataset_target_problem(dataset_dir: Path, manifest: ds.DatasetManifest, target: Path,
                           fingerprint: TargetFingerprint, chat_template: Path | None) -> str | None:
    """Return why the dataset in `dataset_dir` (its `manifest`) cannot feed a run on `target` that tokenizes as
    `fingerprint` (its `chat_template` applied), or None when it can. Another chat template alone is named
    (the dataset's, as its `eyas prepare` recorded it, and this run's) with the way out; another tokenizer
    or vocabulary asks for `eyas prepare` again."""
    if manifest.target.tokenization_matches(fingerprint):
        return None
    where = f"{dataset_dir / ds.MANIFEST}: target"
    mismatch = template_mismatch("the dataset", manifest.target, fingerprint, chat_template,
                                 recorded_template(dataset_dir, PREPARE.name))
    if mismatch is not None:
        return f"{where}: {mismatch}"
    if manifest.target.same_file_otherwise_hashed(fingerprint):
        return (f"{where}: {OTHER_VERSION} ({manifest.target_path}): the dataset is likely fine, but eyas cannot tell; "
                f"rerun `eyas prepare --target {target}`")
    return (f"{where}: the dataset was prepared for another tokenizer or chat template ({manifest.target_path}); "
            f"rerun `eyas prepare --target {target}`")


def _finished_part(out: Path) -> tuple[ds.DatasetManifest | None, list[ds.ShardStats]]:
    """Return (finished manifest or None, finished shards) of the run `out` holds."""
    manifest = ds.read_manifest(out) if (out / ds.MANIFEST).is_file() else None
    progress = ds.read_progress(out)
    return manifest, progress.shards if progress else []


class _ShardBuilder:
    """Turns one shard's raw records into encoded rows, prompts and counts."""

    def __init__(self, config: PrepareConfig, encoder: ChatEncoder) -> None:
        self.config = config
        self.encoder = encoder

    def _skip(self, stats: ds.ShardStats, error: InputError) -> None:
        if not self.config.skip_invalid:
            raise error
        stats.skipped[error.reason] = stats.skipped.get(error.reason, 0) + 1
        if len(stats.skipped_examples) < MAX_SKIPPED_EXAMPLES:
            stats.skipped_examples.append(str(error))

    def _encode(self, stats: ds.ShardStats, batch: list[Conversation | Document]) -> list[Encoded]:
        try:
            return self.encoder.encode(batch)
        except InputError:
            if not self.config.skip_invalid:
                raise
        encoded = []
        for record in batch:  # isolate the bad records of this batch
            try:
                encoded.extend(self.encoder.encode([record]))
            except InputError as error:
                self._skip(stats, error)
        return encoded

    def _finish_row(self, stats: ds.ShardStats, row: Encoded) -> Encoded | None:
        stats.reasoning_not_rendered += row.unrendered_reasoning
        limit = self.config.max_length
        if limit is not None and len(row.input_ids) > limit:
            stats.truncated += 1
            row = Encoded(row.source, row.input_ids[:limit], row.loss_mask[:limit])
        loss_tokens = int(row.loss_mask.sum())
        if loss_tokens == 0:
            stats.dropped_no_loss += 1
            return None
        stats.rows += 1
        stats.tokens += len(row.input_ids)
        stats.loss_tokens += loss_tokens
        return row

    def build(self, index: int, raw: list[RawRecord], on_batch: Callable[[int, int], None]) -> tuple[ds.ShardStats, list[Encoded], list[Prompt]]:
        """Return the stats, rows and prompts of shard `index`; `on_batch(records, tokens)` reports progress."""
        stats = ds.ShardStats(index=index, records=len(raw))
        rows: list[Encoded] = []
        prompts: list[Prompt] = []
        for batch_raw in _batched(raw, self.config.batch_size):
            trainable: list[Conversation | Document] = []
            for record in batch_raw:
                try:
                    if isinstance(record.value, InputError):
                        raise record.value
                    parsed = parse_record(record.source, record.value)
                except InputError as error:
                    self._skip(stats, error)
                    continue
                if isinstance(parsed, Prompt):
                    prompts.append(parsed)
                else:
                    trainable.append(parsed)
            tokens_before = stats.tokens
            for row in self._encode(stats, trainable) if trainable else []:
                if (finished := self._finish_row(stats, row)) is not None:
                    rows.append(finished)
            on_batch(len(batch_raw), stats.tokens - tokens_before)
        stats.prompts = len(prompts)
        return stats, rows, prompts


def _write_shard(out: Path, stats: ds.ShardStats, rows: list[Encoded], prompts: list[Prompt]) -> None:
    if rows:
        stats.data_file = ds.shard_name(stats.index, "data")
        ds.write_data_shard(out / stats.data_file, rows)
        stats.data_sha256 = sha256_file(out / stats.data_file)
    if prompts:
        stats.prompts_file = ds.shard_name(stats.index, "prompts")
        lines = "".join(json.dumps({"prompt": p.prompt, "source": p.source}, ensure_ascii=False) + "\n" for p in prompts)
        write_text_atomic(out / stats.prompts_file, lines)
        stats.prompts_sha256 = sha256_file(out / stats.prompts_file)


def _summed(shards: list[ds.ShardStats]) -> tuple[dict[str, int], dict[str, int], list[str]]:
    counts: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    examples: list[str] = []
    for shard in shards:
        for key in ("records", "rows", "prompts", "tokens", "loss_tokens", "truncated", "dropped_no_loss",
                    "reasoning_not_rendered"):
            counts[key] += getattr(shard, key)
        skipped.update(shard.skipped)
        examples.extend(shard.skipped_examples)
    counts["skipped"] = sum(skipped.values())
    return dict(counts), dict(sorted(skipped.items())), examples[:MAX_SKIPPED_EXAMPLES]


def _input_entry(path: Path) -> dict[str, str]:
    """Return an input's manifest entry, its path and sha256; refuses a file that cannot be read."""
    with reading(path):
        return {"path": str(path), "sha256": sha256_tree(path)}


def _nothing_usable(out: Path, counts: dict[str, int], max_length: int | None) -> EyasError:
    """Return the refusal of a run that kept no row and no prompt, saying where the records went."""
    went = [f"{counts.get('skipped', 0)} skipped as invalid"]
    if dropped := counts.get("dropped_no_loss", 0):
        within = f" within --max-length {max_length}" if max_length is not None else ""
        went.append(f"{dropped} dropped: no loss token{within}")
    return EyasError(f"{out}: no usable records in the inputs ({counts.get('records', 0)} read: {'; '.join(went)})")


def _attach_vocab(config: PrepareConfig, manifest: ds.DatasetManifest) -> ds.DatasetManifest:
    """Write `vocab.safetensors` for the configured size (cached per dataset fingerprint and size)."""
    size = config.draft_vocab_size
    if size is None:
        return manifest
    counts = load_file(str(config.out / ds.TOKEN_COUNTS))["counts"]
    vocab, _ = cached_draft_vocab(config.out, manifest.fingerprint, counts, size)
    save_draft_vocab(config.out / ds.VOCAB, vocab, manifest.fingerprint)
    return manifest.model_copy(update={"vocab": ds.VocabInfo(size=size, coverage=vocab.coverage, file=ds.VOCAB)})


def run_prepare(config: PrepareConfig) -> tuple[ds.DatasetManifest, bool]:
    """Prepare (or resume, or reuse) the dataset in `config.out`; return its manifest and whether it was reused.

    Raises EyasError/InputError for bad inputs before or during the run.
    """
    inputs_paths = expand_inputs(config.data)
    tokenizer = load_tokenizer(config.target, config.trust_remote_code, config.chat_template)
    target = target_fingerprint(config.target, tokenizer)
    inputs = [_input_entry(p) for p in inputs_paths]
    run = PREPARE.claim(config, _identities(target, inputs))
    run_key = run.key
    finished, done = _finished_part(config.out) if run.resumed else (None, [])
    if finished is not None:
        manifest = _attach_vocab(config, finished)
        write_json_atomic(config.out / ds.MANIFEST, manifest.model_dump(mode="json"))
        return manifest, True

    encoder = ChatEncoder(tokenizer, config.chat_template_kwargs, config.last_turn_only, str(config.target))
    builder = _ShardBuilder(config, encoder)
    total = sum(count_records(p) for p in inputs_paths)
    stream = itertools.chain.from_iterable(read_records(p) for p in inputs_paths)
    stream = itertools.islice(stream, len(done) * config.records_per_shard, None)
    progress_state = ds.Progress(run_key=run_key, shards=list(done))
    started, tokens_seen = time.monotonic(), 0
    with stage_progress() as bar:
        task = bar.add_task("prepare", total=total, completed=sum(s.records for s in done), rate="")

        def on_batch(records: int, tokens: int) -> None:
            nonlocal tokens_seen
            tokens_seen += tokens
            rate = tokens_seen / max(time.monotonic() - started, 1e-9)
            bar.update(task, advance=records, rate=f"{rate:,.0f} tok/s")

        for index, raw in enumerate(_batched(stream, config.records_per_shard), start=len(done)):
            stats, rows, prompts = builder.build(index, raw, on_batch)
            _write_shard(config.out, stats, rows, prompts)
            progress_state.shards.append(stats)
            write_json_atomic(config.out / ds.PROGRESS, progress_state.model_dump(mode="json"))

    shards = progress_state.shards
    counts, skipped, examples = _summed(shards)
    data_files = [s.data_file for s in shards if s.data_file]
    if counts.get("rows", 0) == 0 and counts.get("prompts", 0) == 0:
        raise _nothing_usable(config.out, counts, config.max_length)
    token_counts = ds.count_loss_tokens(config.out, data_files, target.vocab_size)
    write_atomic(config.out / ds.TOKEN_COUNTS, lambda tmp: save_file({"counts": token_counts}, str(tmp)))
    fingerprint = sha256_text(run_key + "".join(f"{s.data_sha256}{s.prompts_sha256}" for s in shards))
    manifest = ds.DatasetManifest(
        eyas_version=__version__, fingerprint=fingerprint, run_key=run_key, target_path=str(config.target),
        target=target, inputs=inputs, counts=counts, skipped=skipped, skipped_examples=examples, shards=shards,
    )
    manifest = _attach_vocab(config, manifest)
    write_json_atomic(config.out / ds.MANIFEST, manifest.model_dump(mode="json"))
    (config.out / ds.PROGRESS).unlink(missing_ok=True)
    return manifest, False
