"""Speculative decoding with an EAGLE-3 draft, batch size 1: chains and EAGLE-2 dynamic trees.

One round: the draft proposes a tree after the last committed token (the root), the target
verifies the root and every node in one forward (tree attention mask, position = root + depth),
the accepted path plus one target token are committed, and both caches are trimmed to it.

Positions and anchors: committed tokens `x_0..x_m`; the target cache holds `x_0..x_{m-1}`; the
draft cache holds anchors `0..m-1`, anchor t reading the target's feature of `x_t` and the
token `x_{t+1}`. A node at depth d is drafted by an anchor at position `m-1+d` whose feature is
its parent's anchor output (the training-time-test layout, docs/train.md).

`Decoder(draft=None)` is the same loop without a draft: one target forward per token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from eyas.decode.drafting import TreeDrafter, TreeShape
from eyas.decode.runners import DraftRunner, TargetRunner
from eyas.decode.sampling import Sampling
from eyas.decode.tree import DraftTree
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
    """

    tokens: list[int]
    accepted: list[int] = field(default_factory=list)
    target_forwards: int = 0
    draft_forwards: int = 0
    seconds: float = 0.0


class Decoder:
    """Generates with the target alone (`draft=None`) or speculatively with an EAGLE-3 draft."""

    def __init__(self, parts: TargetParts, draft: Eagle3Draft | None, shape: TreeShape | None, sampling: Sampling,
                 eos_ids: set[int], seed: int = 0) -> None:
        if draft is not None and shape is None:
            raise ValueError("a draft needs a tree or chain shape")
        self.parts, self.draft, self.shape, self.sampling, self.eos_ids = parts, draft, shape, sampling, eos_ids
        self.generator = torch.Generator().manual_seed(seed)

    def _pick(self, logits: torch.Tensor) -> int:
        """Return the target's next token from `logits [V]` (argmax, or a draw)."""
        if self.sampling.greedy:
            return int(logits.argmax())
        return int(torch.multinomial(self.sampling.probs(logits.cpu()), 1, generator=self.generator))

    def generate(self, prompt: list[int], max_new_tokens: int) -> Generation:
        """Return the generation for `prompt` (token ids), at most `max_new_tokens`, stopping after an EOS."""
        started = time.perf_counter()
        if self.draft is None:
            result = self._plain(prompt, max_new_tokens)
        else:
            with FeatureCapture(self.parts, self.draft.config.aux_layer_ids) as capture:
                result = self._speculative(prompt, max_new_tokens, capture)
        result.seconds = time.perf_counter() - started
        return result

    def _done(self, tokens: list[int], max_new_tokens: int) -> bool:
        return len(tokens) >= max_new_tokens or (bool(tokens) and tokens[-1] in self.eos_ids)

    def _commit(self, tokens: list[int], new: list[int], max_new_tokens: int) -> None:
        """Append `new` up to the first EOS and within `max_new_tokens`."""
        for token in new:
            if self._done(tokens, max_new_tokens):
                return
            tokens.append(token)

    def _plain(self, prompt: list[int], max_new_tokens: int) -> Generation:
        target = TargetRunner(self.parts, None)
        step = target.forward(torch.tensor(prompt), torch.arange(len(prompt)), last_only=True)
        result = Generation([self._pick(step.logits[-1])], target_forwards=1)
        while not self._done(result.tokens, max_new_tokens):
            position = len(prompt) + len(result.tokens) - 1
            step = target.forward(torch.tensor(result.tokens[-1:]), torch.tensor([position]))
            result.target_forwards += 1
            result.accepted.append(0)
            result.tokens.append(self._pick(step.logits[-1]))
        return result

    def _speculative(self, prompt: list[int], max_new_tokens: int, capture: FeatureCapture) -> Generation:
        assert self.draft is not None and self.shape is not None
        target, drafter = TargetRunner(self.parts, capture), DraftRunner(self.draft)
        grower = TreeDrafter(drafter, self.shape, self.sampling, self.generator)
        step = target.forward(torch.tensor(prompt), torch.arange(len(prompt)), last_only=True)
        result = Generation([self._pick(step.logits[-1])], target_forwards=1)
        # draft anchors 0..m-1: target features of the prompt, tokens x_1..x_m
        anchor_tokens = torch.tensor(prompt[1:] + result.tokens)
        root = drafter.forward(drafter.fuse(step.aux), anchor_tokens, torch.arange(len(prompt)))
        result.draft_forwards += 1
        while not self._done(result.tokens, max_new_tokens):
            position = len(prompt) + len(result.tokens) - 1  # of the root, the last committed token
            committed_anchors = drafter.length
            tree = grower.grow(root, position - 1)
            verified = target.forward(torch.tensor([result.tokens[-1], *tree.tokens.tolist()]),
                                      torch.cat([torch.tensor([position]), position + tree.depths]),
                                      self._visibility(tree))
            result.target_forwards += 1
            verdict = self._verdict(tree, verified.logits)
            rows = [0] + [node + 1 for node in verdict.accepted]  # the root and the accepted nodes
            new = [int(tree.tokens[node]) for node in verdict.accepted] + [verdict.bonus]
            result.accepted.append(len(verdict.accepted))
            target.keep(len(tree) + 1, rows)
            drafter.crop(committed_anchors)
            assert verified.aux is not None
            root = drafter.forward(drafter.fuse(verified.aux[rows]), torch.tensor(new),
                                   position + torch.arange(len(new)))
            result.draft_forwards += 1
            self._commit(result.tokens, new, max_new_tokens)
        result.draft_forwards += grower.forwards
        return result

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
        if self.shape is not None and self.shape.chain:
            return accept_sampled_chain(tree, probs, self.generator)
        return accept_sampled_tree(tree, probs, self.generator)
