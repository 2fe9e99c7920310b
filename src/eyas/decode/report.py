"""The evaluation report: figures over prompts, `report.json` and `acceptance.png`.

tau is pooled: the tokens committed by all verification forwards (accepted draft tokens + 1
each) divided by the number of those forwards; the prefill forward, which yields the first
token without a draft, is not counted. `per_position_acceptance[i]` is the share of forwards
that accepted more than i draft tokens. Token rates are new tokens over wall time, prefill included.
Speedups are paired (eyas.decode.paired): each prompt is timed both ways, and `speedup` is the median
over prompts of the per-prompt ratio, with its quartiles, range, outliers and whether the pass's timing
can be trusted (`timing`); the pooled ratio (all tokens over all seconds) is `pooled_speedup`. Greedy:
`divergences` explains every output that differs from the target alone's (eyas.decode.divergence).
With the auto shape, `auto` says what the rounds verified: how many rounds drafted a chain of each
length and looked up a branch of each length (0: none), how many accepted tokens came from the
lookup branch alone, and the costs the choices were made from.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from eyas.config import EvalConfig
from eyas.decode.divergence import DivergenceSummary, summarize_divergences
from eyas.decode.paired import PairedSpeedup, paired_speedup
from eyas.decode.sampling import Sampling
from eyas.decode.served import VllmFigures
from eyas.decode.shapes import AutoShape, TreeShape
from eyas.files import write_atomic, write_json_atomic
from eyas.precision import Precision, machine_record

REPORT = "report.json"
TAU_DEFINITION = ("pooled over all prompts: (accepted draft tokens + 1) summed over the verification forwards, "
                  "divided by their number; the prefill forward is not counted")


class AutoChoices(BaseModel):
    """What the auto shape verified, over all rounds of all prompts."""

    draft_length_counts: dict[int, int] = Field(description="rounds per draft chain length verified (0: no draft)")
    lookup_length_counts: dict[int, int] = Field(description="rounds per lookup branch length verified (0: none)")
    plain_rounds: int = Field(description="rounds that verified nothing drafted (a plain target step)")
    accepted_tokens: int = Field(description="drafted tokens accepted, all rounds")
    accepted_from_lookup: int = Field(description="of those, proposed by the lookup branch alone")
    costs: dict[str, Any] = Field(description="the measured round costs the choices were made from (seconds per "
                                              "verified-token count, per draft step)")


class LookupFigures(BaseModel):
    """transformers' prompt-lookup decoding, timed in the same pass on the same prompts."""

    num_tokens: int
    tokens_per_s: float = Field(description="all its new tokens over all its seconds")
    speedup: float = Field(description="over the target alone: the median of per-prompt ratios")
    pooled_speedup: float = Field(description="its tokens_per_s over the target alone's")
    paired: PairedSpeedup = Field(description="over the target alone, prompt by prompt")
    vs_lookup: PairedSpeedup = Field(description="the evaluated decoding over prompt lookup, prompt by prompt")


class TimingCheck(BaseModel):
    """Whether the pass's speedups can be trusted: every paired figure reliable (eyas.decode.paired)."""

    reliable: bool
    unreliable_because: list[str] = Field(default_factory=list)


class EvalReport(BaseModel):
    tau: float
    tau_definition: str = TAU_DEFINITION
    speedup: float = Field(description="median over prompts of speculative tokens/s over the target alone's")
    pooled_speedup: float = Field(description="all speculative tokens/s over all the target alone's (secondary)")
    paired: PairedSpeedup = Field(description="the speedup prompt by prompt: quartiles, range, outliers")
    timing: TimingCheck
    tokens_per_s: float
    baseline_tokens_per_s: float
    per_position_acceptance: list[float]
    accept_length_counts: dict[int, int]
    target_forwards: int
    baseline_target_forwards: int
    draft_forwards: int
    new_tokens: int
    prompts: int
    same_as_baseline: int
    divergences: DivergenceSummary | None = Field(None, description="greedy: why outputs differ from the target "
                                                                    "alone's (near-ties, unexplained)")
    decoding: str
    sampling: dict[str, float]
    max_new_tokens: int
    prompt_lookup: LookupFigures | None = None
    precision: dict[str, object] | None = Field(None, description="the dtype of target and draft and why (eyas.precision)")
    machine: dict[str, object] | None = Field(None, description="CPU capability and torch threads of the summarizing run")
    vllm: VllmFigures | None = Field(None, description="the draft served by vLLM on the same prompts (eval --engine vllm)")
    auto: AutoChoices | None = Field(None, description="the shapes the auto shape chose (eval's default shape)")


