"""What proposes each round's candidates: the `Proposer` protocol, the target alone (nothing proposed), the
EAGLE-3 draft's fixed tree or chain, and the P-EAGLE draft's block (a chain drafted in one forward). The
cost-aware auto shape, which composes a draft chain and a prompt-lookup branch, is eyas.decode.auto.

Every proposer's candidates are verified by the same round (eyas.decode.decoder), so its greedy output is
the target's own. Under sampling a proposal is exact when its candidates are fixed given the context
(top-1 or top-k tokens: the tree verifier), or when each was drawn from a distribution it carries
(`DraftTree.draft_probs`: the chain verifier), eyas.decode.verify.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from eyas.decode.drafting import DraftAnchors, TreeDrafter, block_chain
from eyas.decode.policy import PolicyState
from eyas.decode.rounds import NOTHING, Context, Outcome, Proposal
from eyas.decode.runners import TargetForwards, TargetStep
from eyas.decode.sampling import Sampling
from eyas.decode.shapes import TreeShape
from eyas.draft.model import Eagle3Draft


@dataclass(frozen=True)
class ProposerTally:
    """What a proposer spent and learned over one generation: its `draft_forwards`, and the cost-aware
    policy's state (None without one)."""

    draft_forwards: int = 0
    policy: PolicyState | None = None


class ProposerRun(Protocol):
    """One generation's proposing: candidates per round, learning from what the target committed."""

    def propose(self, context: Context) -> Proposal:
        """Return the candidates after the last committed token."""

    def observe(self, context: Context, outcome: Outcome) -> None:
        """Learn from a verified round; `context.tokens` already holds its committed tokens."""

    def finish(self) -> ProposerTally:
        """End the generation; return what it spent and learned."""


class Proposer(Protocol):
    """Proposes the candidates of every round of a decoder's generations.

    `aux_layer_ids`: the target layers whose features the proposer reads (None: it reads none, and the target
    runs without capturing). The proposer is kept across generations (what it learns may be too); `start`
    begins one generation after the prefill.
    """

    aux_layer_ids: list[int] | None

    def start(self, context: Context, prefill: TargetStep, target: TargetForwards) -> ProposerRun:
        """Return the run of one generation: `context` holds the prompt and the prefill's token, `prefill` the
        prompt's forward (its features of every prompt token when the proposer reads them), `target` the
        runner, whose cache holds the prompt."""


class NothingProposer:
    """The target alone: every round is a plain target step."""

    aux_layer_ids: list[int] | None = None

    def start(self, context: Context, prefill: TargetStep, target: TargetForwards) -> NothingProposer:
        return self

    def propose(self, context: Context) -> Proposal:
        return NOTHING

    def observe(self, context: Context, outcome: Outcome) -> None:
        """Nothing to learn."""

    def finish(self) -> ProposerTally:
        return ProposerTally()


class TreeProposer:
    """The EAGLE-3 draft's tree (EAGLE-2's dynamic tree) or chain of a fixed shape, every round."""

    def __init__(self, draft: Eagle3Draft, shape: TreeShape, sampling: Sampling, generator: torch.Generator) -> None:
        self.draft, self.shape, self.sampling, self.generator = draft, shape, sampling, generator
        self.aux_layer_ids: list[int] | None = draft.config.aux_layer_ids

    def start(self, context: Context, prefill: TargetStep, target: TargetForwards) -> TreeRun:
        """Return the run with the prompt's anchors queued (`prompt_anchors`)."""
        anchors = prompt_anchors(self.draft, context, prefill)
        return TreeRun(anchors, TreeDrafter(anchors, self.shape, self.sampling, self.generator))


def prompt_anchors(draft: Eagle3Draft, context: Context, prefill: TargetStep) -> DraftAnchors:
    """Return the draft's anchors of one generation with the prompt's queued (0..m-1: the prompt's features,
    tokens x_1..x_m)."""
    anchors = DraftAnchors(draft)
    anchors.add(prefill.aux, context.prompt[1:] + context.tokens, 0)
    return anchors


class AnchoredRun:
    """What every draft proposer's generation does after a round: the draft reads the committed tokens' anchors
    in one forward when the next round asks for a draft (eyas.decode.drafting), so the last round's anchors are
    never read."""

    def __init__(self, anchors: DraftAnchors) -> None:
        self.anchors = anchors

    def observe(self, context: Context, outcome: Outcome) -> None:
        """Queue the anchors of the committed tokens, reading the target's features of them."""
        self.anchors.add(outcome.aux, outcome.committed, outcome.position)

    def finish(self) -> ProposerTally:
        return ProposerTally(self.anchors.runner.forwards)


class TreeRun(AnchoredRun):
    """One generation of a `TreeProposer`."""

    def __init__(self, anchors: DraftAnchors, grower: TreeDrafter) -> None:
        super().__init__(anchors)
        self.grower = grower

    def propose(self, context: Context) -> Proposal:
        """Return the grown tree; its anchors leave the draft cache again."""
        _, root = self.anchors.read()
        committed = self.anchors.runner.length
        tree = self.grower.grow(root, context.root_position - 1)
        self.anchors.runner.crop(committed)
        return Proposal(tree, drafted=len(tree))


class BlockProposer:
    """A P-EAGLE draft's block of `length` tokens every round: one draft forward reads the committed tokens'
    anchors and drafts the block (eyas.decode.drafting), verified as a chain (top-1 tokens, or drawn from each
    slot's distribution under sampling)."""

    def __init__(self, draft: Eagle3Draft, length: int, sampling: Sampling, generator: torch.Generator) -> None:
        self.draft, self.length, self.sampling, self.generator = draft, length, sampling, generator
        self.aux_layer_ids: list[int] | None = draft.config.aux_layer_ids

    def start(self, context: Context, prefill: TargetStep, target: TargetForwards) -> BlockRun:
        return BlockRun(prompt_anchors(self.draft, context, prefill), self)


class BlockRun(AnchoredRun):
    """One generation of a `BlockProposer`."""

    def __init__(self, anchors: DraftAnchors, proposer: BlockProposer) -> None:
        super().__init__(anchors)
        self.proposer = proposer

    def propose(self, context: Context) -> Proposal:
        """Return the block as a chain."""
        p = self.proposer
        logits = self.anchors.block(p.length)  # [K, N]
        chain = block_chain(logits, p.sampling, p.generator, self.anchors.target_ids, p.draft.config.vocab_size)
        return Proposal(chain, drafted=len(chain))
