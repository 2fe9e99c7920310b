"""The demo's goals from its reports: >= for "never slower", strictly > for "beats", and a pass that did
not run is "not measured", never "met"."""

from __future__ import annotations

import pytest

from eyas.decode.report import EvalReport
from eyas.demo.goals import demo_goals, print_goals


def report(decoding: str, speedup: float, tokens_per_s: float, lookup_tokens_per_s: float | None,
           tau: float = 1.5) -> EvalReport:
    lookup = None if lookup_tokens_per_s is None else {"num_tokens": 10.0, "tokens_per_s": lookup_tokens_per_s,
                                                       "speedup": 0.9}
    return EvalReport.model_construct(decoding=decoding, speedup=speedup, tokens_per_s=tokens_per_s,
                                      prompt_lookup=lookup, tau=tau)


def test_each_goal_is_met_not_met_or_not_measured(capsys: pytest.CaptureFixture[str]) -> None:
    goals = demo_goals({"": report("auto", 1.0, 20.0, 20.0), "chat": report("auto", 0.99, 19.0, 10.0),
                        "chat-draft": report("auto (lookup 0)", 1.1, 21.0, 20.0),
                        "chat-chain": report("chain 4", 0.7, 14.0, 20.0, tau=2.0)})
    assert goals["never slower than the target (humaneval)"] == {"decoding": "auto", "value": 1.0, "met": True}
    assert goals["never slower than the target (chat)"]["met"] is False
    assert goals["beats prompt lookup (humaneval)"] == {"decoding": "auto", "value": 1.0, "met": False}  # a tie
    assert goals["beats prompt lookup (chat)"] == {"decoding": "auto", "value": 1.9, "met": True}
    assert goals["draft alone beats prompt lookup (chat)"] == {"decoding": "auto (lookup 0)", "value": 1.05, "met": True}
    assert goals["chain tau >= 2.0 (chat)"] == {"decoding": "chain 4", "value": 2.0, "met": True}
    print_goals(goals)
    printed = capsys.readouterr().err
    assert "never slower than the target (chat): NOT met 0.99 (auto)" in printed
    assert "chain tau >= 2.0 (chat): met 2.0 (chain 4)" in printed


def test_a_pass_that_did_not_run_is_not_measured(capsys: pytest.CaptureFixture[str]) -> None:
    goals = demo_goals({"": report("chain 3", 1.2, 20.0, None), "chat": report("chain 3", 1.1, 20.0, None)})
    assert goals["beats prompt lookup (chat)"] == {"decoding": "chain 3", "value": None, "met": None}
    assert goals["draft alone beats prompt lookup (chat)"] == {"decoding": None, "value": None, "met": None}
    assert goals["chain tau >= 2.0 (chat)"]["met"] is None
    print_goals(goals)
    assert "draft alone beats prompt lookup (chat): not measured (None)" in capsys.readouterr().err
