"""Decoding, batch size 1: one round loop for every way of proposing (eyas.decode.proposers).

The prefill forward over the prompt gives the first token. Then every round: the proposer proposes
candidates after the last committed token (the root); the target verifies the root and every
candidate in one forward (tree attention mask, position = root + depth; eyas.decode.visibility adds
the target's own windows); the verifier accepts a path and adds the target's next token
(eyas.decode.verify); the target's cache keeps that path; the tokens are committed up to the budget
or an EOS; the proposer observes what was committed and the target's features of it. A round that
proposes nothing is one plain target step, so the target alone, a fixed EAGLE-3 tree or chain, the
cost-aware auto shape and a replay against a recorded continuation (eyas.decode.recorded) all run
this loop.

Greedy generations also log, per committed token, the target's top-2 logits in the forward that chose
it (eyas.decode.choices), so a speculative output that differs from the target alone's can be explained
afterwards (eyas.decode.divergence).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from eyas.decode.auto import AutoProposer
from eyas.decode.choices import ChoiceLog, TargetChoices
from eyas.decode.costs import RoundCosts, settle
from eyas.decode.policy import PolicyState
from eyas.decode.dflash import DFlashProposer
from eyas.decode.proposers import BlockProposer, NothingProposer, Proposer, TreeProposer
from eyas.decode.recorded import Continuation
from eyas.decode.rounds import Context, Outcome, Proposal, commit_tokens, generation_done
from eyas.decode.runners import TargetForwards, TargetRunner, TargetStep
from eyas.decode.sampling import Sampling
from eyas.decode.shapes import AutoShape, TreeShape
from eyas.decode.tree import DraftTree, is_chain
from eyas.decode.verify import Verdict, accept_greedy, accept_sampled_chain, accept_sampled_tree
from eyas.draft.config import DraftConfig
from eyas.draft.dflash import DFlashDraft
from eyas.draft.model import Eagle3Draft
from eyas.models.capture import FeatureCapture
from eyas.models.parts import TargetParts


@dataclass
class Generation:
    """New tokens of one prompt (EOS included when produced) and how they were produced.

    Per verification round r (one target forward; the prefill, which produces the first token, is not a
    round): `accepted[r]` candidates accepted (the round commits `accepted[r] + 1` tokens), `drafted[r]`
    candidates from a draft model and `looked_up[r]` from the prompt lookup, `from_lookup[r]` accepted
    candidates the lookup alone proposed. `seconds`: wall time of the whole generation, prefill included.
    `policy`: the auto shape's costs and corrections after it (None otherwise). Greedy: `choices`, the
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
    policy: PolicyState | None = None

    def add_round(self, proposal: Proposal, verdict: Verdict) -> None:
        """Record a verification round."""
        self.target_forwards += 1
        self.accepted.append(len(verdict.accepted))
        self.drafted.append(proposal.drafted)
        self.looked_up.append(proposal.looked_up)
        self.from_lookup.append(proposal.from_lookup(verdict.accepted))


def shape_problem(config: DraftConfig, shape: TreeShape | AutoShape) -> str | None:
    """Return why a draft of `config` cannot propose `shape` (None: it can): a tree of a block drafter (P-EAGLE,
    DFlash: one candidate per position), a DFlash chain longer than its block drafts, and the auto shape's draft
    branch of a DFlash draft. Needs no weights: `eyas eval` asks before any load."""
    if isinstance(shape, AutoShape):
        if config.family == "dflash" and shape.max_chain:
            return ("the auto shape drafts with an eagle3 or peagle draft; give a dflash draft --chain K "
                    "(or --max-chain 0 for the prompt lookup alone)")
        return None
    if config.parallel and not shape.chain:
        return f"a {config.family} draft drafts a chain in one forward, not a {shape.describe()}; give --chain K or --shape auto"
    if config.block_size is not None and shape.depth > config.block_size - 1:
        return (f"a dflash draft of block size {config.block_size} drafts at most {config.block_size - 1} tokens, "
                f"not a chain of {shape.depth}")
    return None


def proposer_for(draft: Eagle3Draft | DFlashDraft | None, shape: TreeShape | AutoShape | None, sampling: Sampling,
                 generator: torch.Generator, costs: RoundCosts | None) -> Proposer:
    """Return the proposer of `shape` (None: the target alone): a P-EAGLE or DFlash draft's chain is a block drafted
    in one forward. Refuses a draft without a shape, a fixed shape without a draft, a tree of a P-EAGLE or DFlash
    draft, and the auto shape's draft branch with a DFlash draft."""
    if shape is None:
        if draft is not None:
            raise ValueError("a draft needs a tree, chain or auto shape")
        return NothingProposer()
    if draft is not None and (problem := shape_problem(draft.config, shape)):
        raise ValueError(problem)
    if isinstance(shape, AutoShape):
        return AutoProposer(shape, None if isinstance(draft, DFlashDraft) else draft, costs)
    if draft is None:
        raise ValueError(f"{shape.describe()} needs a draft")
    if isinstance(draft, DFlashDraft):
        return DFlashProposer(draft, shape.depth, sampling, generator)
    if draft.config.parallel:
        return BlockProposer(draft, shape.depth, sampling, generator)
    return TreeProposer(draft, shape, sampling, generator)


