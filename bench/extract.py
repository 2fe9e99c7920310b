"""Benchmark `eyas extract` against a bare forward of the target and the reference-trainer loop.

Everything runs in one process, on one randomly initialised Llama target built here (the tiny
offline tokenizer of `eyas.testing.tiny.build_tiny_target` plus a `LlamaForCausalLM` of the
sizes given by the flags; nothing is downloaded), on one dataset prepared here with
`run_prepare` from the synthetic OpenAI-format conversations of `bench/prepare.py`, truncated
to `--seq-len` (most samples end up at that length). The samples are cut into the batches
`run_extract` itself uses (`plan_shards` at the config's `shard_tokens`, then `length_batches`
at `--token-budget` within each shard, right-padded), and every timed loop below runs exactly
those batches:
- `eyas_capture_loop`: eyas's own capture loop (`_shard_features` of
  `eyas.features.extract`: read the rows, pad, `FeatureCapture.run`, slice each sample's
  aux [T, 3H] and last [T, H]); nothing is written. Compared with `bare_forward`:
- `bare_forward`: `parts.base(input_ids, attention_mask, use_cache=False)` under
  `torch.inference_mode`, no hooks, nothing kept: the floor for any capture through the
  base model. Goal: eyas_capture_loop >= 0.9x its tokens/s.
- `naive_output_hidden_states_torch_save`: the style of reference EAGLE trainers: the full
  CausalLM with `output_hidden_states=True` (so the full-vocabulary logits are computed too),
  then per sample the 3 auxiliary hidden states (concatenated) and `hidden_states[-1]`, copied
  (a copy: on CPU `.cpu()` is a no-op, and saving a view would serialise the whole batch)
  and cast to bfloat16, the dtype reference trainers store, and `torch.save`d one file per
  sample with the ids and loss mask. Model load is not timed and files are not fsynced.
- `eyas_run_extract_end_to_end`: `run_extract` into a fresh directory with bf16 storage,
  end to end: weightless preflight, model load, the capture loop, bf16 conversion, shard
  writes with fsync and sha256, manifest. Goal: >= 2x the naive loop's tokens/s (a
  conservative comparison: the naive loop is timed without its model load and fsyncs).
Tokens are real (unpadded) tokens. Each method is warmed up once (the loops on the first
batch; run_extract by a full fp8-storage run, which also gives the fp8 bytes/token), then
timed `--repeat` times in interleaved rounds (so load from other processes hits every method
alike) and the best time is reported. Bytes/token actually written are reported for eyas bf16
and fp8 storage (manifest `bytes_per_token`, next to `store.bytes_per_token`'s formula) and
for the naive per-sample files. Torch runs `--threads` intra-op threads (default 2). As noise
indicators, each line records the process CPU time of the best run (`cpu_seconds`; near
`threads * seconds` when the cores were free, near `seconds` when other work took one) and the
highest 1-minute load average seen after its timings (this process alone makes it ~`threads`).

Output: one JSON line per result on stdout (logs go to stderr), then the ratio lines
`eyas_vs_bare_forward` and `eyas_vs_naive`.

Run: `.venv/bin/python bench/extract.py` (defaults: --samples 256 --seq-len 512 --hidden 512
--layers 8 --dtype float32 --threads 2 --repeat 2); quick check: `--samples 32 --seq-len 256 --hidden 256`.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the target is local; never reach the network
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import json
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eyas.config import ExtractConfig, PrepareConfig
from eyas.data.dataset import DatasetReader
from eyas.data.prepare import run_prepare
from eyas.features import store
from eyas.features.extract import _shard_features, length_batches, plan_shards, run_extract
from eyas.target.capture import FeatureCapture
from eyas.target.load import DTYPES, load_target
from eyas.target.parts import TargetParts
from eyas.testing.tiny import build_tiny_target
from prepare import synthetic_conversations  # bench/prepare.py; bench/ is on sys.path when run as a script

SEED = 1234
Batch = tuple[torch.Tensor, torch.Tensor, list[int], list[int]]  # input_ids [B, T], mask [B, T], lengths, sample ids


def build_target(out: Path, hidden: int, layers: int, vocab: int | None) -> Path:
    """Write a Llama target to `out`: the tiny chatml tokenizer and random weights (fixed seed) of the given sizes.

    `vocab` (at least the tokenizer's) sets the LM head's rows; None keeps the tokenizer's padded size.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    build_tiny_target(out, "chatml", with_weights=False)
    vocab = vocab or json.loads((out / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    heads = max(1, hidden // 64)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(str(out))
    return out


def prepare_dataset(tmp: Path, target: Path, samples: int, seq_len: int) -> Path:
    """Prepare `samples` synthetic conversations truncated to `seq_len` tokens; return the dataset dir."""
    conversations = tmp / "conversations.jsonl"
    records = synthetic_conversations(samples, SEED)
    conversations.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    run_prepare(PrepareConfig(target=target, data=[conversations], out=tmp / "dataset", max_length=seq_len))
    return tmp / "dataset"


def padded_batches(reader: DatasetReader, shard_tokens: int, budget: int) -> list[Batch]:
    """Return run_extract's batches over `reader`: per shard, longest first under `budget`, right-padded."""
    batches = []
    for start, stop in plan_shards(reader.lengths(), shard_tokens):
        rows = [reader.row(i)[0] for i in range(start, stop)]
        lengths = [len(ids) for ids in rows]
        for batch in length_batches(lengths, budget):
            input_ids = torch.zeros(len(batch), lengths[batch[0]], dtype=torch.long)  # [B, T]
            attention = torch.zeros(len(batch), lengths[batch[0]], dtype=torch.long)  # [B, T]
            for row, position in enumerate(batch):
                input_ids[row, :lengths[position]] = torch.from_numpy(rows[position].astype(np.int64))
                attention[row, :lengths[position]] = 1
            batches.append((input_ids, attention, [lengths[p] for p in batch], [start + p for p in batch]))
    return batches


def capture_loop(parts: TargetParts, aux_ids: list[int], reader: DatasetReader, spans: list[tuple[int, int]],
                 budget: int) -> int:
    """Run eyas's capture loop (hooks on) over every shard span; return the tokens captured."""
    with FeatureCapture(parts, aux_ids) as capture:
        return sum(tokens for span in spans for tokens, _ in _shard_features(capture, reader, span, budget, "cpu"))


@torch.inference_mode()
def bare_forward(parts: TargetParts, batches: list[Batch]) -> int:
    """Run the base model over `batches`, keeping nothing; return the real tokens."""
    for input_ids, attention, _, _ in batches:
        parts.base(input_ids=input_ids, attention_mask=attention, use_cache=False)
    return sum(sum(lengths) for _, _, lengths, _ in batches)


@torch.inference_mode()
def naive_loop(parts: TargetParts, batches: list[Batch], reader: DatasetReader, aux_ids: list[int], out: Path) -> int:
    """Full CausalLM with all hidden states, then one `torch.save` per sample into `out`; return the real tokens."""
    out.mkdir(parents=True, exist_ok=True)
    tokens = 0
    for input_ids, attention, lengths, sample_ids in batches:
        hidden = parts.model(input_ids=input_ids, attention_mask=attention, output_hidden_states=True).hidden_states
        for row, (length, sample_id) in enumerate(zip(lengths, sample_ids)):
            ids, mask = reader.row(sample_id)
            torch.save({
                "input_ids": torch.from_numpy(ids),  # [T]
                "loss_mask": torch.from_numpy(mask),  # [T]
                "hidden_state": torch.cat([hidden[k][row, :length] for k in aux_ids], dim=-1).to(torch.bfloat16),  # [T, 3H]
                "target": hidden[-1][row, :length].to(torch.bfloat16, copy=True),  # [T, H]
            }, out / f"data_{sample_id}.ckpt")
            tokens += length
    return tokens


def cpu_seconds() -> float:
    """Return the user + system CPU time of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=256, help="synthetic conversations to prepare")
    parser.add_argument("--seq-len", type=int, default=512, help="max_length of the prepared samples")
    parser.add_argument("--hidden", type=int, default=512, help="hidden size of the target (64 per head)")
    parser.add_argument("--layers", type=int, default=8, help="decoder layers of the target")
    parser.add_argument("--vocab", type=int, default=None,
                        help="vocabulary rows of the target (LM head size; default: the tiny tokenizer's, 512)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="dtype the target runs in")
    parser.add_argument("--token-budget", type=int, default=8192, help="padded tokens per forward batch")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--repeat", type=int, default=2, help="timed runs per method; the best is reported")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="eyas-bench-extract-") as tmp_name:
        tmp = Path(tmp_name)
        target = build_target(tmp / "target", args.hidden, args.layers, args.vocab)
        data = prepare_dataset(tmp, target, args.samples, args.seq_len)
        reader = DatasetReader(data)

        def config(storage: str, out: str) -> ExtractConfig:
            return ExtractConfig(target=target, data=data, out=tmp / out, dtype=args.dtype, device="cpu",
                                 storage_dtype=storage, token_budget=args.token_budget)

        shard_tokens = ExtractConfig.model_fields["shard_tokens"].default  # what run_extract uses here
        spans = plan_shards(reader.lengths(), shard_tokens)
        batches = padded_batches(reader, shard_tokens, args.token_budget)
        fp8_manifest, _ = run_extract(config("fp8", "store-fp8"))  # the warm-up of run_extract
        shutil.rmtree(tmp / "store-fp8")
        aux_ids = fp8_manifest.layer_ids
        common: dict[str, Any] = {
            "bench": "extract", "threads": torch.get_num_threads(), "dtype": args.dtype, "hidden": args.hidden,
            "layers": args.layers, "vocab": json.loads((target / "config.json").read_text(encoding="utf-8"))["vocab_size"],
            "samples": len(reader), "seq_len": args.seq_len, "token_budget": args.token_budget,
            "shard_tokens": shard_tokens, "batches": len(batches), "aux_ids": aux_ids, "repeat": args.repeat,
        }

        parts = load_target(target, DTYPES[args.dtype], "cpu")
        naive_bytes: list[int] = []
        bf16_manifests: list[store.StoreManifest] = []
        first = batches[0]
        with FeatureCapture(parts, aux_ids) as capture:
            capture.run(first[0], first[1])
        bare_forward(parts, [first])
        naive_loop(parts, [first], reader, aux_ids, tmp / "naive-warmup")

        def run_end_to_end(attempt: int) -> int:
            manifest, reused = run_extract(config("bf16", f"store-bf16-{attempt}"))
            assert not reused
            bf16_manifests.append(manifest)
            shutil.rmtree(tmp / f"store-bf16-{attempt}")
            return manifest.tokens

        def run_naive(attempt: int) -> int:
            out = tmp / f"naive-{attempt}"
            tokens = naive_loop(parts, batches, reader, aux_ids, out)
            naive_bytes.append(directory_bytes(out))
            shutil.rmtree(out)
            return tokens

        methods: dict[str, Callable[[int], int]] = {
            "eyas_run_extract_end_to_end": run_end_to_end,
            "eyas_capture_loop": lambda _: capture_loop(parts, aux_ids, reader, spans, args.token_budget),
            "bare_forward": lambda _: bare_forward(parts, batches),
            "naive_output_hidden_states_torch_save": run_naive,
        }
        best: dict[str, float] = dict.fromkeys(methods, float("inf"))
        cpu: dict[str, float] = {}
        tokens: dict[str, int] = {}
        load: dict[str, float] = {}
        for attempt in range(args.repeat):
            for method, run in methods.items():
                cpu_started, started = cpu_seconds(), time.perf_counter()
                tokens[method] = run(attempt)
                seconds = time.perf_counter() - started
                if seconds < best[method]:
                    best[method], cpu[method] = seconds, cpu_seconds() - cpu_started
                load[method] = max(load.get(method, 0.0), os.getloadavg()[0])

        assert len(set(tokens.values())) == 1, f"methods counted different tokens: {tokens}"
        rates = {method: tokens[method] / best[method] for method in methods}
        for method in methods:
            print(json.dumps({**common, "method": method, "tokens": tokens[method], "seconds": round(best[method], 3),
                              "tokens_per_s": round(rates[method], 1), "cpu_seconds": round(cpu[method], 3),
                              "max_loadavg_1m": round(load[method], 2)}),
                  flush=True)
        written = {"eyas_bf16": (bf16_manifests[0].bytes_per_token, store.bytes_per_token(args.hidden, len(aux_ids), "bf16")),
                   "eyas_fp8": (fp8_manifest.bytes_per_token, store.bytes_per_token(args.hidden, len(aux_ids), "fp8")),
                   "naive_torch_save_bf16": (round(naive_bytes[0] / tokens["bare_forward"], 2), None)}
        for method, (actual, formula) in written.items():
            print(json.dumps({**common, "metric": "bytes_per_token", "method": method, "bytes_per_token": actual,
                              "formula_bytes_per_token": formula}), flush=True)
        for metric, eyas, baseline, goal in (
            ("eyas_vs_bare_forward", "eyas_capture_loop", "bare_forward", 0.9),
            ("eyas_vs_naive", "eyas_run_extract_end_to_end", "naive_output_hidden_states_torch_save", 2.0),
        ):
            ratio = rates[eyas] / rates[baseline]
            print(json.dumps({**common, "metric": metric, "ratio": round(ratio, 3), "eyas": eyas, "baseline": baseline,
                              "goal": goal, "meets_goal": ratio >= goal}), flush=True)


if __name__ == "__main__":
    main()
