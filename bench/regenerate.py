"""Benchmark: `eyas regenerate` through transformers (`--backend hf`) and through vLLM (`--backend vllm`)
on the same prompts in the same run, as JSON lines: new tokens per second of each (wall time of the
stage, the model load and vLLM's engine start included, and without them: the generation alone as the
stage's own rate line reports it) and their ratio (with `ratio_paired`, `eyas.decode.paired`'s median and
spread: one run of each, so marked unreliable; rerun it for a spread). Run it in the vLLM venv (`make setup-vllm`):

    .venv-vllm/bin/python bench/regenerate.py [--prompts N] [--max-new-tokens N]

Prompts: the first N of the demo's training prompts (`eyas.demo.prompts.training_prompts`). Greedy, float32 (the same answers from both).
torch threads: its default (both cores); vLLM's CPU worker binds its own threads.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from eyas.backends.vllm.contract import installed_vllm
from eyas.config import RegenerateConfig
from eyas.data.regenerate import run_regenerate
from eyas.decode.paired import paired_speedup
from eyas.demo.prompts import training_prompts
from eyas.models.default import default_target
from eyas.precision import machine_record



def _prompts(out: Path, count: int) -> Path:
    path = out / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in training_prompts(count)), encoding="utf-8")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    installed = installed_vllm()
    if installed is None:
        sys.exit("bench/regenerate.py: vLLM is not installed here; run it with .venv-vllm/bin/python (make setup-vllm)")
    target = default_target()
    with tempfile.TemporaryDirectory(prefix="eyas-bench-regenerate-") as scratch:
        prompts = _prompts(Path(scratch), args.prompts)
        rates, answers, timed = {}, {}, {}
        for backend in ("hf", "vllm"):
            out = Path(scratch) / backend
            config = RegenerateConfig(target=target, prompts=prompts, out=out, limit=args.prompts, backend=backend,
                                      max_new_tokens=args.max_new_tokens, temperature=0.0, dtype="float32", device="cpu")
            started = time.perf_counter()
            result = run_regenerate(config)
            seconds = time.perf_counter() - started
            rates[backend] = result.new_tokens / seconds
            timed[backend] = (result.new_tokens, seconds)
            answers[backend] = (out / "conversations.jsonl").read_text()
            print(json.dumps({"bench": "regenerate", "backend": backend, "engine": installed.describe() if backend == "vllm"
                              else "transformers", "prompts": result.prompts, "max_new_tokens": args.max_new_tokens,
                              "new_tokens": result.new_tokens, "seconds": round(seconds, 2),
                              "tokens_per_s": round(rates[backend], 2), "dtype": "float32", **machine_record()}), flush=True)
    print(json.dumps({"bench": "regenerate", "ratio": "vllm/hf", "tokens_per_s_ratio": round(rates["vllm"] / rates["hf"], 3),
                      **paired_speedup([timed["hf"]], [timed["vllm"]], unit="runs").fields("ratio_paired"),
                      "same_answers": answers["vllm"] == answers["hf"], **machine_record()}), flush=True)


if __name__ == "__main__":
    main()
