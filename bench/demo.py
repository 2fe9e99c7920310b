"""Benchmark: the demo's quality figures on the embedded SmolLM2 target, as JSON lines.

Runs (or reuses: every stage resumes) the demo of CONFIG (default examples/demo/full.yaml, the
size meant for the figures) and prints one line per evaluation pass from its reports (`OUT/report/`,
`OUT-vllm/report/` where the demo runs vLLM): the pass's label and held-out set, its decoding, tau,
per-position acceptance, speculative and target-alone tokens/s and their ratio (`speedup`, the
target alone timed in the same pass on the same prompts), transformers' prompt lookup timed in the same
pass (`prompt_lookup_speedup`, and `vs_prompt_lookup`: speculative tokens/s over prompt lookup's), how
many outputs equal the target alone's, and, where vLLM served the pass, vLLM's tau and speedups (its
EAGLE-3 and ngram proposers, against its own target alone). The last line is the demo's goals
(`goals.json`). Threads: torch's default (both cores of the VM); the settings that change the result
(prompts, new tokens, dtype, shapes) are in each line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from eyas.demo.run import run_demo
from eyas.precision import machine_record


def pass_reports(report: Path) -> dict[str, dict[str, Any]]:
    """Return the demo's pass reports by label ("" for the eval section's, then its subdirectories')."""
    found = {"": report / "report.json", **{path.parent.name: path for path in sorted(report.glob("*/report.json"))}}
    return {label: json.loads(path.read_text(encoding="utf-8")) for label, path in found.items()}


def pass_line(label: str, result: dict[str, Any]) -> dict[str, Any]:
    """Return the JSON line of one pass's report (module docstring)."""
    line: dict[str, Any] = {
        "bench": "demo", "pass": label or "eval", "held_out": "chat" if label.startswith("chat") else "humaneval",
        "decoding": result["decoding"], "prompts": result["prompts"], "max_new_tokens": result["max_new_tokens"],
        "dtype": (result.get("precision") or {}).get("dtype"), "sampling": result["sampling"],
        "tau": round(result["tau"], 3), "per_position_acceptance": [round(a, 3) for a in result["per_position_acceptance"]],
        "tokens_per_s": round(result["tokens_per_s"], 2), "baseline_tokens_per_s": round(result["baseline_tokens_per_s"], 2),
        "speedup": round(result["speedup"], 3), "same_as_baseline": result["same_as_baseline"],
        **(result.get("machine") or machine_record())}
    lookup = result.get("prompt_lookup")
    if lookup and lookup["tokens_per_s"]:
        line["prompt_lookup_speedup"] = round(lookup["speedup"], 3)
        line["vs_prompt_lookup"] = round(result["tokens_per_s"] / lookup["tokens_per_s"], 3)
    served = result.get("vllm")
    if served:
        line["vllm"] = {"tau": round(served["eagle3"]["tau"], 3), "speedup": round(served["eagle3"]["speedup"], 3),
                        "ngram_tau": round(served["ngram"]["tau"], 3), "ngram_speedup": round(served["ngram"]["speedup"], 3)}
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", type=Path, default=Path("examples/demo/full.yaml"))
    args = parser.parse_args()
    with contextlib.redirect_stdout(sys.stderr):  # the demo's own table: stdout holds the JSON lines only
        report = run_demo(args.config)
    for label, result in pass_reports(report).items():
        print(json.dumps({"config": str(args.config), **pass_line(label, result)}))
    goals = json.loads((report / "goals.json").read_text(encoding="utf-8"))
    print(json.dumps({"bench": "demo", "config": str(args.config), "goals": goals}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
