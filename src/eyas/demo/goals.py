"""The demo's figures against its goals (docs/demo.md, "Goals"), from the reports of its passes.

- never slower than the target alone: the eval section's decoding on both held-out sets, speedup >= 1;
- beats prompt lookup: that decoding's speedup over transformers' prompt lookup (same run) > 1, both sets;
- the draft alone beats prompt lookup on the chat set (the auto shape with `--lookup 0`);
- a chain's tau >= 2.0 on the chat set (the `demo.chain` pass).

Speed goals are judged on the median of per-prompt ratios (eyas.decode.paired), and carry their quartiles
and whether the pass's timing was reliable: a goal met or missed by a pass a loaded machine made
unreliable says so. A goal whose pass did not run (no chain pass, prompt lookup off) is reported as not
measured (None), never as met.
"""

from __future__ import annotations

import sys
from typing import Any

from eyas.decode.paired import PairedSpeedup
from eyas.decode.report import EvalReport

CHAIN_TAU_GOAL = 2.0


def _vs_lookup(report: EvalReport | None) -> PairedSpeedup | None:
    """Return the decoding's speed over prompt lookup's, prompt by prompt (None: not measured)."""
    return None if report is None or report.prompt_lookup is None else report.prompt_lookup.vs_lookup


def _speed_goal(report: EvalReport | None, figure: PairedSpeedup | None, bound: float, strictly: bool) -> dict[str, Any]:
    """Return a speed goal's entry: the paired median against `bound`, its quartiles, the pass's reliability."""
    if report is None or figure is None:
        return {"decoding": report.decoding if report else None, "value": None, "met": None}
    return {"decoding": report.decoding, "value": round(figure.median, 3),
            "quartiles": [round(figure.q1, 3), round(figure.q3, 3)], "reliable": report.timing.reliable,
            "met": figure.median > bound if strictly else figure.median >= bound}


def demo_goals(reports: dict[str, EvalReport]) -> dict[str, Any]:
    """Return `{goal: {"value", "met", ...}}` from the demo's reports by pass label ("" = HumanEval, "chat", ...)."""
    humaneval, chat = reports[""], reports["chat"]
    goals: dict[str, Any] = {}
    for name, report in (("humaneval", humaneval), ("chat", chat)):
        goals[f"never slower than the target ({name})"] = _speed_goal(report, report.paired, 1.0, strictly=False)
        goals[f"beats prompt lookup ({name})"] = _speed_goal(report, _vs_lookup(report), 1.0, strictly=True)
    draft = reports.get("chat-draft")
    goals["draft alone beats prompt lookup (chat)"] = _speed_goal(draft, _vs_lookup(draft), 1.0, strictly=True)
    chain = reports.get("chat-chain")
    goals[f"chain tau >= {CHAIN_TAU_GOAL} (chat)"] = {
        "decoding": chain.decoding if chain else None, "value": round(chain.tau, 3) if chain else None,
        "met": chain.tau >= CHAIN_TAU_GOAL if chain else None}
    return goals


def print_goals(goals: dict[str, Any]) -> None:
    """Print one line per goal to stderr: met / NOT met / not measured, with its figure (speed: the median
    of per-prompt ratios and their quartiles), and a warning where the pass's timing was unreliable."""
    print("demo goals:", file=sys.stderr)
    for goal, entry in goals.items():
        verdict = {True: "met", False: "NOT met", None: "not measured"}[entry["met"]]
        figure = "" if entry["value"] is None else f" {entry['value']}"
        if "quartiles" in entry:
            figure += f" (quartiles {entry['quartiles'][0]}-{entry['quartiles'][1]})"
        warning = " [timing UNRELIABLE: see the pass's report]" if entry.get("reliable") is False else ""
        print(f"  {goal}: {verdict}{figure} ({entry['decoding']}){warning}", file=sys.stderr)
