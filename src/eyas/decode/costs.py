"""What a decoding round costs on the device at hand, measured once per decoder.

A verification forward of n tokens (the root plus n-1 drafted ones) after a cached prefix is
timed for n in `VERIFY_SIZES` (one untimed pass, then three timed passes over all the sizes in turn,
so that a slow moment hits one pass of every size rather than every pass of one size; the median
per size; each forward is dropped from the cache again). A forward of more tokens never costs
less, so each size costs at least what a smaller one did. The cost of other sizes is interpolated
linearly between the measured ones (extrapolated beyond the largest with the last segment's slope);
the policy corrects the table online (eyas.decode.policy). No straight line is fitted:
on a CPU the step from one token to two is the largest (a matrix-vector product becomes a
matrix-matrix one: SmolLM2-135M in float32 on 2 AVX2 cores took 50 ms for one token, 87 ms for
two, 125 ms for sixteen), and a line through all sizes misplaced exactly the sizes that decide
whether drafting pays. A draft step (one anchor through the draft, its logits included) costs
`draft_step`, the median of five.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate

import torch

from eyas.decode.runners import DraftRunner, TargetForwards

VERIFY_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)


@dataclass(frozen=True)
class RoundCosts:
    """Seconds: a target forward verifying `verify_sizes[i]` tokens costs `verify_seconds[i]` (other sizes
    interpolated); one draft forward of one anchor costs `draft_step`."""

    verify_sizes: tuple[int, ...]
    verify_seconds: tuple[float, ...]
    draft_step: float

    @classmethod
    def linear(cls, base: float, per_token: float, draft_step: float) -> RoundCosts:
        """Return costs where verifying n tokens costs `base + per_token * n`."""
        return cls((1, 2), (base + per_token, base + 2 * per_token), draft_step)

    def verify(self, tokens: int) -> float:
        """Return the seconds of a target forward of `tokens` new tokens."""
        sizes, seconds = self.verify_sizes, self.verify_seconds
        if tokens <= sizes[0]:
            return seconds[0]
        upper = next((i for i, size in enumerate(sizes) if size >= tokens), len(sizes) - 1)
        lower = upper - 1
        slope = (seconds[upper] - seconds[lower]) / (sizes[upper] - sizes[lower])
        if tokens > sizes[-1]:
            return seconds[-1] + max(slope, 0.0) * (tokens - sizes[-1])
        return seconds[lower] + slope * (tokens - sizes[lower])

    def record(self) -> dict[str, object]:
        return {"verify_seconds": {str(n): round(s, 6) for n, s in zip(self.verify_sizes, self.verify_seconds)},
                "draft_step": round(self.draft_step, 6)}


def settle(device: torch.device) -> None:
    """Wait for the work queued on `device` (a CUDA device runs asynchronously), so a timer around it is true."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_seconds(work: Callable[[], object], repeats: int) -> float:
    """Return the median wall time of `repeats` calls of `work`, after one untimed call."""
    work()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure_costs(target: TargetForwards, drafter: DraftRunner | None, token: int, position: int,
                  feature: torch.Tensor | None) -> RoundCosts:
    """Return the costs measured with the caches as they are (a prefilled prompt), which are left unchanged.

    `token` is fed at `position` (and after it) as the verified tokens; `feature [1, H]` is the draft
    feature a measured draft step reads (ignored without a drafter, whose step then costs 0).
    """
    def verify(size: int) -> float:
        started = time.perf_counter()
        target.forward(torch.full((size,), token), position + torch.arange(size))
        settle(target.device)
        seconds = time.perf_counter() - started
        target.keep(size, [])
        return seconds

    for size in VERIFY_SIZES:
        verify(size)
    passes = [[verify(size) for size in VERIFY_SIZES] for _ in range(3)]
    seconds = list(accumulate((statistics.median(times) for times in zip(*passes)), max))  # never cheaper when larger
    if drafter is None or feature is None:
        return RoundCosts(VERIFY_SIZES, tuple(seconds), 0.0)
    length = drafter.length

    def draft() -> None:
        drafter.forward(feature, torch.tensor([token]), torch.tensor([position]))
        settle(drafter.device)
        drafter.crop(length)

    return RoundCosts(VERIFY_SIZES, tuple(seconds), _median_seconds(draft, 5))
