"""The demo's figures against its goals (docs/demo.md, "Goals"), from the reports of its passes.

- never slower than the target alone: the eval section's decoding on both held-out sets, speedup >= 1;
- beats prompt lookup: that decoding's speedup over transformers' prompt lookup (same run) > 1, both sets;
- the draft alone beats prompt lookup on the chat set (the auto shape with `--lookup 0`);
- a chain's tau >= 2.0 on the chat set (the `demo.chain` pass).

A goal whose pass did not run (no chain pass, prompt lookup off) is reported as not measured (None),
never as met.
"""

from __future__ import annotations

import sys
from typing import Any

from eyas.decode.report import EvalReport

CHAIN_TAU_GOAL = 2.0


def _vs_lookup(report: EvalReport | None) -> float | None:
    """Return the decoding's tokens/s over prompt lookup's (None: not measured)."""
    if report is None or not report.prompt_lookup or not report.prompt_lookup["tokens_per_s"]:
        return None
    return report.tokens_per_s / report.prompt_lookup["tokens_per_s"]


def _at_least(value: float | None, bound: float, strictly: bool = False) -> bool | None:
    if value is None:
        return None
    return value > bound if strictly else value >= bound


def demo_goals(reports: dict[str, EvalReport]) -> dict[str, Any]:
    """Return `{goal: {"value", "met", ...}}` from the demo's reports by pass label ("" = HumanEval, "chat", ...)."""
    humaneval, chat = reports[""], reports["chat"]
    goals: dict[str, Any] = {}
    for name, report in (("humaneval", humaneval), ("chat", chat)):
        goals[f"never slower than the target ({name})"] = {
            "decoding": report.decoding, "value": round(report.speedup, 3), "met": report.speedup >= 1.0}
        vs = _vs_lookup(report)
        goals[f"beats prompt lookup ({name})"] = {
            "decoding": report.decoding, "value": None if vs is None else round(vs, 3), "met": _at_least(vs, 1.0, True)}
    draft = reports.get("chat-draft")
    vs = _vs_lookup(draft)
    goals["draft alone beats prompt lookup (chat)"] = {
        "decoding": draft.decoding if draft else None, "value": None if vs is None else round(vs, 3),
        "met": _at_least(vs, 1.0, True)}
    chain = reports.get("chat-chain")
    goals[f"chain tau >= {CHAIN_TAU_GOAL} (chat)"] = {
        "decoding": chain.decoding if chain else None, "value": round(chain.tau, 3) if chain else None,
        "met": _at_least(chain.tau if chain else None, CHAIN_TAU_GOAL)}
    return goals


def print_goals(goals: dict[str, Any]) -> None:
    """Print one line per goal to stderr: met / NOT met / not measured, with its figure."""
    print("demo goals:", file=sys.stderr)
    for goal, entry in goals.items():
        verdict = {True: "met", False: "NOT met", None: "not measured"}[entry["met"]]
        figure = "" if entry["value"] is None else f" {entry['value']}"
        print(f"  {goal}: {verdict}{figure} ({entry['decoding']})", file=sys.stderr)