def _rate(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def _auto_choices(results: list[dict[str, Any]]) -> AutoChoices:
    drafted = [k for r in results for k in r["drafted"]]
    looked_up = [l for r in results for l in r["looked_up"]]
    return AutoChoices(
        draft_length_counts=dict(sorted(Counter(drafted).items())),
        lookup_length_counts=dict(sorted(Counter(looked_up).items())),
        plain_rounds=sum(k + l == 0 for k, l in zip(drafted, looked_up)),
        accepted_tokens=sum(a for r in results for a in r["accepted"]),
        accepted_from_lookup=sum(t for r in results for t in r["from_lookup"]),
        costs=results[-1]["costs"],
    )


def _lookup_figures(results: list[dict[str, Any]], num_tokens: int, alone: list[tuple[float, float]],
                    speculative: list[tuple[float, float]], labels: list[int]) -> LookupFigures:
    timed = [(r["lookup_new_tokens"], r["lookup_seconds"]) for r in results]
    paired = paired_speedup(alone, timed, labels)
    return LookupFigures(num_tokens=num_tokens, tokens_per_s=_rate(sum(t for t, _ in timed), sum(s for _, s in timed)),
                         speedup=paired.median, pooled_speedup=paired.pooled, paired=paired,
                         vs_lookup=paired_speedup(timed, speculative, labels, steady_baseline=False))


def _timing(figures: dict[str, PairedSpeedup]) -> TimingCheck:
    reasons = [f"{name}: {reason}" for name, figure in figures.items() for reason in figure.unreliable_because]
    return TimingCheck(reliable=not reasons, unreliable_because=reasons)


def summarize(results: list[dict[str, Any]], shape: TreeShape | AutoShape, sampling: Sampling, config: EvalConfig,
              precision: Precision) -> EvalReport:
    """Return the report of the per-prompt `results` lines (at least one), decoded in `precision`."""
    rounds = [a for r in results for a in r["accepted"]]
    tokens, seconds = sum(r["new_tokens"] for r in results), sum(r["seconds"] for r in results)
    base_tokens, base_seconds = sum(r["baseline_new_tokens"] for r in results), sum(r["baseline_seconds"] for r in results)
    rate, base_rate = _rate(tokens, seconds), _rate(base_tokens, base_seconds)
    labels = [r["prompt"] for r in results]
    alone = [(r["baseline_new_tokens"], r["baseline_seconds"]) for r in results]
    speculative = [(r["new_tokens"], r["seconds"]) for r in results]
    paired = paired_speedup(alone, speculative, labels)
    figures = {"speculative over the target alone": paired}
    lookup = None
    if all("lookup_seconds" in r for r in results) and config.prompt_lookup:
        lookup = _lookup_figures(results, config.prompt_lookup, alone, speculative, labels)
        figures["prompt lookup over the target alone"] = lookup.paired
    return EvalReport(
        tau=(sum(rounds) + len(rounds)) / len(rounds) if rounds else 0.0,
        speedup=paired.median, pooled_speedup=paired.pooled, paired=paired, timing=_timing(figures),
        tokens_per_s=rate, baseline_tokens_per_s=base_rate,
        per_position_acceptance=[sum(a > i for a in rounds) / len(rounds) if rounds else 0.0 for i in range(shape.depth)],
        accept_length_counts=dict(sorted(Counter(a + 1 for a in rounds).items())),
        target_forwards=sum(r["target_forwards"] for r in results),
        baseline_target_forwards=sum(r["baseline_target_forwards"] for r in results),
        draft_forwards=sum(r["draft_forwards"] for r in results), new_tokens=tokens, prompts=len(results),
        same_as_baseline=sum(r["same_tokens"] for r in results),
        divergences=summarize_divergences(results) if sampling.greedy else None, decoding=shape.describe(),
        sampling={"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": float(sampling.top_k)},
        max_new_tokens=config.max_new_tokens, prompt_lookup=lookup, precision=precision.record(),
        machine=machine_record(), auto=_auto_choices(results) if isinstance(shape, AutoShape) and results else None,
    )


def write_report(out: Path, report: EvalReport) -> None:
    """Write `out/report.json` and `out/acceptance.png` (acceptance per position, tau per forward)."""
    from matplotlib.figure import Figure

    write_json_atomic(out / REPORT, report.model_dump(mode="json"))
    figure = Figure(figsize=(10, 4))
    left, right = figure.subplots(1, 2)
    positions = range(1, len(report.per_position_acceptance) + 1)
    left.bar(positions, report.per_position_acceptance)
    left.set(xlabel="draft position", ylabel="share of target forwards accepting it", ylim=(0, 1),
             title=f"acceptance per position ({report.decoding})")
    lengths = list(report.accept_length_counts)
    right.bar(lengths, [report.accept_length_counts[k] for k in lengths])
    right.set(xlabel="tokens committed per target forward", ylabel="target forwards",
              title=f"tau {report.tau:.2f} (pooled), speedup {report.speedup:.2f}x (median of prompts)")
    figure.tight_layout()
    write_atomic(out / "acceptance.png", lambda tmp: figure.savefig(tmp, format="png", dpi=100))
