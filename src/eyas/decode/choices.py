"""What the target's logits said at every committed token of a greedy generation: enough to explain a
difference between two generations afterwards (eyas.decode.divergence), and no more.

Per committed token the log keeps, from the logit row that chose it, the row's argmax (the token greedy
decoding commits: the lowest id among exact ties, as `argmax` breaks them), its two largest logits and
their tokens, and its largest |logit| (the scale its rounding is measured against): three floats and
three ids, not the `[V]` row. The rows stay on the device until the generation ends, so recording costs
a top-2, a max and an |max| on logits already computed (about 0.1 ms per row of 49,152 logits on one CPU
thread, under 1 % of a SmolLM2-135M forward), and no synchronisation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TargetChoices:
    """Per committed token t, on the CPU: `logits [T, 3]` float32 = (top-1 logit, top-2 logit, largest |logit|
    of the row); `ids [T, 3]` = (the row's argmax, top-1 token, top-2 token)."""

    logits: torch.Tensor
    ids: torch.Tensor


class ChoiceLog:
    """Collects the target's logit rows of committed tokens during one generation (module docstring)."""

    def __init__(self) -> None:
        self.logits: list[torch.Tensor] = []  # [r, 3] each, on the logits' device
        self.ids: list[torch.Tensor] = []  # [r, 3] each

    def add(self, logits: torch.Tensor) -> None:
        """Record `logits [r, V]`, row i being the target's prediction of the i-th token committed next."""
        top = logits.topk(2, dim=-1)  # values, indices [r, 2]; the order of exact ties unspecified
        first = logits.max(-1, keepdim=True).indices  # [r, 1]: the first maximal id, as argmax breaks ties
        scale = logits.abs().amax(-1, keepdim=True)  # [r, 1]
        self.logits.append(torch.cat([top.values, scale], dim=-1))  # [r, 3]
        self.ids.append(torch.cat([first, top.indices], dim=-1))  # [r, 3]

    def finish(self) -> TargetChoices:
        """Return everything recorded (at least one row), moved to the CPU: one copy per tensor kind."""
        return TargetChoices(torch.cat(self.logits).float().cpu(), torch.cat(self.ids).cpu())
