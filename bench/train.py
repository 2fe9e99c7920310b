"""Benchmark the training step of eyas's TTT unroll against a naive concatenated-keys TTT.

Both variants run the training step `eyas train` runs per micro-batch (`Trainer._scores` and
`backward` in `eyas.train.loop`): `eyas.draft.ttt.unroll` over `--steps` TTT steps (default 7),
each step's logits scored by `eyas.draft.objective.StepScorer` against the teacher,
`weighted_objective(losses).backward()`. They use the same draft (`Eagle3Draft`, random weights
from a fixed seed), the same batches and the same teacher; the only difference is the attention
object given to `unroll` (its `attention` argument):

- `eyas`: `eyas.draft.attention.EagerTTTAttention`, eyas's CPU attention: SDPA at step 0; at
  step j the step-0 scores `[T, T]` (causal-document mask) joined with j diagonal scores
  `q_t . k_i[t]`, one softmax over `T + j` columns.
- `naive`: `NaiveTTTAttention` below, the style of community EAGLE-3 trainers that keep a
  growing key/value cache: at step j the keys and values of all steps so far are concatenated
  to `[B, kv, (j+1)T, d]` (repeated to the query heads), a dense additive float mask
  `[B, 1, T, (j+1)T]` is built (block 0: causal within the document; block i >= 1: 0 on the
  diagonal, -inf elsewhere, so query t sees only its own position of step i), and attention is
  eager: `softmax(q K^T * scale + mask) V` with the whole `[B, h, T, (j+1)T]` score matrix
  materialised (softmax in float32, as in transformers' eager attention). The draft layer
  runs over the full sequence at every step, exactly as in eyas's unroll.

Batches: one row (`B = 1`) of exactly `--seq` real tokens, packed through eyas's `collate` from
synthetic documents of random lengths (one eighth to one half of the row; the last is cut to
fit), so `doc_ids` and `position_ids` restart per document as in training; the loss mask leaves
out the first fifth of each document. Tokens, `aux [T, 3H]` and `last [T, H]` are random. The
teacher (`TeacherHead` over a random `[target_vocab, H]` LM head; the draft vocabulary is a
random subset of the target's; each sample's full-vocabulary argmax computed by the head when the
batch is made, as a feature store holds it) is computed before the timed step: it is the same work
for both variants, as is the optimizer step, which is not run. `bench/train_vocab.py` times the
teacher and the optimizer step too, across target vocabularies.

Every timed step runs in a fresh subprocess of this script (`--run`), so both variants start
from the same state and each run gets an honest peak-memory figure: the subprocess builds the
draft and batch `i` (fixed seeds; the weights' checksum must agree across all runs), runs one
warm-up step of the same variant on a 64-token batch, returns freed heap memory to the OS
(`malloc_trim`), then times one forward + backward on batch `i`. The runs of a configuration
are interleaved batch by batch, the order alternating (eyas first on even batches): on the
2-core VM this was written on, other load changes whole passes a lot while neighbouring runs
see about the same machine. Batch 0 is also the check that both variants compute the same
function: their losses must agree (`torch.allclose`, rtol 1e-5) and every parameter gradient
within 1e-3 of its largest entry (reported as `max_grad_rel_diff`).

Reported per configuration: tokens/s = real tokens / summed seconds of each variant;
`speedup` = the median over batches of eyas tokens/s / naive tokens/s on the same batch
(`eyas.decode.paired`: with `speedup_quartiles`, `speedup_range`, `speedup_pooled` = the summed
tokens/s ratio, `speedup_outliers` and `speedup_reliable`); `speedup_per_batch` (the spread is the noise);
`cpu_seconds` of the timed steps (near `threads * seconds` when the cores were free, lower when
other work held them) and the highest 1-minute load average seen (this bench alone makes it
about `threads`).

Peak memory (`eyas_peak_mib`, `naive_peak_mib`; the larger over the configuration's runs). CPU:
torch's CPU allocations are invisible to tracemalloc, so the subprocess resets its resident-set
high-water mark just before the timed step (`/proc/self/clear_refs` <- 5, Linux), reads its RSS,
and after the step reads the high-water mark (`VmHWM`): peak = VmHWM - RSS before, the most
extra resident memory the step needed at any moment (activations and tensors saved for
backward, temporaries such as masks and score matrices, the parameter gradients, and whatever
the allocator kept of freed memory during the step), in MiB. CUDA: `max_memory_allocated()`
after `reset_peak_memory_stats()`, minus `memory_allocated()` before the step.

Output: one JSON line per configuration on stdout (progress goes to stderr). Torch runs
`--threads` intra-op threads (default 2; stated in every line). Float32 throughout. On a shared
machine, use `--threads 1` when other work holds a core: with 2 intra-op threads on 2 cores, one
of them busy elsewhere, every parallel op waits for the descheduled thread; on the 2-core VM this
was written on, a 64-token step of a hidden-256 draft then took 4.5 s instead of 0.09 s (1 thread,
same minute), so such timings measure the scheduler, not the code.

Run: `.venv/bin/python bench/train.py` (defaults: --hidden 1024 (8 heads of 128, 2 kv heads,
intermediate 2816) --draft-vocab 8192 --target-vocab 32000 --seq 512 2048 --steps 7
--repeats 2 --threads 2 --device cpu); `--repeats` takes one value or one per `--seq`.
Quick check: `--hidden 256 --seq 256 --repeats 2`.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded

import argparse
import ctypes
import gc
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from eyas.draft.attention import AttentionFactory, EagerTTTAttention, causal_document_mask
from eyas.draft.config import DraftConfig
from eyas.decode.paired import paired_speedup
from eyas.draft.model import Eagle3Draft
from eyas.precision import machine_record
from eyas.draft.objective import StepScorer, Teacher, TeacherHead, weighted_objective
from eyas.draft.ttt import unroll
from eyas.train.batches import PackedBatch, collate

SEED = 1234
NUM_AUX = 3
HEAD_DIM = 128
WARM_UP_TOKENS = 64


class NaiveTTTAttention:
    """Concatenated keys/values of all steps and a dense `[T, (j+1)T]` additive mask, rebuilt every step.

    Same call protocol as `EagerTTTAttention`: built with `doc_ids [B, T]`, called with queries
    `q [B, h, T, d]` and the per-step `keys`/`values` (lists of `[B, kv, T, d]`).
    """

    def __init__(self, doc_ids: torch.Tensor) -> None:
        self.causal = causal_document_mask(doc_ids)  # [B, 1, T, T] bool

    def mask(self, blocks: int, dtype: torch.dtype) -> torch.Tensor:
        """Return the additive `[B, 1, T, blocks*T]` mask: causal-document block, `blocks-1` identity blocks."""
        B, _, T, _ = self.causal.shape
        zero = torch.zeros((), dtype=dtype, device=self.causal.device)
        minus_inf = torch.tensor(float("-inf"), dtype=dtype, device=self.causal.device)
        first = torch.where(self.causal, zero, minus_inf)  # [B, 1, T, T]
        eye = torch.eye(T, dtype=torch.bool, device=self.causal.device)
        diagonal = torch.where(eye, zero, minus_inf).expand(B, 1, T, T)  # [B, 1, T, T]
        return torch.cat([first] + [diagonal] * (blocks - 1), dim=-1)  # [B, 1, T, blocks*T]

    def __call__(self, q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
        heads = q.shape[1]
        k = torch.cat(keys, dim=2).repeat_interleave(heads // keys[0].shape[1], dim=1)  # [B, h, (j+1)T, d]
        v = torch.cat(values, dim=2).repeat_interleave(heads // values[0].shape[1], dim=1)  # [B, h, (j+1)T, d]
        scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5 + self.mask(len(keys), q.dtype)  # [B, h, T, (j+1)T]
        probs = scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype)
        return probs @ v  # [B, h, T, d]


VARIANTS: dict[str, AttentionFactory] = {"eyas": EagerTTTAttention, "naive": NaiveTTTAttention}


def draft_config(args: argparse.Namespace, seq: int) -> DraftConfig:
    heads = max(1, args.hidden // HEAD_DIM)
    return DraftConfig(
        hidden_size=args.hidden, target_hidden_size=args.hidden,
        intermediate_size=args.intermediate or args.hidden * 11 // 4, num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 4), head_dim=HEAD_DIM, max_position_embeddings=max(4096, seq + args.steps),
        vocab_size=args.target_vocab, draft_vocab_size=args.draft_vocab, aux_layer_ids=list(range(1, NUM_AUX + 1)),
    )


def build(config: DraftConfig, device: torch.device) -> tuple[Eagle3Draft, TeacherHead]:
    """Return the random draft (fixed seed; random draft vocabulary) and a random teacher head."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    generator = torch.Generator().manual_seed(SEED)
    torch.manual_seed(SEED)
    draft = Eagle3Draft(config)
    token_ids = torch.randperm(config.vocab_size, generator=generator)[: config.draft_vocab_size].sort().values  # [N]
    with torch.no_grad():
        draft.d2t.copy_(token_ids - torch.arange(config.draft_vocab_size))
        draft.t2d.zero_()
        draft.t2d[token_ids] = True
    lm_head = torch.randn(config.vocab_size, config.hidden_size, generator=generator) * config.hidden_size ** -0.5
    head = TeacherHead(LlamaRMSNorm(config.hidden_size), lm_head, token_ids)
    return draft.to(device), head.to(device)