class Decoder:
    """Generates with the target alone (no draft, no shape), speculatively with an EAGLE-3 draft in a fixed
    tree or chain, or with the cost-aware `AutoShape` (with or without a draft); the target is a model, or a
    recorded greedy continuation (`Continuation`, greedy only) that answers verification without one."""

    def __init__(self, target: TargetParts | Continuation, draft: Eagle3Draft | DFlashDraft | None,
                 shape: TreeShape | AutoShape | None, sampling: Sampling, eos_ids: set[int], seed: int = 0,
                 costs: RoundCosts | None = None, proposer: Proposer | None = None) -> None:
        """`costs`: the round costs `AutoShape` plans with, as given (default: measured at the first generation
        and corrected by the forwards observed, eyas.decode.policy). `proposer`: one of the caller's own, instead
        of a draft and a shape. Refuses what `proposer_for` refuses, a proposer beside a draft or a shape, and a
        recorded target with sampling."""
        if isinstance(target, Continuation) and not sampling.greedy:
            raise ValueError("a recorded continuation answers greedy decoding only")
        if proposer is not None and (draft is not None or shape is not None):
            raise ValueError("give a proposer, or a draft and a shape, not both")
        self.target, self.sampling, self.eos_ids = target, sampling, eos_ids
        self.generator = torch.Generator().manual_seed(seed)
        if proposer is None:
            proposer = proposer_for(draft, shape, sampling, self.generator, costs)
        self.proposer = proposer

    def generate(self, prompt: list[int], max_new_tokens: int) -> Generation:
        """Return the generation for `prompt` (token ids), at most `max_new_tokens`, stopping after an EOS."""
        started = time.perf_counter()
        context, log = Context(prompt), ChoiceLog() if self.sampling.greedy else None
        result = Generation(context.tokens, target_forwards=1)  # the committed tokens are the generation's
        with self._target_runner() as target:
            prefill = target.forward(torch.tensor(prompt), torch.arange(len(prompt)), last_only=True)
            self._commit(context, [self._pick(prefill.logits[-1])], 1, prefill.logits, [-1], log)
            run = self.proposer.start(context, prefill, target)
            while not generation_done(context.tokens, max_new_tokens, self.eos_ids):
                round_started = time.perf_counter()
                position, proposal = context.root_position, run.propose(context)
                verified, forward_seconds = self._verify(target, proposal.tree, context.tokens[-1], position)
                verdict = self._verdict(proposal.tree, verified.logits)
                rows, committed = verdict.rows, verdict.committed(proposal.tree)
                target.keep(len(proposal.tree) + 1, rows)
                self._commit(context, committed, max_new_tokens, verified.logits, rows, log)
                result.add_round(proposal, verdict)
                aux = verified.aux[rows] if verified.aux is not None else None  # [len(committed), A*H]
                run.observe(context, Outcome(position, proposal, verdict, committed, aux, forward_seconds,
                                             time.perf_counter() - round_started))
            tally = run.finish()
        result.draft_forwards, result.policy = tally.draft_forwards, tally.policy
        result.choices = log.finish() if log is not None else None
        result.seconds = time.perf_counter() - started
        return result

    @contextmanager
    def _target_runner(self) -> Iterator[TargetForwards]:
        """Yield the target's runner for one generation, capturing the features the proposer reads."""
        layers = self.proposer.aux_layer_ids
        if isinstance(self.target, Continuation):
            yield self.target.runner(layers)
        elif layers is None:
            yield TargetRunner(self.target, None)
        else:
            with FeatureCapture(self.target, layers) as capture:
                yield TargetRunner(self.target, capture)

    def _pick(self, logits: torch.Tensor) -> int:
        """Return the target's next token from `logits [V]` (argmax, or a draw)."""
        if self.sampling.greedy:
            return int(logits.argmax())
        return int(torch.multinomial(self.sampling.probs(logits.cpu()), 1, generator=self.generator))

    def _commit(self, context: Context, new: list[int], max_new_tokens: int, logits: torch.Tensor, rows: list[int],
                log: ChoiceLog | None) -> None:
        """Commit `new` (`commit_tokens`); log the rows of `logits [n, V]` that chose them (`rows`, one per token)."""
        before = len(context.tokens)
        commit_tokens(context.tokens, new, max_new_tokens, self.eos_ids)
        if log is not None:
            log.add(logits[rows[:len(context.tokens) - before]])

    @staticmethod
    def _verify(target: TargetForwards, tree: DraftTree, root_token: int, position: int) -> tuple[TargetStep, float]:
        """Return the target's forward over the root (at `position`) and the tree's nodes (a chain: causally),
        and its wall seconds."""
        started = time.perf_counter()
        if len(tree):
            step = target.forward(torch.tensor([root_token, *tree.tokens.tolist()]),
                                  torch.cat([torch.tensor([position]), position + tree.depths]),
                                  None if is_chain(tree) else Decoder._visibility(tree))
        else:  # a plain step
            step = target.forward(torch.tensor([root_token]), torch.tensor([position]))
        settle(target.device)
        return step, time.perf_counter() - started

    @staticmethod
    def _visibility(tree: DraftTree) -> torch.Tensor:
        """Return `[n+1, n+1]` bool for the verification forward: everyone sees the root; nodes their ancestors."""
        n = len(tree)
        visible = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        visible[:, 0] = True
        visible[1:, 1:] = tree.ancestor_mask()
        return visible

    def _verdict(self, tree: DraftTree, logits: torch.Tensor) -> Verdict:
        """Return the verdict on `tree` from the verification's `logits [n+1, V]`: greedy, the sampled-chain rule
        for candidates drawn from the distributions they carry, else the tree rule for fixed candidates."""
        if not len(tree):
            return Verdict([], self._pick(logits[-1]))
        if self.sampling.greedy:
            return accept_greedy(tree, logits.argmax(-1).cpu())
        probs = self.sampling.probs(logits.cpu())  # [n+1, V]
        if tree.draft_probs is not None:
            return accept_sampled_chain(tree, probs, self.generator)
        return accept_sampled_tree(tree, probs, self.generator)
