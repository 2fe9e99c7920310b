"""The cost-aware decoding shape: how many draft tokens and how many prompt-lookup tokens to verify
in the next round, chosen from measured costs and the acceptance observed so far.

A round verifies a draft chain of k tokens and a lookup branch of l tokens in one target forward
(they share their common prefix). With `d_i` the estimated chance that the target accepts at least
i tokens of the draft chain, and `u_i` that of the lookup branch, treated as independent, the
round is expected to commit

    E(k, l) = 1 + sum_{i=1..max(k,l)} [1 - (1 - d_i [i <= k]) (1 - u_i [i <= l])]
            = 1 + D_k + U_l - P_min(k,l),   D_k = sum_{i<=k} d_i, U_l = sum_{i<=l} u_i, P_j = sum_{i<=j} d_i u_i

tokens (the 1 is the target's own token after the accepted ones), and to cost

    C(k, l) = verify(1 + k + l) + draft(k) + overhead [k + l > 0],   draft(k) = k * draft_step

seconds (a block drafter, P-EAGLE, drafts its whole chain in one forward: draft(k) = draft_step [k > 0]),
where `verify` and `draft_step` are measured (eyas.decode.costs) and `overhead` is the
running mean of what speculative rounds took beyond their target and draft forwards (Python,
masks, cache trimming). A measurement taken once can be off (a noisy neighbour during the few
timed forwards, a CPU that clocks down later), and the decision between one verified token and
two hangs on it, so `verify` is also corrected online: each round's target forward is timed, and
the measured table is scaled by the running ratio of observed to measured seconds, one ratio for
plain steps and one for verifications of two or more tokens (costs given by the caller instead of
measured are taken as they are). The policy takes the (k, l) with the most tokens per second E/C; (0, 0) is a plain
target step, so a draft or a lookup is only verified when it is expected to pay for itself. With
the prefix sums each pair costs O(1).

The lookup branch is estimated separately for each length of the n-gram its proposal matched (a
continuation found after the context's last three tokens is accepted far more often than one found
after the last token alone: copying a signature or a docstring line versus a common word), so a
reliable match is verified while a weak one is not.

`d_i` is a product of conditional acceptances a_j = P(depth j accepted | depth j-1 accepted),
each estimated from discounted counts (weight 0.98 per new observation, so the estimate follows a
change of text within about 50 observations) with a prior of strength 2 centred on a_{j-1} (on 0.5
at depth 1), so a depth that is rarely reached borrows from the depth above it.

Observations come from verified rounds and, for free, from hindsight. Both proposers' candidates
are fixed given the context (the draft's top-1 chain, the looked-up tokens), and the tokens the
target commits follow its own distribution whatever was verified, so the chance that a
verification accepts at least i candidates equals the chance that the target's next i tokens are
those candidates: comparing an unverified proposal with the tokens committed after it is an
unbiased observation, greedy or sampled. Hence no probe rounds: a lookup proposal that was not
verified is scored against the tokens committed after it (one at a time), and the draft's first
token is scored at every anchor it reads (`first_token_hits`). While the draft
is not verified its anchors wait unread (no draft forward per round), and are read in one batch
after `READ_EVERY` idle rounds, a wait that doubles after each such read up to `READ_EVERY_MOST`
and starts over once a draft is verified; so a draft that does not pay costs one batched draft
forward per wait, and one that becomes useful is noticed within a wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from eyas.decode.costs import RoundCosts
from eyas.decode.rounds import matched_prefix
from eyas.decode.shapes import AutoShape

DECAY = 0.98
PRIOR_STRENGTH = 2.0
READ_EVERY = 16
READ_EVERY_MOST = 512


class AcceptanceEstimate:
    """Running conditional acceptance per depth of one proposer (see the module docstring)."""

    def __init__(self, depth: int) -> None:
        self.hits = [0.0] * depth
        self.trials = [0.0] * depth

    def update(self, proposed: int, matched: int) -> None:
        """Record a proposal of `proposed` tokens of which the first `matched` were (or would have been) accepted."""
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


class ExpectedTokens:
    """E(k, l) of the module docstring in O(1) per pair, from the reach lists (`draft[i-1]` = d_i)."""

    def __init__(self, draft: list[float], lookup: list[float]) -> None:
        self.draft = [0.0, *accumulate(draft)]  # D_k
        self.lookup = [0.0, *accumulate(lookup)]  # U_l
        self.both = [0.0, *accumulate(d * u for d, u in zip(draft, lookup))]  # P_j

    def __call__(self, k: int, l: int) -> float:
        """Return E(k, l); refuses (IndexError) k or l beyond the reach lists."""
        return 1.0 + self.draft[k] + self.lookup[l] - self.both[min(k, l)]


@dataclass(frozen=True)
class PolicyState:
    """What a policy plans with after a generation: the `costs` (measured or given), the observed/measured
    target-forward `scale` (plain steps, 2+ verified tokens) and the `overhead` seconds per round."""

    costs: RoundCosts
    scale: tuple[float, float]
    overhead: float | None


class ShapePolicy:
    """Chooses each round's (draft chain length, lookup length) and learns from verified rounds and hindsight."""

    def __init__(self, shape: AutoShape, costs: RoundCosts, correct_costs: bool = True, block: bool = False) -> None:
        """`correct_costs`: scale `costs` by the observed forward times (False: take them as given); `block`: the
        draft proposes its chain in one forward (P-EAGLE)."""
        self.shape, self.costs, self.correct_costs, self.block = shape, costs, correct_costs, block
        self.draft = AcceptanceEstimate(shape.max_chain)
        self.lookup: dict[int, AcceptanceEstimate] = {}  # by the n-gram length of the proposal
        self.overhead: float | None = None  # seconds; None until a speculative round was observed
        self._measured = [costs.verify(n) for n in range(1, 2 + shape.max_chain + shape.lookup)]  # [n-1]: n tokens
        self.scale = [1.0, 1.0]  # observed / measured target-forward seconds: plain steps, 2+ verified tokens
        self._unread = 0  # rounds since the draft last read its anchors
        self._read_wait = READ_EVERY

    def _lookup(self, ngram: int) -> AcceptanceEstimate:
        if ngram not in self.lookup:
            self.lookup[ngram] = AcceptanceEstimate(self.shape.lookup)
        return self.lookup[ngram]

    def choose(self, can_draft: bool, lookup_available: int, ngram: int) -> tuple[int, int]:
        """Return (k, l): draft tokens and lookup tokens to verify; `lookup_available` tokens were found
        after a match of an `ngram`-token suffix."""
        max_k = self.shape.max_chain if can_draft else 0
        max_l = min(self.shape.lookup, lookup_available)
        expected = ExpectedTokens(self.draft.reach(max_k), self._lookup(ngram).reach(max_l) if max_l else [])
        overhead, verify, scale = self.overhead or 0.0, self._measured, self.scale[1]
        best, best_rate = (0, 0), 1.0 / (verify[0] * self.scale[0])
        for k in range(max_k + 1):
            drafting = self._draft_seconds(k)
            for l in range(1 if k == 0 else 0, max_l + 1):
                rate = expected(k, l) / (verify[k + l] * scale + drafting + overhead)
                if rate > best_rate:
                    best, best_rate = (k, l), rate
        return best

    def _draft_seconds(self, k: int) -> float:
        """Return draft(k) of the module docstring: the seconds drafting a chain of `k` tokens costs."""
        return self.costs.draft_step * (min(k, 1) if self.block else k)

    def state(self) -> PolicyState:
        """Return the costs and corrections the policy plans with now."""
        return PolicyState(self.costs, (self.scale[0], self.scale[1]), self.overhead)

    def observe(self, k: int, k_matched: int, l: int, l_matched: int, ngram: int = 0,
                forward_seconds: float | None = None, round_seconds: float | None = None) -> None:
        """Learn from a round that verified `k` draft and `l` lookup tokens (found after an `ngram`-token
        match), the first `k_matched` and `l_matched` of which the target accepted; `forward_seconds`: its
        target forward's wall time; `round_seconds`: its whole wall time (what it took beyond its target
        forward and its `k` draft steps is the overhead)."""
        if forward_seconds is not None and self.correct_costs:
            plain = k + l == 0
            ratio = forward_seconds / self._measured[k + l]
            self.scale[0 if plain else 1] = self.scale[0 if plain else 1] * 0.9 + ratio * 0.1
        if k:
            self.draft.update(k, k_matched)
            self._unread, self._read_wait = 0, READ_EVERY
        else:
            self._unread += 1
        if l:
            self._lookup(ngram).update(l, l_matched)
        if round_seconds is not None and forward_seconds is not None and k + l:
            extra = max(round_seconds - forward_seconds - self._draft_seconds(k), 0.0)
            self.overhead = extra if self.overhead is None else self.overhead * 0.9 + extra * 0.1

    def read_due(self) -> bool:
        """Return whether the draft, not verified for a while, should read its waiting anchors now."""
        return self._unread >= self._read_wait

    def draft_read(self, hits: list[bool], idle: bool) -> None:
        """Learn from the draft's first-token hits at the anchors it read; `idle`: a read while no draft is
        verified (the wait before the next one doubles)."""
        for hit in hits:
            self.draft.update(1, int(hit))
        if idle:
            self._unread, self._read_wait = 0, min(2 * self._read_wait, READ_EVERY_MOST)

    def lookup_hindsight(self, proposed: int, matched: int, ngram: int) -> None:
        """Learn from a lookup proposal of `proposed` tokens (found after an `ngram`-token match) that was
        not verified, of which the first `matched` equal the tokens committed after it."""
        self._lookup(ngram).update(proposed, matched)


