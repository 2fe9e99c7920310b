"""What a decoding round costs on the device at hand, measured once per decoder.

A verification forward of n tokens (the root plus n-1 drafted ones) after a cached prefix costs
about `verify_base + verify_per_token * n` seconds: on a CPU the per-token term dominates early
(every token is a matmul row), on a GPU the base does until the batch fills the device. Both are
fitted by least squares to the median time of forwards of 1, 2, 4, 8 and 16 tokens, each measured
three times after one untimed pass, and dropped from the cache again. A draft step (one anchor
through the draft, its logits included) costs `draft_step`, the median of five.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from eyas.decode.runners import DraftRunner, TargetRunner

VERIFY_SIZES = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class RoundCosts:
    """Seconds: a target forward verifying n tokens costs `verify_base + verify_per_token * n`;
    one draft forward of one anchor costs `draft_step`."""

    verify_base: float
    verify_per_token: float
    draft_step: float

    def verify(self, tokens: int) -> float:
        """Return the seconds of a target forward of `tokens` new tokens."""
        return self.verify_base + self.verify_per_token * tokens

    def record(self) -> dict[str, float]:
        return {name: round(value, 7) for name, value in asdict(self).items()}


def _median_seconds(work: Callable[[], object], repeats: int) -> float:
    """Return the median wall time of `repeats` calls of `work`, after one untimed call."""
    work()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _line_fit(sizes: list[int], seconds: list[float]) -> tuple[float, float]:
    """Return (intercept, slope) of the least-squares line through `(sizes, seconds)`, both >= 0."""
    x = torch.tensor(sizes, dtype=torch.float64)
    y = torch.tensor(seconds, dtype=torch.float64)
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())
    slope = max(slope, 0.0)
    return max(float(y.mean()) - slope * float(x.mean()), 0.0), slope


def measure_costs(target: TargetRunner, drafter: DraftRunner | None, token: int, position: int,
                  feature: torch.Tensor | None) -> RoundCosts:
    """Return the costs measured with the caches as they are (a prefilled prompt), which are left unchanged.

    `token` is fed at `position` (and after it) as the verified tokens; `feature [1, H]` is the draft
    feature a measured draft step reads (ignored without a drafter, whose step then costs 0).
    """
    seconds = []
    for size in VERIFY_SIZES:
        tokens, positions = torch.full((size,), token), position + torch.arange(size)

        def verify(tokens: torch.Tensor = tokens, positions: torch.Tensor = positions, size: int = size) -> None:
            target.forward(tokens, positions)
            target.keep(size, [])

        seconds.append(_median_seconds(verify, 3))
    base, per_token = _line_fit(list(VERIFY_SIZES), seconds)
    if drafter is None or feature is None:
        return RoundCosts(base, per_token, 0.0)
    length = drafter.length

    def draft() -> None:
        drafter.forward(feature, torch.tensor([token]), torch.tensor([position]))
        drafter.crop(length)

    return RoundCosts(base, per_token, _median_seconds(draft, 5))
