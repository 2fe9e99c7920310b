"""Benchmark training tokens/s against the target's vocabulary: 262,144 tokens (Gemma-3) vs 32,000, with the
target's full-vocabulary argmax read from the feature store (`stored`, eyas since store format 2) or
recomputed every micro-batch (`recomputed`, as eyas did before, and as a format-1 store's first epoch does).

What is timed is one whole training micro-batch as `eyas train` runs it (`_Trainer._objective`, backward,
optimizer step): the teacher (`TeacherHead(last, argmax)`: the draft-vocabulary logits, plus the
full-vocabulary argmax when none is given), the TTT unroll over `--steps` steps scored by `StepScorer`,
`weighted_objective(...).backward()`, then AdamW's step. The draft shape is the same for every vocabulary
(`bench/train.py`'s `draft_config`: hidden `--hidden`, heads of 128, draft vocabulary `--draft-vocab`); only
the target's vocabulary changes, i.e. the draft's frozen embedding, `t2d`, and the teacher's LM head
`[V, H]` (random, fixed seed). Batches are `bench/train.py`'s (`make_batch`: one packed row of `--seq` real
tokens of random documents, features random), each sample's argmax computed by the head when the batch
is made, as extraction stores it. Both modes of a vocabulary share one draft, head and optimizer.

Check: before timing, for each vocabulary, one micro-batch scored with the stored argmax and with the
recomputed one (no optimizer step between) must give the same objective, bit for bit (`same_objective`).

Timing: after one untimed micro-batch per configuration, `--repeats` rounds; in each round every
configuration runs one micro-batch of the round's batch (`SEED + round`), the order of the four
alternating between rounds (neighbouring runs see about the same machine). Reported per configuration:
tokens/s (all its tokens over all its seconds) and the median seconds per micro-batch with its range;
then, paired per round (`eyas.decode.paired`: median of per-round ratios, quartiles, range, pooled,
outliers, reliability): per mode, `slowdown` = tokens/s at 32,000 over tokens/s at 262,144 (the issue's
done-criterion: at most 1.5 with the stored argmax), and at each vocabulary `speedup` = stored over
recomputed tokens/s. One JSON line per configuration and per ratio on stdout; progress on stderr.

Run: `.venv/bin/python bench/train_vocab.py` (defaults: --vocabs 32000 262144 --hidden 640 (Gemma-3-270M's)
--draft-vocab 8192 --seq 1024 --steps 7 --repeats 5 --threads 1 --device cpu).
Quick check: `--vocabs 32000 65536 --hidden 256 --seq 256 --repeats 3`.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train as ttt  # noqa: E402  bench/train.py: the draft, head, batches and training step

from eyas.decode.paired import paired_speedup  # noqa: E402
from eyas.draft.attention import EagerTTTAttention  # noqa: E402
from eyas.draft.model import Eagle3Draft  # noqa: E402
from eyas.draft.objective import TeacherHead  # noqa: E402
from eyas.precision import machine_record  # noqa: E402
from eyas.train.batches import PackedBatch  # noqa: E402

MODES = ("stored", "recomputed")


class Setup:
    """One target vocabulary: the draft, the teacher head and the optimizer both modes share."""

    def __init__(self, args: argparse.Namespace, vocab: int, device: torch.device) -> None:
        self.vocab = vocab
        self.config = ttt.draft_config(argparse.Namespace(**{**vars(args), "target_vocab": vocab}), args.seq)
        self.draft, self.head = ttt.build(self.config, device)
        self.optimizer = torch.optim.AdamW([p for p in self.draft.parameters() if p.requires_grad], lr=1e-4,
                                           betas=(0.9, 0.95))
        self.device, self.steps = device, args.steps

    def batch(self, seq: int, seed: int) -> PackedBatch:
        return ttt.make_batch(self.config, seq, seed, self.head).to(self.device)

    def objective(self, batch: PackedBatch, mode: str) -> float:
        """Run the trainer's work for one micro-batch but the optimizer step: teacher, unroll, loss, backward."""
        teacher = self.head(batch.last, batch.argmax if mode == "stored" else None)
        return ttt.train_step(self.draft, EagerTTTAttention, batch, teacher, self.steps)

    def timed_step(self, batch: PackedBatch, mode: str) -> tuple[float, float]:
        """Return (seconds, CPU seconds) of one whole training micro-batch, the optimizer step included."""
        synchronize(self.device)
        cpu, started = ttt.cpu_seconds(), time.perf_counter()
        self.objective(batch, mode)
        self.optimizer.step()
        synchronize(self.device)
        return time.perf_counter() - started, ttt.cpu_seconds() - cpu


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def same_objective(setup: Setup, batch: PackedBatch) -> bool:
    """Return whether the stored and the recomputed argmax give the same objective on `batch`, bit for bit."""
    return setup.objective(batch, "stored") == setup.objective(batch, "recomputed")


