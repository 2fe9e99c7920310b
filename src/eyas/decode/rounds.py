"""One verification round's vocabulary: the context, what a proposer proposes, what the round
committed, and the helpers that compare proposals and cut a generation at its budget or EOS.

A round (eyas.decode.decoder): the proposer proposes candidates after the last committed token
(the root); the target verifies the root and every candidate in one forward; the verifier accepts
a path and adds the target's own next token; the target's cache keeps that path; the tokens are
committed; the proposer observes what was committed (with the target's features of it when it
reads them). A proposer that proposes nothing makes the round a plain target step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from eyas.decode.tree import DraftTree, chain_union
from eyas.decode.verify import Verdict


@dataclass
class Context:
    """The prompt and the tokens committed after it; `tokens` grows as rounds commit."""

    prompt: list[int]
    tokens: list[int] = field(default_factory=list)

    @property
    def root_position(self) -> int:
        """The position of the last committed token, the root of the next round."""
        return len(self.prompt) + len(self.tokens) - 1

    def sequence(self) -> list[int]:
        """Return the prompt followed by the committed tokens."""
        return self.prompt + self.tokens


@dataclass(frozen=True)
class Proposal:
    """The candidates of one round: `tree` (empty: a plain target step). `drafted` tokens came from a draft
    model and `looked_up` from the prompt lookup (a union shares their common prefix, so the two may overlap);
    nodes from `lookup_from` on were proposed by the lookup alone."""

    tree: DraftTree
    drafted: int = 0
    looked_up: int = 0
    lookup_from: int | None = None

    def from_lookup(self, accepted: list[int]) -> int:
        """Return how many of the `accepted` nodes the lookup alone proposed."""
        if self.lookup_from is None:
            return 0
        return sum(node >= self.lookup_from for node in accepted)


NOTHING = Proposal(chain_union([], []))  # the empty proposal: the round is one plain target step


@dataclass(frozen=True)
class Outcome:
    """What a round did: its root's `position`, the `proposal` and `verdict`, the tokens it `committed` (accepted
    then the target's own, before any budget or EOS cut), `aux [len(committed), A*H]` the target's features of the
    root and the accepted nodes (None when the proposer reads none), its target forward's `forward_seconds` and
    the round's wall `seconds` from proposing to committing."""

    position: int
    proposal: Proposal
    verdict: Verdict
    committed: list[int]
    aux: torch.Tensor | None
    forward_seconds: float
    seconds: float


def matched_prefix(proposed: list[int], committed: list[int]) -> int:
    """Return how many leading tokens of `proposed` equal those of `committed`."""
    count = 0
    for want, got in zip(proposed, committed):
        if want != got:
            break
        count += 1
    return count


def generation_done(tokens: list[int], max_new_tokens: int, eos_ids: set[int]) -> bool:
    """Return whether a generation of new `tokens` has stopped: at `max_new_tokens`, or after an EOS."""
    return len(tokens) >= max_new_tokens or (bool(tokens) and tokens[-1] in eos_ids)


def commit_tokens(tokens: list[int], new: list[int], max_new_tokens: int, eos_ids: set[int]) -> None:
    """Append `new` to `tokens` up to the first EOS and within `max_new_tokens`."""
    for token in new:
        if generation_done(tokens, max_new_tokens, eos_ids):
            return
        tokens.append(token)
