"""The spread of the learned tiny pair's quality across seeds and CPU kernel families, and the margin
the learning and decoding tests' thresholds keep from it.

The tests (tests/train/test_learning.py, tests/decode/test_decoder.py) assert learned qualities of
`eyas.testing.learned.build_learned_pair`: held-out step-0 accuracy, the trainer's implied tau and
the decoder's tau per shape. Their floating-point results differ between kernel families
(`ATEN_CPU_CAPABILITY=default|avx2|avx512`) and machines; this script measures that spread, and the
larger spread over seeds, so that each threshold sits below every working pair by a stated margin
and above an untrained draft (the power of the check).

Each (kernel, seed) pair is built in its own process (the kernel family is read at torch import),
with one torch thread. Prints one JSON line per pair and one per metric: min, max, mean, standard
deviation over all pairs, the test's threshold, the margin (min - threshold) in standard deviations
and the untrained draft's value. The baseline of the same run is the untrained draft.

    .venv/bin/python bench/learned_spread.py --kernels default,avx2 --seeds 0,1,2
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
THRESHOLDS = {"accuracy": 0.6, "accuracy_over_unigram": 0.4, "implied_tau": 2.2, "tau_chain_1": 1.4, "tau_deeper": 1.6}


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
    """Return one line per tested metric: spread over `rows`, threshold, margin in standard deviations."""
    series: dict[str, list[float]] = {
        "accuracy": [r["accuracy"] for r in rows], "accuracy_over_unigram": [r["accuracy_over_unigram"] for r in rows],
        "implied_tau": [r["implied_tau"] for r in rows], "tau_chain_1": [r["tau"]["chain_1"] for r in rows],
        "tau_deeper": [min(v for k, v in r["tau"].items() if k != "chain_1") for r in rows],
    }
    untrained = {"tau_chain_1": max(r["untrained_tau"]["chain_1"] for r in rows),
                 "tau_deeper": max(max(v for k, v in r["untrained_tau"].items() if k != "chain_1") for r in rows)}
    out = []
    for metric, values in series.items():
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        low, threshold = min(values), THRESHOLDS[metric]
        out.append({"bench": "learned_spread", "metric": metric, "pairs": len(values), "min": round(low, 4),
                    "max": round(max(values), 4), "mean": round(statistics.fmean(values), 4), "sd": round(sd, 4),
                    "threshold": threshold, "margin": round(low - threshold, 4),
                    "margin_sd": round((low - threshold) / sd, 2) if sd else None,
                    "untrained_max": round(untrained[metric], 4) if metric in untrained else None})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", default="default,avx2", help="ATEN_CPU_CAPABILITY values, comma-separated")
    parser.add_argument("--seeds", default="0,1,2", help="learned-pair seeds, comma-separated")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child)))
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
