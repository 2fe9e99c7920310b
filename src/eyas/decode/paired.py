"""Speedups no stalled sample can decide: per-pair ratios, their median and spread, outliers marked.

A speedup taken as all tokens over all seconds on each side (the pooled ratio) lets one slow sample move
it: in one `make demo` on a loaded machine single prompts ran 5-10x slower than their neighbours, and the
same prompt-lookup-vs-target ratio on the same prompts read 3.71x in one pass and 1.35x in another. Every
prompt (or batch, or round) is timed on both sides, so the ratio is taken per pair, the candidate's
tokens/s over the baseline's on the same prompt (equivalently the baseline's seconds per token over the
candidate's), and reported as the median over the pairs with its quartiles and range; the pooled ratio
stays as a secondary figure.

- Outliers: a pair whose seconds per token on one side exceed `OUTLIER_FACTOR` (3) times that side's
  median while the other side did not slow with it (the two sides' paces, each over its median, differ by
  more than that factor). A stall (another process on the cores, a CPU clocking down) slows one side of a
  pair by a factor, while decoding itself moves a prompt's seconds per token far less: the target alone
  runs the same loop on every prompt, and a speculative prompt that accepts nothing runs at about the
  target's own pace. A prompt slow on both sides (an answer that stops after a few tokens carries its
  whole prefill) is not one: its ratio is as fair as any other's.
- Unreliable (`reliable: false`, with the reasons): fewer than `FEWEST_PAIRS` (3) pairs, where a median
  cannot tell a stall from the trend; more than `MOST_OUTLIERS` (a quarter) of the pairs outliers, where
  stalls were no isolated events; or, where the baseline does the same work per token on every pair
  (`steady_baseline`: the target alone, a training step), its seconds per token spreading by more than
  `STEADY_SPREAD` (25 %) between its quartiles: the machine's speed changed during the pass.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

OUTLIER_FACTOR = 3.0
MOST_OUTLIERS = 0.25
FEWEST_PAIRS = 3
STEADY_SPREAD = 1.25

Timed = tuple[float, float]  # (tokens or other units of work, seconds)


class PairedSpeedup(BaseModel):
    """The candidate's speed over the baseline's, pair by pair (module docstring)."""

    median: float = Field(description="median over the pairs of candidate tokens/s over baseline tokens/s")
    q1: float = Field(description="first quartile of the per-pair ratios")
    q3: float = Field(description="third quartile of the per-pair ratios")
    low: float = Field(description="smallest per-pair ratio")
    high: float = Field(description="largest per-pair ratio")
    pooled: float = Field(description="all candidate tokens over all its seconds, over the baseline's (secondary)")
    ratios: list[float] = Field(description="the per-pair ratios, in the pairs' order")
    outliers: list[int] = Field(description="labels of the pairs with one side slower than 3x its median per token "
                                            "and the other not slowed alike")
    reliable: bool
    unreliable_because: list[str] = Field(default_factory=list)

    def describe(self, unit: str = "prompts") -> str:
        """Return the figure in words: the median, quartiles, range, pooled ratio and outliers (reliability
        is the caller's to say: `unreliable_because`)."""
        text = (f"{self.median:.2f}x (quartiles {self.q1:.2f}-{self.q3:.2f}, range {self.low:.2f}-{self.high:.2f} "
                f"over {len(self.ratios)} {unit}; pooled {self.pooled:.2f}x)")
        if self.outliers:
            text += f", outliers: {unit} {', '.join(map(str, self.outliers))}"
        return text

    def fields(self, name: str = "speedup") -> dict[str, Any]:
        """Return the figure as bench JSON fields: `name` (the median), `name_quartiles`, `name_range`,
        `name_pooled`, `name_outliers`, `name_reliable` and, when unreliable, `name_unreliable_because`."""
        line: dict[str, Any] = {
            name: round(self.median, 3), f"{name}_quartiles": [round(self.q1, 3), round(self.q3, 3)],
            f"{name}_range": [round(self.low, 3), round(self.high, 3)], f"{name}_pooled": round(self.pooled, 3),
            f"{name}_outliers": self.outliers, f"{name}_reliable": self.reliable}
        if not self.reliable:
            line[f"{name}_unreliable_because"] = self.unreliable_because
        return line


def quantile(values: Sequence[float], q: float) -> float:
    """Return the `q` quantile of `values`, linear between the order statistics (numpy's default);
    refuses no values or `q` outside [0, 1]."""
    if not values or not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile: {q} of {len(values)} values")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def _stalled(base_pace: float, candidate_pace: float) -> bool:
    """Return whether a pair whose sides ran at these paces (seconds per token over the side's median) is an
    outlier: one side over `OUTLIER_FACTOR` times its median, the other not slowed alike."""
    slow = max(base_pace, candidate_pace) > OUTLIER_FACTOR
    return slow and max(base_pace / candidate_pace, candidate_pace / base_pace) > OUTLIER_FACTOR


def paired_speedup(baseline: Sequence[Timed], candidate: Sequence[Timed], labels: Sequence[int] | None = None,
                   steady_baseline: bool = True, unit: str = "prompts") -> PairedSpeedup:
    """Return the candidate's speedup over the baseline from pairs timed on both sides, `(work, seconds)`
    each (`labels`: the pairs' names in the report, default 0, 1, ...; `unit`: what a pair is, in the
    reasons). Refuses no pairs, sides of different lengths, and work or seconds that are not positive."""
    labels = list(range(len(baseline))) if labels is None else list(labels)
    if not baseline or len(baseline) != len(candidate) or len(labels) != len(baseline):
        raise ValueError(f"paired speedup: {len(baseline)} baseline and {len(candidate)} candidate timings, "
                         f"{len(labels)} labels")
    if any(work <= 0 or seconds <= 0 for work, seconds in (*baseline, *candidate)):
        raise ValueError("paired speedup: every timing needs positive work and seconds")
    base = [seconds / work for work, seconds in baseline]  # seconds per token
    cand = [seconds / work for work, seconds in candidate]
    ratios = [b / c for b, c in zip(base, cand)]
    base_median, cand_median = statistics.median(base), statistics.median(cand)
    outliers = [label for label, b, c in zip(labels, base, cand)
                if _stalled(b / base_median, c / cand_median)]
    reasons = []
    if len(ratios) < FEWEST_PAIRS:
        reasons.append(f"{len(ratios)} {unit}: too few to tell a stall from the trend")
    if len(outliers) > MOST_OUTLIERS * len(ratios):
        reasons.append(f"{len(outliers)} of {len(ratios)} {unit} ran over {OUTLIER_FACTOR:g}x their side's median "
                       "seconds per token (stalls: a loaded machine?)")
    spread = quantile(base, 0.75) / quantile(base, 0.25)
    if steady_baseline and spread > STEADY_SPREAD:
        reasons.append(f"the baseline's seconds per token varied {spread:.2f}x between its quartiles, for the same "
                       "work per token: the machine's speed changed during the pass")
    pooled = (sum(w for w, _ in candidate) / sum(s for _, s in candidate)) / (
        sum(w for w, _ in baseline) / sum(s for _, s in baseline))
    return PairedSpeedup(median=statistics.median(ratios), q1=quantile(ratios, 0.25), q3=quantile(ratios, 0.75),
                         low=min(ratios), high=max(ratios), pooled=pooled, ratios=ratios, outliers=outliers,
                         reliable=not reasons, unreliable_because=reasons)
