"""The spread of the learned tiny pair's quality across seeds and CPU kernel families, and the margin
the learning and decoding tests' thresholds keep from it.

The tests (tests/train/test_learning.py, tests/decode/test_decoder.py) assert learned qualities of
`eyas.testing.learned.build_learned_pair`: held-out step-0 accuracy, the trainer's implied tau and
the decoder's tau per shape. Their floating-point results differ between kernel families
(`ATEN_CPU_CAPABILITY=default|avx2|avx512`) and machines; this script measures that spread, and the
larger spread over seeds, so that each threshold sits below every working pair by a stated margin
and above an untrained draft (the power of the check).

Each (kernel, seed) pair is built in its own process (the kernel family is read at torch import),
with one torch thread. Prints one JSON line per pair and one per metric: min, max, mean and standard
deviation over all pairs, the largest difference between kernel families at one seed, the test's
threshold and its margin below the weakest pair (also in units of that kernel difference), and the
best untrained draft's value. The baseline of the same run is the untrained draft.

    .venv/bin/python bench/learned_spread.py --kernels default,avx2 --seeds 0,1,2 > spread.jsonl
    .venv/bin/python bench/learned_spread.py --from spread.jsonl    # the summary lines again
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# The thresholds of the tests (kept in step by hand: the tests import nothing from bench/).
THRESHOLDS = {"accuracy": 0.6, "accuracy_over_unigram": 0.4, "implied_tau": 2.0, "tau_chain_1": 1.3, "tau_deeper": 1.35}


def measure(seed: int) -> dict[str, object]:
    """Build the pair for `seed` in a temporary directory; return its figures (and the untrained draft's)."""
    import torch

    from eyas.precision import machine_record
    from eyas.testing.learned import DECODE_SHAPES, build_learned_pair, draft_accuracy, greedy_rounds

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:
        pair = build_learned_pair(Path(root), seed=seed)
        accuracy, unigram = draft_accuracy(pair)
        lines = [json.loads(line) for line in (pair["run"] / "metrics.jsonl").read_text().splitlines()]
        final_eval = [m for m in lines if m["split"] == "eval"][-1]
        taus, untrained = {}, {}
        for shape in DECODE_SHAPES:
            depth, top_k, total, chain = shape
            name = f"chain_{depth}" if chain else f"tree_{depth}_{top_k}_{total}"
            for into, weights in ((taus, True), (untrained, False)):
                rounds = greedy_rounds(pair["target"], pair["run"] / "final", shape, draft_weights=weights)
                into[name] = 1 + sum(rounds) / len(rounds)
    return {"seed": seed, **machine_record(), "kernel": os.environ.get("ATEN_CPU_CAPABILITY", "native"),
            "accuracy": accuracy, "unigram": unigram, "accuracy_over_unigram": accuracy - unigram,
            "implied_tau": final_eval["implied_tau"], "eval_acc_0": final_eval["acc_0"], "tau": taus,
            "untrained_tau": untrained}


def summary(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """Return one line per tested metric: its spread over `rows`, the largest difference between kernel
    families at one seed (`kernel_spread`), the test's threshold and its margin below the weakest pair,
    also in units of that kernel spread, and the best untrained draft's value (the check's power)."""
    series = {
        "accuracy": lambda r: r["accuracy"], "accuracy_over_unigram": lambda r: r["accuracy_over_unigram"],
        "implied_tau": lambda r: r["implied_tau"], "tau_chain_1": lambda r: r["tau"]["chain_1"],
        "tau_deeper": lambda r: min(v for k, v in r["tau"].items() if k != "chain_1"),
    }
    untrained = {"tau_chain_1": max(r["untrained_tau"]["chain_1"] for r in rows),
                 "tau_deeper": max(max(v for k, v in r["untrained_tau"].items() if k != "chain_1") for r in rows)}
    out = []
    for metric, value in series.items():
        values = [value(r) for r in rows]
        by_seed: dict[int, list[float]] = {}
        for row in rows:
            by_seed.setdefault(row["seed"], []).append(value(row))
        kernel_spread = max(max(v) - min(v) for v in by_seed.values())
        low, threshold = min(values), THRESHOLDS[metric]
        out.append({"bench": "learned_spread", "metric": metric, "pairs": len(values),
                    "cpu_capability": sorted({r["cpu_capability"] for r in rows}),
                    "torch_threads": sorted({r["torch_threads"] for r in rows}), "min": round(low, 4),
                    "max": round(max(values), 4), "mean": round(statistics.fmean(values), 4),
                    "seed_sd": round(statistics.stdev(values), 4) if len(values) > 1 else None,
                    "kernel_spread": round(kernel_spread, 4), "threshold": threshold, "margin": round(low - threshold, 4),
                    "margin_in_kernel_spreads": round((low - threshold) / kernel_spread, 2) if kernel_spread else None,
                    "untrained_max": round(untrained[metric], 4) if metric in untrained else None})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", default="default,avx2", help="ATEN_CPU_CAPABILITY values, comma-separated")
    parser.add_argument("--seeds", default="0,1,2", help="learned-pair seeds, comma-separated")
    parser.add_argument("--from", dest="rows", type=Path, default=None,
                        help="summarize the pair lines of an earlier run's output instead of measuring")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child)))
        return
    if args.rows is not None:
        lines = [json.loads(line) for line in args.rows.read_text().splitlines() if line.strip()]
        for line in summary([row for row in lines if row["bench"] == "learned_spread_pair"]):
            print(json.dumps(line), flush=True)
        return
    rows = []
    for kernel in args.kernels.split(","):
        for seed in map(int, args.seeds.split(",")):
            env = {**os.environ, "ATEN_CPU_CAPABILITY": kernel, "OMP_NUM_THREADS": "1"}
            print(f"[learned_spread] kernel {kernel}, seed {seed}", file=sys.stderr, flush=True)
            done = subprocess.run([sys.executable, __file__, "--child", str(seed)], env=env, capture_output=True,
                                  text=True, check=False)
            if done.returncode != 0:
                sys.exit(f"kernel {kernel} seed {seed} failed: {done.stderr[-2000:]}")
            row = {"bench": "learned_spread_pair", **json.loads(done.stdout.strip().splitlines()[-1])}
            rows.append(row)
            print(json.dumps(row), flush=True)
    for line in summary(rows):
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
