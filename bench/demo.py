"""Benchmark: the demo's quality figures on the embedded SmolLM2 target, as JSON lines.

Runs (or reuses: every stage resumes) the demo of CONFIG (default examples/demo/full.yaml, the
size meant for the figures) and prints one line per decoding setting from its reports: tau,
per-position acceptance, speculative and target-alone tokens/s and their ratio (`speedup`, the
target alone timed in the same evaluation pass on the same prompts), and `vs_prompt_lookup`
(speculative tokens/s over transformers' prompt-lookup decoding, timed in the chain pass); then
one line for prompt lookup itself. Threads: torch's default (both cores of the VM); the
settings that change the result (prompts, new tokens, dtype, shapes) are in each line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from eyas.config import DemoConfig, EvalConfig, load_stage_config
from eyas.demo.run import run_demo
from eyas.precision import machine_record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", type=Path, default=Path("examples/demo/full.yaml"))
    args = parser.parse_args()
    with contextlib.redirect_stdout(sys.stderr):  # the demo's own table: stdout holds the JSON lines only
        report = run_demo(args.config)
    demo = load_stage_config(DemoConfig, "demo", args.config)
    settings = load_stage_config(EvalConfig, "eval", args.config)
    chain = json.loads((report / "report.json").read_text())
    reports = [chain] + ([json.loads((report / "tree" / "report.json").read_text())] if demo.tree else [])
    lookup = chain["prompt_lookup"]
    common = {"bench": "demo", "config": str(args.config), "prompts": chain["prompts"],
              "max_new_tokens": chain["max_new_tokens"], "dtype": (chain.get("precision") or {}).get("dtype", settings.dtype),
              "sampling": chain["sampling"], **(chain.get("machine") or machine_record())}
    for result in reports:
        line = {**common, "decoding": result["decoding"], "tau": round(result["tau"], 3),
                "per_position_acceptance": [round(a, 3) for a in result["per_position_acceptance"]],
                "tokens_per_s": round(result["tokens_per_s"], 2),
                "baseline_tokens_per_s": round(result["baseline_tokens_per_s"], 2),
                "speedup": round(result["speedup"], 3), "same_as_baseline": result["same_as_baseline"]}
        if lookup:
            line["vs_prompt_lookup"] = round(result["tokens_per_s"] / lookup["tokens_per_s"], 3)
        print(json.dumps(line))
    if lookup:
        print(json.dumps({**common, "decoding": f"prompt lookup {int(lookup['num_tokens'])}",
                          "tokens_per_s": round(lookup["tokens_per_s"], 2), "speedup": round(lookup["speedup"], 3)}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
