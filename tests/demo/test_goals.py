"""The demo's goals from its reports: >= for "never slower", strictly > for "beats", both on the median of
per-prompt ratios with its quartiles and the pass's timing reliability, and a pass that did not run is
"not measured", never "met"."""

from __future__ import annotations

import pytest

from eyas.decode.paired import PairedSpeedup
from eyas.decode.report import EvalReport, LookupFigures, TimingCheck
from eyas.demo.goals import demo_goals, print_goals


def paired(median: float, reliable: bool = True) -> PairedSpeedup:
    return PairedSpeedup(median=median, q1=median - 0.1, q3=median + 0.1, low=median - 0.2, high=median + 0.2,
                         pooled=median + 0.05, ratios=[median], outliers=[], reliable=reliable)


def report(decoding: str, speedup: float, vs_lookup: float | None, tau: float = 1.5, reliable: bool = True) -> EvalReport:
    lookup = None if vs_lookup is None else LookupFigures(
        num_tokens=10, tokens_per_s=20.0, speedup=0.9, pooled_speedup=0.9, paired=paired(0.9), vs_lookup=paired(vs_lookup))
    timing = TimingCheck(reliable=reliable, unreliable_because=[] if reliable else ["stalls"])
    return EvalReport.model_construct(decoding=decoding, speedup=speedup, paired=paired(speedup), prompt_lookup=lookup,
                                      tau=tau, timing=timing)


def test_each_goal_is_met_not_met_or_not_measured(capsys: pytest.CaptureFixture[str]) -> None:
    goals = demo_goals({"": report("auto", 1.0, 1.0), "chat": report("auto", 0.99, 1.9, reliable=False),
                        "chat-draft": report("auto (lookup 0)", 1.1, 1.05),
                        "chat-chain": report("chain 4", 0.7, 0.7, tau=2.0)})
    assert goals["never slower than the target (humaneval)"] == {
        "decoding": "auto", "value": 1.0, "quartiles": [0.9, 1.1], "reliable": True, "met": True}
    assert goals["never slower than the target (chat)"]["met"] is False
    assert goals["never slower than the target (chat)"]["reliable"] is False
    assert goals["beats prompt lookup (humaneval)"] == {
        "decoding": "auto", "value": 1.0, "quartiles": [0.9, 1.1], "reliable": True, "met": False}  # a tie
    assert goals["beats prompt lookup (chat)"]["value"] == 1.9 and goals["beats prompt lookup (chat)"]["met"] is True
    assert goals["draft alone beats prompt lookup (chat)"]["value"] == 1.05
    assert goals["draft alone beats prompt lookup (chat)"]["met"] is True
    assert goals["chain tau >= 2.0 (chat)"] == {"decoding": "chain 4", "value": 2.0, "met": True}
    print_goals(goals)
    printed = capsys.readouterr().err
    assert "never slower than the target (humaneval): met 1.0 (quartiles 0.9-1.1) (auto)\n" in printed
    assert "never slower than the target (chat): NOT met 0.99 (quartiles 0.89-1.09) (auto) [timing UNRELIABLE" in printed
    assert "chain tau >= 2.0 (chat): met 2.0 (chain 4)" in printed


def test_a_pass_that_did_not_run_is_not_measured(capsys: pytest.CaptureFixture[str]) -> None:
    goals = demo_goals({"": report("chain 3", 1.2, None), "chat": report("chain 3", 1.1, None)})
    assert goals["beats prompt lookup (chat)"] == {"decoding": "chain 3", "value": None, "met": None}
    assert goals["draft alone beats prompt lookup (chat)"] == {"decoding": None, "value": None, "met": None}
    assert goals["chain tau >= 2.0 (chat)"]["met"] is None
    print_goals(goals)
    assert "draft alone beats prompt lookup (chat): not measured (None)" in capsys.readouterr().err