def make_batch(config: DraftConfig, seq: int, seed: int, head: TeacherHead) -> PackedBatch:
    """Return one fully packed row of `seq` tokens: random documents, tokens and features (see the docstring),
    each sample's argmax the one `head` computes from its `last`, as a feature store holds it."""
    generator = torch.Generator().manual_seed(seed)
    samples, left = [], seq
    while left > 0:
        length = min(left, int(torch.randint(max(1, seq // 8), max(2, seq // 2) + 1, (1,), generator=generator)))
        mask = torch.ones(length, dtype=torch.bool)
        mask[: length // 5] = False
        last = torch.randn(length, config.target_hidden_size, generator=generator)  # [T, H]
        samples.append({
            "input_ids": torch.randint(0, config.vocab_size, (length,), generator=generator),
            "loss_mask": mask,
            "aux": torch.randn(length, NUM_AUX * config.target_hidden_size, generator=generator),
            "last": last,
            "argmax": head.target_argmax(last).cpu(),  # [T]
        })
        left -= length
    return collate([samples])


def train_step(draft: Eagle3Draft, attention: AttentionFactory, batch: PackedBatch, teacher: Teacher,
               steps: int) -> float:
    """Run the trainer's forward + backward of one micro-batch (no optimizer step); return the objective."""
    draft.zero_grad(set_to_none=True)
    scorer = StepScorer(teacher, batch.doc_ids, batch.loss_mask, draft.d2t, draft.t2d, steps)
    logits = unroll(draft, batch.aux, batch.input_ids, batch.position_ids, batch.doc_ids, steps, attention)
    objective = weighted_objective([scorer.score(j, step_logits) for j, step_logits in enumerate(logits)])
    objective.backward()
    return objective.item()


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def status_kib(field: str) -> int:
    """Return a `/proc/self/status` field in KiB (`VmRSS`, `VmHWM`)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def one_run(args: argparse.Namespace) -> None:
    """Subprocess mode: warm up, then time one training step of `args.run` on batch `args.batch`; print JSON."""
    device = torch.device(args.device)
    seq = args.seq[0]
    config = draft_config(args, seq)
    draft, head = build(config, device)
    attention = VARIANTS[args.run]
    warm_up = make_batch(config, min(seq, WARM_UP_TOKENS), SEED - 1, head).to(device)
    train_step(draft, attention, warm_up, head(warm_up.last, warm_up.argmax), args.steps)
    batch = make_batch(config, seq, SEED + args.batch, head).to(device)
    teacher = head(batch.last, batch.argmax)
    draft.zero_grad(set_to_none=True)
    del warm_up
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        allocated = torch.cuda.memory_allocated(device)
    else:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed heap memory back to the OS: reusing it must show in RSS
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := current RSS
        before = status_kib("VmRSS")

    cpu_started, started = cpu_seconds(), time.perf_counter()
    loss = train_step(draft, attention, batch, teacher, args.steps)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu_started

    if device.type == "cuda":
        peak_bytes = torch.cuda.max_memory_allocated(device) - allocated
    else:
        peak_bytes = (status_kib("VmHWM") - before) * 1024
    if args.grads:
        torch.save({name: p.grad for name, p in draft.named_parameters() if p.grad is not None}, args.grads)
    print(json.dumps({
        "seconds": seconds, "cpu_seconds": cpu, "peak_mib": round(peak_bytes / 2**20, 1), "loss": loss,
        "tokens": batch.tokens, "loadavg_1m": os.getloadavg()[0],
        "weights_checksum": float(sum(p.detach().double().abs().sum() for p in draft.parameters())),
    }), flush=True)


def subprocess_run(args: argparse.Namespace, seq: int, variant: str, batch: int, grads: Path | None) -> dict[str, Any]:
    """Return the result of one timed step of `variant` on batch `batch`, run in a fresh process."""
    command = [sys.executable, __file__, "--run", variant, "--batch", str(batch), "--seq", str(seq),
               "--hidden", str(args.hidden), "--draft-vocab", str(args.draft_vocab), "--target-vocab",
               str(args.target_vocab), "--steps", str(args.steps), "--threads", str(args.threads),
               "--device", args.device]
    if args.intermediate:
        command += ["--intermediate", str(args.intermediate)]
    if grads:
        command += ["--grads", str(grads)]
    done = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def max_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Return the largest |a - b| of any parameter's gradient, relative to that gradient's largest |a|."""
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max(float((a[n] - b[n]).abs().max() / a[n].abs().max().clamp_min(1e-30)) for n in a)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def bench_config(args: argparse.Namespace, seq: int, repeats: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="eyas-bench-train-") as tmp:
        for index in range(repeats):
            order = list(VARIANTS) if index % 2 == 0 else list(reversed(VARIANTS))
            for variant in order:
                run = subprocess_run(args, seq, variant, index, Path(tmp) / f"{variant}.pt" if index == 0 else None)
                runs[variant].append(run)
                log(f"seq {seq}: batch {index + 1}/{repeats} {variant}: {run['seconds']:.2f}s "
                    f"(cpu {run['cpu_seconds']:.1f}s), peak {run['peak_mib']} MiB, loss {run['loss']:.6f}")
            if index == 0:  # the check: same weights, same loss, same gradients on the first batch
                checksums = {run["weights_checksum"] for variant_runs in runs.values() for run in variant_runs}
                assert len(checksums) == 1, f"the runs built different weights: {checksums}"
                losses = {variant: runs[variant][0]["loss"] for variant in VARIANTS}
                assert torch.allclose(torch.tensor(losses["eyas"]), torch.tensor(losses["naive"]), rtol=1e-5), losses
                grad_diff = max_relative_difference(torch.load(Path(tmp) / "eyas.pt"),
                                                    torch.load(Path(tmp) / "naive.pt"))
                assert grad_diff < 1e-3, f"gradients differ: max relative difference {grad_diff}"
    assert len({run["weights_checksum"] for variant_runs in runs.values() for run in variant_runs}) == 1

    config = draft_config(args, seq)
    tokens = sum(run["tokens"] for run in runs["eyas"])
    assert tokens == sum(run["tokens"] for run in runs["naive"]) == seq * repeats
    seconds = {variant: sum(run["seconds"] for run in runs[variant]) for variant in VARIANTS}
    rates = {variant: tokens / seconds[variant] for variant in VARIANTS}
    ratios = [n["seconds"] / e["seconds"] for e, n in zip(runs["eyas"], runs["naive"])]
    device = torch.device(args.device)
    return {
        "bench": "train_ttt", "seq": seq, "rows": 1, "steps": args.steps, "hidden": config.hidden_size,
        "heads": config.num_attention_heads, "kv_heads": config.num_key_value_heads, "head_dim": config.head_dim,
        "intermediate": config.intermediate_size, "draft_vocab": config.draft_vocab_size,
        "target_vocab": config.vocab_size, "dtype": "float32", "batches": repeats, "tokens": tokens,
        "eyas_seconds": round(seconds["eyas"], 3), "naive_seconds": round(seconds["naive"], 3),
        "eyas_tokens_per_s": round(rates["eyas"], 1), "naive_tokens_per_s": round(rates["naive"], 1),
        **paired_speedup([(run["tokens"], run["seconds"]) for run in runs["naive"]],
                         [(run["tokens"], run["seconds"]) for run in runs["eyas"]], unit="batches").fields("speedup"),
        "speedup_per_batch": [round(r, 3) for r in ratios],
        "eyas_peak_mib": max(run["peak_mib"] for run in runs["eyas"]),
        "naive_peak_mib": max(run["peak_mib"] for run in runs["naive"]),
        "peak_memory": ("cuda max_memory_allocated minus allocated before the step" if device.type == "cuda" else
                        "RSS high-water mark during one step minus RSS before it, fresh process per run"),
        "loss_eyas": losses["eyas"], "loss_naive": losses["naive"], "max_grad_rel_diff": grad_diff,
        "eyas_cpu_seconds": round(sum(run["cpu_seconds"] for run in runs["eyas"]), 2),
        "naive_cpu_seconds": round(sum(run["cpu_seconds"] for run in runs["naive"]), 2),
        "max_loadavg_1m": round(max(run["loadavg_1m"] for variant_runs in runs.values() for run in variant_runs), 2),
        "timing": "one step per variant per batch, each in a fresh process after a warm-up; "
                  "interleaved, order alternating",
        "threads": args.threads, **machine_record(), "device": str(device),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024, help="draft (and target) hidden size; heads of 128")
    parser.add_argument("--intermediate", type=int, default=None, help="MLP width (default hidden * 11 / 4)")
    parser.add_argument("--draft-vocab", type=int, default=8192, help="draft vocabulary (LM head rows)")
    parser.add_argument("--target-vocab", type=int, default=32000, help="target vocabulary (embedding, teacher head)")
    parser.add_argument("--seq", type=int, nargs="+", default=[512, 2048], help="row lengths, one configuration each")
    parser.add_argument("--steps", type=int, default=7, help="TTT steps")
    parser.add_argument("--repeats", type=int, nargs="+", default=[2],
                        help="timed batches per configuration: one value, or one per --seq")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:n]")
    parser.add_argument("--run", choices=sorted(VARIANTS), help=argparse.SUPPRESS)  # internal: one timed step
    parser.add_argument("--batch", type=int, default=0, help=argparse.SUPPRESS)  # internal: its batch
    parser.add_argument("--grads", type=Path, help=argparse.SUPPRESS)  # internal: where it saves its gradients
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.run:
        one_run(args)
        return
    repeats = args.repeats * len(args.seq) if len(args.repeats) == 1 else args.repeats
    if len(repeats) != len(args.seq) or min(repeats) < 1:
        parser.error("--repeats: give one positive value, or one per --seq")
    for seq, count in zip(args.seq, repeats):
        print(json.dumps(bench_config(args, seq, count)), flush=True)


if __name__ == "__main__":
    main()
