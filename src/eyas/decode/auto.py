"""The auto shape's proposer: per round, a greedy draft chain and a prompt-lookup branch of the lengths the
cost-aware policy chooses (eyas.decode.policy: the derivation), verified as one tree that shares their
common prefix; lengths 0 and 0 make the round a plain target step.

While no draft is verified, the draft does not read the committed tokens: their anchors wait, and are read
in one batch when the policy asks (or `PENDING_MOST` wait) or drafting resumes; every read scores the
draft's first token at each anchor against the committed one, and an unverified lookup proposal is scored
against the tokens committed after it (hindsight, in eyas.decode.policy). The candidates are fixed given
the context (top-1 draft tokens, looked-up tokens), so under sampling the tree verifier keeps the target's
distribution exactly.

A P-EAGLE draft's chain of k tokens is its block (`DraftAnchors.block`): one forward, reading the waiting
anchors too, whatever k is; the policy is told so and prices the chain accordingly.
"""

from __future__ import annotations

from dataclasses import dataclass

from eyas.decode.costs import RoundCosts, measure_costs
from eyas.decode.drafting import DraftAnchors, draft_chain
from eyas.decode.lookup import PromptLookup
from eyas.decode.policy import LookupHindsight, ShapePolicy, first_token_hits
from eyas.decode.proposers import ProposerTally
from eyas.decode.rounds import Context, Outcome, Proposal, matched_prefix
from eyas.decode.runners import DraftRunner, DraftStep, TargetForwards, TargetStep
from eyas.decode.shapes import AutoShape
from eyas.decode.tree import chain_union
from eyas.draft.model import Eagle3Draft

PENDING_MOST = 512  # unread draft anchors (target features kept) before the draft reads them anyway


class AutoProposer:
    """The auto shape with a draft (chains of at most `shape.max_chain` tokens; none when that is 0) and the
    prompt lookup; the policy is created at the first generation, from the costs given or measured then, and
    kept (estimates and cost corrections) across generations."""

    def __init__(self, shape: AutoShape, draft: Eagle3Draft | None, costs: RoundCosts | None) -> None:
        self.shape = shape
        self.draft = draft if shape.max_chain else None
        self.aux_layer_ids: list[int] | None = self.draft.config.aux_layer_ids if self.draft is not None else None
        self.costs = costs
        self.policy: ShapePolicy | None = None

    def start(self, context: Context, prefill: TargetStep, target: TargetForwards) -> AutoRun:
        """Return the run of one generation, the prompt's draft anchors queued (measuring the costs first, the
        first time, with the target's cache holding the prompt; the draft step, in a draft cache of its own, on the
        prompt's last feature)."""
        anchors = None
        if self.draft is not None:
            anchors = DraftAnchors(self.draft)
            anchors.add(prefill.aux, context.prompt[1:] + context.tokens, 0)  # anchors 0..m-1
        return AutoRun(self.shape, self._policy(context, prefill, target), anchors, context)

    def _policy(self, context: Context, prefill: TargetStep, target: TargetForwards) -> ShapePolicy:
        if self.policy is None:
            costs = self.costs
            if costs is None:
                runner = DraftRunner(self.draft) if self.draft is not None else None
                feature = runner.fuse(prefill.aux[-1:]) if runner is not None and prefill.aux is not None else None
                costs = measure_costs(target, runner, context.tokens[0], len(context.prompt), feature)
            block = self.draft is not None and self.draft.config.parallel
            self.policy = ShapePolicy(self.shape, costs, correct_costs=self.costs is None, block=block)
        return self.policy


@dataclass(frozen=True)
class _Chosen:
    """What a round verified: the draft `chain`, the `looked_up` tokens, and the n-gram length their lookup matched."""

    chain: list[int]
    looked_up: list[int]
    ngram: int


class AutoRun:
    """One generation of the auto shape."""

    def __init__(self, shape: AutoShape, policy: ShapePolicy, anchors: DraftAnchors | None, context: Context) -> None:
        self.shape, self.policy, self.anchors = shape, policy, anchors
        self.lookup = PromptLookup()
        self.lookup.extend(context.sequence())
        self.hindsight = LookupHindsight()
        self.chosen = _Chosen([], [], 0)

    def propose(self, context: Context) -> Proposal:
        """Return the union of the draft chain and the lookup branch of the lengths the policy chooses."""
        anchors = self.anchors
        if anchors is not None and anchors.waiting and (self.policy.read_due() or anchors.waiting >= PENDING_MOST):
            self._read(anchors, context, idle=True)
        found, ngram = self.lookup.propose(self.shape.lookup)
        k, l = self.policy.choose(anchors is not None, len(found), ngram)
        chain: list[int] = []
        if k and anchors is not None and anchors.runner.draft.config.parallel:
            first = anchors.first_waiting
            logits = anchors.block(k)  # [k, N]
            if first is not None:
                self._score(anchors, first, anchors.root, context, idle=False)
            chain = anchors.target_ids[logits.argmax(-1).cpu()].tolist()
        elif k and anchors is not None:
            if anchors.waiting:
                self._read(anchors, context, idle=False)
            committed = anchors.runner.length
            chain = draft_chain(anchors.runner, anchors.root, context.root_position - 1, k, anchors.target_ids)
            anchors.runner.crop(committed)
        if not l:
            self.hindsight.offer(len(context.tokens), found, ngram)
        self.chosen = _Chosen(chain, found[:l], ngram)
        return Proposal(chain_union(chain, found[:l]), drafted=k, looked_up=l, lookup_from=len(chain))

    def _read(self, anchors: DraftAnchors, context: Context, idle: bool) -> None:
        """Read the waiting anchors and score the draft's first token at each in hindsight."""
        first, step = anchors.read()
        self._score(anchors, first, step, context, idle)

    def _score(self, anchors: DraftAnchors, first: int, step: DraftStep, context: Context, idle: bool) -> None:
        """Score the draft's first token at each anchor of `step` (read from position `first` on) in hindsight."""
        guesses = anchors.target_ids[step.logits[:-1].argmax(-1).cpu()].tolist()  # [n-1] target ids
        self.policy.draft_read(first_token_hits(guesses, first, context.sequence(), len(context.prompt)), idle)

    def observe(self, context: Context, outcome: Outcome) -> None:
        """Queue the committed tokens' anchors, extend the lookup, and teach the policy the round and hindsight."""
        if self.anchors is not None:
            self.anchors.add(outcome.aux, outcome.committed, outcome.position)
        self.lookup.extend(outcome.committed)
        chosen = self.chosen
        self.policy.observe(len(chosen.chain), matched_prefix(chosen.chain, outcome.committed), len(chosen.looked_up),
                            matched_prefix(chosen.looked_up, outcome.committed), chosen.ngram, outcome.forward_seconds,
                            outcome.seconds)
        self.hindsight.settle(context.tokens, self.policy)

    def finish(self) -> ProposerTally:
        forwards = self.anchors.runner.forwards if self.anchors is not None else 0
        return ProposerTally(forwards, self.policy.state())
