"""Speculative decoding with an EAGLE-3 draft, batch size 1: chains and EAGLE-2 dynamic trees.

One round: the draft proposes a tree after the last committed token (the root), the target
verifies the root and every node in one forward (tree attention mask, position = root + depth),
the accepted path plus one target token are committed, and both caches are trimmed to it.

Positions and anchors: committed tokens `x_0..x_m`; the target cache holds `x_0..x_{m-1}`; the
draft cache holds anchors `0..m-1`, anchor t reading the target's feature of `x_t` and the
token `x_{t+1}`. A node at depth d is drafted by an anchor at position `m-1+d` whose feature is
its parent's anchor output (the training-time-test layout, docs/train.md).

`Decoder(draft=None)` is the same loop without a draft: one target forward per token.

With `AutoShape` (eyas.decode.policy) each round verifies a greedy draft chain and a
prompt-lookup branch (eyas.decode.lookup) of lengths a cost model chooses, down to none (a plain
target step). While no draft is verified, the draft does not read the committed tokens: their
anchors wait, and are read in one batch when the policy asks (or `PENDING_MOST` wait) or drafting
resumes; every read scores the draft's first token at each anchor against the committed one, and an
unverified lookup proposal is scored against the tokens committed after it (hindsight, the
policy's docstring). The candidates are fixed given the context (top-1 draft tokens, looked-up
tokens), so under sampling the tree verifier keeps the target's distribution exactly.

Greedy generations also log, per committed token, the target's top-2 logits in the forward that chose
it (eyas.decode.choices), so a speculative output that differs from the target alone's can be explained
afterwards (eyas.decode.divergence).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from eyas.decode.choices import ChoiceLog, TargetChoices
from eyas.decode.costs import RoundCosts, measure_costs, settle
from eyas.decode.drafting import TreeDrafter, TreeShape, draft_chain, target_ids_of
from eyas.decode.lookup import PromptLookup
from eyas.decode.policy import AutoShape, ShapePolicy
from eyas.decode.runners import DraftRunner, DraftStep, TargetRunner, TargetStep
from eyas.decode.sampling import Sampling
from eyas.decode.tree import DraftTree, chain_union, is_chain
from eyas.decode.verify import Verdict, accept_greedy, accept_sampled_chain, accept_sampled_tree
from eyas.draft.model import Eagle3Draft
from eyas.models.capture import FeatureCapture
from eyas.models.parts import TargetParts


@dataclass
class Generation:
    """New tokens of one prompt (EOS included when produced) and how they were produced.

    `accepted[r]`: draft tokens accepted in verification round r (each round is one target
    forward and commits `accepted[r] + 1` tokens); the prefill forward, which produces the first
    token, is not a round. `seconds`: wall time of the whole generation, prefill included.
    With `AutoShape`, per round: `drafted` draft tokens and `looked_up` lookup tokens verified,
    `from_lookup` of the accepted tokens proposed by the lookup branch alone. Greedy: `choices`, the
    target's top-2 logits at every new token, in the forward that committed it (None when sampling).
    """

    tokens: list[int]
    accepted: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    looked_up: list[int] = field(default_factory=list)
    from_lookup: list[int] = field(default_factory=list)
    target_forwards: int = 0
    draft_forwards: int = 0
    seconds: float = 0.0
    choices: TargetChoices | None = None


PENDING_MOST = 512  # unread draft anchors (target features kept) before the draft reads them anyway


class _PendingAnchors:
    """Draft anchors whose target features are known, queued until the draft reads them (fixed shapes:
    right away; the auto shape: when it drafts next)."""

    def __init__(self) -> None:
        self.aux: list[torch.Tensor] = []  # [r, A*H_t] each
        self.tokens: list[int] = []
        self.positions: list[int] = []

    def add(self, aux: torch.Tensor, tokens: list[int], first_position: int) -> None:
        """Queue anchors reading `aux [r, A*H_t]` and the next tokens `tokens [r]`, from `first_position` on."""
        self.aux.append(aux)
        self.tokens += tokens
        self.positions += range(first_position, first_position + len(tokens))

    def read(self, drafter: DraftRunner) -> DraftStep:
        """Run the queued anchors through the draft (one forward) and return its output; the queue empties."""
        step = drafter.forward(drafter.fuse(torch.cat(self.aux)), torch.tensor(self.tokens), torch.tensor(self.positions))
        self.aux, self.tokens, self.positions = [], [], []
        return step


def first_token_hits(step: DraftStep, first_anchor: int, sequence: list[int], prompt_length: int,
                     target_ids: torch.Tensor) -> list[bool]:
    """Return, for the anchors of a draft read `step` (positions `first_anchor`, ...) but the last, whether
    the draft's top-1 token equals the committed token it predicts; anchor t predicts `sequence[t + 2]`
    (`sequence`: the prompt and the committed tokens). Predictions of prompt tokens are left out."""
    guesses = target_ids[step.logits[:-1].argmax(-1).cpu()].tolist()  # [n-1] target ids
    return [guess == sequence[first_anchor + row + 2] for row, guess in enumerate(guesses)
            if first_anchor + row + 2 >= prompt_length]


class _UnverifiedLookup:
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


class Decoder:
    """Generates with the target alone (`draft=None`, no shape), speculatively with an EAGLE-3 draft in a
    fixed tree or chain, or with the cost-aware `AutoShape` (with or without a draft)."""

    def __init__(self, parts: TargetParts, draft: Eagle3Draft | None, shape: TreeShape | AutoShape | None,
                 sampling: Sampling, eos_ids: set[int], seed: int = 0, costs: RoundCosts | None = None) -> None:
        """`costs`: the round costs `AutoShape` plans with, as given (default: measured at the first generation
        and corrected by the forwards observed, eyas.decode.policy).
        Refuses a draft without a shape and a fixed shape without a draft."""
        if draft is not None and shape is None:
            raise ValueError("a draft needs a tree, chain or auto shape")
        if isinstance(shape, TreeShape) and draft is None:
            raise ValueError(f"{shape.describe()} needs a draft")
        self.parts, self.draft, self.shape, self.sampling, self.eos_ids = parts, draft, shape, sampling, eos_ids
        self.generator = torch.Generator().manual_seed(seed)
        self.costs = costs
        self.policy: ShapePolicy | None = None  # AutoShape: created with the costs, kept across generations

    def _pick(self, logits: torch.Tensor) -> int:
        """Return the target's next token from `logits [V]` (argmax, or a draw)."""
        if self.sampling.greedy:
            return int(logits.argmax())
        return int(torch.multinomial(self.sampling.probs(logits.cpu()), 1, generator=self.generator))

    def generate(self, prompt: list[int], max_new_tokens: int) -> Generation:
        """Return the generation for `prompt` (token ids), at most `max_new_tokens`, stopping after an EOS."""
        started = time.perf_counter()
        log = ChoiceLog() if self.sampling.greedy else None
        if isinstance(self.shape, AutoShape):
            if self.draft is None or self.shape.max_chain == 0:
                result = self._adaptive(prompt, max_new_tokens, None, log)
            else:
                with FeatureCapture(self.parts, self.draft.config.aux_layer_ids) as capture:
                    result = self._adaptive(prompt, max_new_tokens, capture, log)
        elif self.draft is None:
            result = self._plain(prompt, max_new_tokens, log)
        else:
            with FeatureCapture(self.parts, self.draft.config.aux_layer_ids) as capture:
                result = self._speculative(prompt, max_new_tokens, capture, log)
        result.choices = log.finish() if log is not None else None
        result.seconds = time.perf_counter() - started
        return result

    def _done(self, tokens: list[int], max_new_tokens: int) -> bool:
        return generation_done(tokens, max_new_tokens, self.eos_ids)

    def _commit(self, tokens: list[int], new: list[int], max_new_tokens: int, logits: torch.Tensor, rows: list[int],
                log: ChoiceLog | None) -> None:
        """Commit `new` (`commit_tokens`); log the rows of `logits [n, V]` that chose them (`rows`, one per token)."""
        before = len(tokens)
        commit_tokens(tokens, new, max_new_tokens, self.eos_ids)
        if log is not None:
            log.add(logits[rows[:len(tokens) - before]])

    def _first(self, step: TargetStep, log: ChoiceLog | None) -> Generation:
        """Return the generation started with the prefill's token (from the last row of `step`), logged."""
        result = Generation([], target_forwards=1)
        self._commit(result.tokens, [self._pick(step.logits[-1])], 1, step.logits, [-1], log)
        return result

    def _plain(self, prompt: list[int], max_new_tokens: int, log: ChoiceLog | None) -> Generation:
        target = TargetRunner(self.parts, None)
        result = self._first(target.forward(torch.tensor(prompt), torch.arange(len(prompt)), last_only=True), log)
        while not self._done(result.tokens, max_new_tokens):
            position = len(prompt) + len(result.tokens) - 1
            step = target.forward(torch.tensor(result.tokens[-1:]), torch.tensor([position]))
            result.target_forwards += 1
            result.accepted.append(0)
            self._commit(result.tokens, [self._pick(step.logits[-1])], max_new_tokens, step.logits, [-1], log)
        return result

    def _speculative(self, prompt: list[int], max_new_tokens: int, capture: FeatureCapture,
                     log: ChoiceLog | None) -> Generation:
        assert self.draft is not None and self.shape is not None
        target, drafter = TargetRunner(self.parts, capture), DraftRunner(self.draft)
        grower = TreeDrafter(drafter, self.shape, self.sampling, self.generator)
        step = target.forward(torch.tensor(prompt), torch.arange(len(prompt)), last_only=True)
        result = self._first(step, log)
        assert step.aux is not None
        anchors = _PendingAnchors()
        anchors.add(step.aux, prompt[1:] + result.tokens, 0)  # anchors 0..m-1: the prompt's features, x_1..x_m
        root = anchors.read(drafter)
        result.draft_forwards += 1
        while not self._done(result.tokens, max_new_tokens):
            position = len(prompt) + len(result.tokens) - 1  # of the root, the last committed token
            committed_anchors = drafter.length
            tree = grower.grow(root, position - 1)
            verified = self._verify(target, tree, result.tokens[-1], position)
            result.target_forwards += 1
            verdict = self._verdict(tree, verified.logits)
            new = verdict.committed(tree)
            result.accepted.append(len(verdict.accepted))
            target.keep(len(tree) + 1, verdict.rows)
            drafter.crop(committed_anchors)
            assert verified.aux is not None
            anchors.add(verified.aux[verdict.rows], new, position)
            root = anchors.read(drafter)
            result.draft_forwards += 1
            self._commit(result.tokens, new, max_new_tokens, verified.logits, verdict.rows, log)
        result.draft_forwards += grower.forwards
        return result

    def _adaptive(self, prompt: list[int], max_new_tokens: int, capture: FeatureCapture | None,
                  log: ChoiceLog | None) -> Generation:
        """The cost-aware loop (module docstring); without `capture` there is no draft, lookup only."""
        assert isinstance(self.shape, AutoShape)
        target = TargetRunner(self.parts, capture)
        drafter = DraftRunner(self.draft) if capture is not None and self.draft is not None else None
        step = target.forward(torch.tensor(prompt), torch.arange(len(prompt)), last_only=True)
        result = self._first(step, log)
        lookup = PromptLookup()
        lookup.extend(prompt + result.tokens)
        pending = _PendingAnchors()
        if drafter is not None:
            assert step.aux is not None
            pending.add(step.aux, prompt[1:] + result.tokens, 0)  # anchors 0..m-1
        policy = self._policy_for(target, drafter, step.aux, result.tokens[0], len(prompt))
        target_ids = target_ids_of(drafter) if drafter is not None else None
        root: DraftStep | None = None  # the draft's latest read; its last row is the root anchor once all are read
        unverified = _UnverifiedLookup()

        def read_anchors(idle: bool) -> DraftStep:
            assert drafter is not None and target_ids is not None
            first = drafter.length
            read = pending.read(drafter)
            result.draft_forwards += 1
            policy.draft_read(first_token_hits(read, first, prompt + result.tokens, len(prompt), target_ids), idle)
            return read

        while not self._done(result.tokens, max_new_tokens):
            started = time.perf_counter()
            position = len(prompt) + len(result.tokens) - 1  # of the root, the last committed token
            if drafter is not None and pending.tokens and (policy.read_due() or len(pending.tokens) >= PENDING_MOST):
                root = read_anchors(idle=True)
            proposal, ngram = lookup.propose(self.shape.lookup)
            k, l = policy.choose(drafter is not None, len(proposal), ngram)
            chain: list[int] = []
            if k:
                assert drafter is not None and target_ids is not None
                if pending.tokens:
                    root = read_anchors(idle=False)
                assert root is not None
                committed_anchors = drafter.length
                chain = draft_chain(drafter, root, position - 1, k, target_ids)
                drafter.crop(committed_anchors)
                result.draft_forwards += k
            if not l:
                unverified.offer(len(result.tokens), proposal, ngram)
            tree = chain_union(chain, proposal[:l])
            verifying = time.perf_counter()
            verified = self._verify(target, tree, result.tokens[-1], position)
            settle(target.device)
            forward_seconds = time.perf_counter() - verifying
            result.target_forwards += 1
            # a plain step (nothing drafted) takes the target's token as the plain loop does
            verdict = self._verdict(tree, verified.logits) if len(tree) else Verdict([], self._pick(verified.logits[-1]))
            new = verdict.committed(tree)
            target.keep(len(tree) + 1, verdict.rows)
            if drafter is not None:
                assert verified.aux is not None
                pending.add(verified.aux[verdict.rows], new, position)
            lookup.extend(new)
            result.accepted.append(len(verdict.accepted))
            result.drafted.append(k)
            result.looked_up.append(l)
            result.from_lookup.append(sum(node >= len(chain) for node in verdict.accepted))
            policy.observe(k, matched_prefix(chain, new), l, matched_prefix(proposal[:l], new), ngram,
                           forward_seconds, time.perf_counter() - started - forward_seconds - k * policy.costs.draft_step)
            self._commit(result.tokens, new, max_new_tokens, verified.logits, verdict.rows, log)
            unverified.settle(result.tokens, policy)
        return result

    def _policy_for(self, target: TargetRunner, drafter: DraftRunner | None, prompt_aux: torch.Tensor | None,
                    token: int, position: int) -> ShapePolicy:
        """Return the decoder's policy; the first time, measure the costs (unless given) with the target's
        cache holding the prompt (the draft step is measured on the prompt's last feature alone)."""
        if self.policy is None:
            assert isinstance(self.shape, AutoShape)
            costs, measured = self.costs, self.costs is None
            if costs is None:
                feature = drafter.fuse(prompt_aux[-1:]) if drafter is not None and prompt_aux is not None else None
                costs = measure_costs(target, drafter, token, position, feature)
            self.costs, self.policy = costs, ShapePolicy(self.shape, costs, correct_costs=measured)
        return self.policy

    @staticmethod
    def _verify(target: TargetRunner, tree: DraftTree, root_token: int, position: int) -> TargetStep:
        """Return the target's forward over the root (at `position`) and the tree's nodes (a chain: causally)."""
        return target.forward(torch.tensor([root_token, *tree.tokens.tolist()]),
                              torch.cat([torch.tensor([position]), position + tree.depths]),
                              None if is_chain(tree) else Decoder._visibility(tree))

    @staticmethod
    def _visibility(tree: DraftTree) -> torch.Tensor:
        """Return `[n+1, n+1]` bool for the verification forward: everyone sees the root; nodes their ancestors."""
        n = len(tree)
        visible = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        visible[:, 0] = True
        visible[1:, 1:] = tree.ancestor_mask()
        return visible

    def _verdict(self, tree: DraftTree, logits: torch.Tensor) -> Verdict:
        if self.sampling.greedy:
            return accept_greedy(tree, logits.argmax(-1).cpu())
        probs = self.sampling.probs(logits.cpu())  # [n+1, V]
        if isinstance(self.shape, TreeShape) and self.shape.chain:
            return accept_sampled_chain(tree, probs, self.generator)
        return accept_sampled_tree(tree, probs, self.generator)