def first_token_hits(guesses: list[int], first_anchor: int, sequence: list[int], prompt_length: int) -> list[bool]:
    """Return, for the draft's top-1 target tokens `guesses` at anchors `first_anchor`, ..., whether each equals
    the committed token it predicts: anchor t predicts `sequence[t + 2]` (`sequence`: the prompt and the committed
    tokens). Predictions of prompt tokens are left out."""
    return [guess == sequence[first_anchor + row + 2] for row, guess in enumerate(guesses)
            if first_anchor + row + 2 >= prompt_length]


class LookupHindsight:
    """A lookup proposal that was not verified, held until the committed tokens settle how much of it the
    target would have accepted (one at a time, so observations do not overlap)."""

    def __init__(self) -> None:
        self.first = 0  # index of its first token in the generation
        self.tokens: list[int] = []
        self.ngram = 0  # the n-gram length its lookup matched

    def offer(self, first: int, tokens: list[int], ngram: int) -> None:
        """Hold `tokens` (proposed for generated positions `first`, ...) unless a proposal is held already."""
        if tokens and not self.tokens:
            self.first, self.tokens, self.ngram = first, tokens, ngram

    def settle(self, generated: list[int], policy: ShapePolicy) -> None:
        """Report the held proposal to `policy` once `generated` decides it (a mismatch, or all of it matched)."""
        if not self.tokens:
            return
        committed = generated[self.first:]
        matched = matched_prefix(self.tokens, committed)
        if matched < min(len(self.tokens), len(committed)) or matched == len(self.tokens):
            policy.lookup_hindsight(len(self.tokens), matched, self.ngram)
            self.tokens = []
