"""The cost-aware decoding shape: how many draft tokens and how many prompt-lookup tokens to verify
in the next round, chosen from measured costs and the acceptance observed so far.

A round verifies a draft chain of k tokens and a lookup branch of l tokens in one target forward
(they share their common prefix). With `d_i` the estimated chance that the target accepts at least
i tokens of the draft chain, and `u_i` that of the lookup branch, treated as independent, the
round is expected to commit

    E(k, l) = 1 + sum_{i=1..max(k,l)} [1 - (1 - d_i [i <= k]) (1 - u_i [i <= l])]

tokens (the 1 is the target's own token after the accepted ones), and to cost

    C(k, l) = verify(1 + k + l) + k * draft_step + overhead [k + l > 0]

seconds, where `verify` and `draft_step` are measured (eyas.decode.costs) and `overhead` is the
running mean of what speculative rounds took beyond their modelled cost (Python, masks, cache
trimming). The policy takes the (k, l) with the most tokens per second E/C; (0, 0) is a plain
target step, so a draft or a lookup is only verified when it is expected to pay for itself.

`d_i` is a product of conditional acceptances a_j = P(depth j accepted | depth j-1 accepted),
each estimated from discounted counts (weight 0.98 per new observation, so the estimate follows a
change of text within about 50 rounds) with a prior of strength 2 centred on a_{j-1} (on 0.5 at
depth 1), so a depth that is rarely reached borrows from the depth above it. A proposer that has
not been verified for `PROBE_EVERY` rounds is verified once at one token, so an estimate that
has gone pessimistic can recover; a probe that is rejected doubles that wait (up to
`PROBE_EVERY_MOST`), an accepted one resets it. A probe costs a round of two verified tokens
(on a CPU up to 1.8 plain steps), so a draft that never pays costs a few probes per thousand rounds.
"""

from __future__ import annotations

from dataclasses import dataclass

from eyas.decode.costs import RoundCosts

DECAY = 0.98
PRIOR_STRENGTH = 2.0
PROBE_EVERY = 16
PROBE_EVERY_MOST = 1024


@dataclass(frozen=True)
class AutoShape:
    """The cost-aware shape: draft chains of at most `max_chain` tokens and lookup branches of at most
    `lookup` tokens, chosen per round (0 and 0: a plain target step)."""

    max_chain: int = 8
    lookup: int = 10

    @property
    def depth(self) -> int:
        """The most tokens a round can accept."""
        return max(self.max_chain, self.lookup)

    def describe(self) -> str:
        return f"auto (chain <= {self.max_chain}, lookup <= {self.lookup})"


class AcceptanceEstimate:
    """Running conditional acceptance per depth of one proposer (see the module docstring)."""

    def __init__(self, depth: int) -> None:
        self.hits = [0.0] * depth
        self.trials = [0.0] * depth

    def update(self, proposed: int, matched: int) -> None:
        """Record a round that verified `proposed` tokens of which the first `matched` were accepted."""
        for j in range(min(proposed, matched + 1)):  # depth j+1 was reached when j tokens were accepted
            self.trials[j] = self.trials[j] * DECAY + 1.0
            self.hits[j] = self.hits[j] * DECAY + (1.0 if j < matched else 0.0)

    def reach(self, depth: int) -> list[float]:
        """Return `[P(at least i accepted) for i = 1..depth]`."""
        reached, above, chance = [], 0.5, 1.0
        for j in range(depth):
            above = (self.hits[j] + PRIOR_STRENGTH * above) / (self.trials[j] + PRIOR_STRENGTH)
            chance *= above
            reached.append(chance)
        return reached


def expected_tokens(draft: list[float], lookup: list[float], k: int, l: int) -> float:
    """Return E(k, l) of the module docstring from the reach lists (`draft[i-1]` = d_i)."""
    total = 1.0
    for i in range(max(k, l)):
        miss_draft = 1.0 - draft[i] if i < k else 1.0
        miss_lookup = 1.0 - lookup[i] if i < l else 1.0
        total += 1.0 - miss_draft * miss_lookup
    return total


class ShapePolicy:
    """Chooses each round's (draft chain length, lookup length) and learns from the verdicts."""

    def __init__(self, shape: AutoShape, costs: RoundCosts) -> None:
        self.shape, self.costs = shape, costs
        self.draft = AcceptanceEstimate(shape.max_chain)
        self.lookup = AcceptanceEstimate(shape.lookup)
        self.overhead: float | None = None  # seconds; None until a speculative round was observed
        self._idle = {"draft": 0, "lookup": 0}  # rounds since each proposer was last verified
        self._wait = {"draft": PROBE_EVERY, "lookup": PROBE_EVERY}  # idle rounds before the next probe
        self._probing: set[str] = set()

    def choose(self, can_draft: bool, lookup_available: int) -> tuple[int, int]:
        """Return (k, l): draft tokens and lookup tokens to verify; `lookup_available` tokens were found."""
        max_k = self.shape.max_chain if can_draft else 0
        max_l = min(self.shape.lookup, lookup_available)
        draft, lookup = self.draft.reach(max_k), self.lookup.reach(max_l)
        costs = self.costs
        best, best_rate = (0, 0), 1.0 / costs.verify(1)
        for k in range(max_k + 1):
            for l in range(max_l + 1):
                if k + l == 0:
                    continue
                cost = costs.verify(1 + k + l) + k * costs.draft_step + (self.overhead or 0.0)
                rate = expected_tokens(draft, lookup, k, l) / cost
                if rate > best_rate:
                    best, best_rate = (k, l), rate
        k, l = best
        self._probing = set()
        if max_k and not k and self._idle["draft"] >= self._wait["draft"]:
            k = 1
            self._probing.add("draft")
        if max_l and not l and self._idle["lookup"] >= self._wait["lookup"]:
            l = 1
            self._probing.add("lookup")
        return k, l

    def observe(self, k: int, k_matched: int, l: int, l_matched: int, extra_seconds: float | None) -> None:
        """Learn from a round that verified `k` draft and `l` lookup tokens, the first `k_matched` and
        `l_matched` of which the target accepted; `extra_seconds`: its wall time beyond the modelled cost."""
        for name, estimate, proposed, matched in (("draft", self.draft, k, k_matched),
                                                  ("lookup", self.lookup, l, l_matched)):
            if proposed:
                estimate.update(proposed, matched)
                self._idle[name] = 0
                if name in self._probing:
                    self._wait[name] = PROBE_EVERY if matched else min(2 * self._wait[name], PROBE_EVERY_MOST)
            else:
                self._idle[name] += 1
        if extra_seconds is not None and k + l:
            extra = max(extra_seconds, 0.0)
            self.overhead = extra if self.overhead is None else self.overhead * 0.9 + extra * 0.1
