"""Benchmark: the demo's quality figures on the embedded SmolLM2 target, as JSON lines.

Runs (or reuses: every stage resumes) the demo of CONFIG (default examples/demo/full.yaml, the
size meant for the figures) and prints one line per evaluation pass from its reports (`OUT/report/`,
`OUT-vllm/report/` where the demo runs vLLM): the pass's label and held-out set, its decoding, tau,
per-position acceptance, speculative and target-alone tokens/s (pooled), the speedup over the target
alone timed in the same pass on the same prompts, transformers' prompt lookup timed in the same pass
(`prompt_lookup_speedup`, and `vs_prompt_lookup`: speculative over prompt lookup). Every ratio is the
median of per-prompt ratios (`eyas.decode.paired`) with `<ratio>_quartiles`, `<ratio>_range`,
`<ratio>_pooled` (all tokens over all seconds), `<ratio>_outliers` and `<ratio>_reliable`; `timing_reliable`
(with `timing_unreliable_because`) says whether the pass's timing can be trusted at all. Then how many
outputs equal the target alone's and `divergences` (near-ties a rounding explains, unexplained ones: a
bug), and, where vLLM served the pass, vLLM's tau and speedups (its EAGLE-3 and ngram proposers, against
its own target alone; one batched run each, so no per-prompt pairing). The last line is the demo's goals
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

from eyas.decode.paired import PairedSpeedup
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
        **PairedSpeedup.model_validate(result["paired"]).fields("speedup"),
        "timing_reliable": result["timing"]["reliable"], "same_as_baseline": result["same_as_baseline"],
        **(result.get("machine") or machine_record())}
    if not result["timing"]["reliable"]:
        line["timing_unreliable_because"] = result["timing"]["unreliable_because"]
    divergences = result.get("divergences")
    if divergences:
        line["divergences"] = {"identical": divergences["identical"], "near_ties": len(divergences["near_ties"]),
                               "unexplained": len(divergences["unexplained"])}
    lookup = result.get("prompt_lookup")
    if lookup:
        line.update(PairedSpeedup.model_validate(lookup["paired"]).fields("prompt_lookup_speedup"))
        line.update(PairedSpeedup.model_validate(lookup["vs_lookup"]).fields("vs_prompt_lookup"))
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