def configuration_line(vocab: int, mode: str, runs: list[dict[str, float]]) -> dict[str, Any]:
    seconds = [run["seconds"] for run in runs]
    tokens = sum(run["tokens"] for run in runs)
    return {"bench": "train_vocab", "metric": "tokens_per_s", "target_vocab": vocab, "argmax": mode,
            "tokens_per_s": round(tokens / sum(seconds), 1), "seconds_median": round(statistics.median(seconds), 3),
            "seconds_range": [round(min(seconds), 3), round(max(seconds), 3)], "tokens": tokens,
            "cpu_seconds": round(sum(run["cpu_seconds"] for run in runs), 2)}


def ratio_line(name: str, baseline: list[dict[str, float]], candidate: list[dict[str, float]],
               fields: dict[str, Any]) -> dict[str, Any]:
    paired = paired_speedup([(run["tokens"], run["seconds"]) for run in baseline],
                            [(run["tokens"], run["seconds"]) for run in candidate], unit="rounds")
    return {"bench": "train_vocab", "metric": name, **fields, **paired.fields(name)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocabs", type=int, nargs=2, default=[32000, 262144],
                        help="the baseline target vocabulary, then the large one")
    parser.add_argument("--hidden", type=int, default=640, help="draft (and target) hidden size; heads of 128")
    parser.add_argument("--intermediate", type=int, default=None, help="MLP width (default hidden * 11 / 4)")
    parser.add_argument("--draft-vocab", type=int, default=8192, help="draft vocabulary (LM head rows)")
    parser.add_argument("--seq", type=int, default=1024, help="real tokens per micro-batch (one packed row)")
    parser.add_argument("--steps", type=int, default=7, help="TTT steps")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (each runs every configuration once)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:n]")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    small, large = args.vocabs
    setups = {vocab: Setup(args, vocab, device) for vocab in (small, large)}
    checks = {vocab: same_objective(setup, setup.batch(args.seq, ttt.SEED - 2)) for vocab, setup in setups.items()}
    assert all(checks.values()), f"the stored and the recomputed argmax score differently: {checks}"
    configurations = [(vocab, mode) for vocab in (small, large) for mode in MODES]
    for vocab, mode in configurations:  # warm-up
        setups[vocab].timed_step(setups[vocab].batch(ttt.WARM_UP_TOKENS, ttt.SEED - 1), mode)
    runs: dict[tuple[int, str], list[dict[str, float]]] = {c: [] for c in configurations}
    loads = []
    for round_ in range(args.repeats):
        order = configurations if round_ % 2 == 0 else configurations[::-1]
        batches = {vocab: setup.batch(args.seq, ttt.SEED + round_) for vocab, setup in setups.items()}
        for vocab, mode in order:
            seconds, cpu = setups[vocab].timed_step(batches[vocab], mode)
            runs[(vocab, mode)].append({"tokens": batches[vocab].tokens, "seconds": seconds, "cpu_seconds": cpu})
            loads.append(os.getloadavg()[0])
            print(f"round {round_ + 1}/{args.repeats} vocab {vocab} {mode}: {seconds:.2f}s (cpu {cpu:.1f}s)",
                  file=sys.stderr, flush=True)
    config = setups[small].config
    common = {"seq": args.seq, "steps": args.steps, "hidden": config.hidden_size, "heads": config.num_attention_heads,
              "kv_heads": config.num_key_value_heads, "intermediate": config.intermediate_size,
              "draft_vocab": config.draft_vocab_size, "repeats": args.repeats, "dtype": "float32",
              "same_objective": checks, "max_loadavg_1m": round(max(loads), 2), "threads": args.threads,
              **machine_record(), "device": str(device),
              "timing": "one micro-batch (teacher, unroll, backward, AdamW step) per configuration per round; "
                        "rounds interleaved, order alternating"}
    for vocab, mode in configurations:
        print(json.dumps({**configuration_line(vocab, mode, runs[(vocab, mode)]), **common}), flush=True)
    for mode in MODES:
        print(json.dumps({**ratio_line("slowdown", runs[(large, mode)], runs[(small, mode)],
                                       {"argmax": mode, "target_vocab": large, "baseline_vocab": small}),
                          **common}), flush=True)
    for vocab in (small, large):
        print(json.dumps({**ratio_line("speedup", runs[(vocab, "recomputed")], runs[(vocab, "stored")],
                                       {"target_vocab": vocab, "candidate": "stored", "baseline": "recomputed"}),
                          **common}), flush=True)


if __name__ == "__main__":
    main()
