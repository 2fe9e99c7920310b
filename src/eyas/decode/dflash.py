"""The DFlash draft's proposer: each round one draft forward drafts a block after the last committed token
(eyas.draft.dflash), verified as a chain.

The draft keeps each layer's keys and values of the context: the target's features of the committed tokens,
projected once, when the first block after them is asked for (`ContextCache`). A block is never cached: its
S slots sit at positions `m..m+S-1` after the last committed token `x_m` (slot 0 reads it, the others the
mask token) and see the whole context and each other, as training drafted them; slot s's logits give the
chain's token s, top-1 or drawn from its warped distribution (`block_chain`).
"""

from __future__ import annotations

import torch

from eyas.decode.drafting import block_chain, captured
from eyas.decode.proposers import ProposerTally
from eyas.decode.rounds import Context, Outcome, Proposal
from eyas.decode.runners import TargetForwards, TargetStep
from eyas.decode.sampling import Sampling
from eyas.draft.dflash import BlockAttention, DFlashDraft


class ContextCache:
    """The draft's per-layer context keys and values `[1, kv, L, d]`, and the features still waiting to join them."""

    def __init__(self, draft: DFlashDraft) -> None:
        self.draft = draft
        self.device = draft.lm_head.weight.device
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self._aux: list[torch.Tensor] = []  # [r, A*H_t] each
        self._positions: list[int] = []
        self.forwards = 0  # draft forwards (blocks) run so far

    def add(self, aux: torch.Tensor | None, first_position: int) -> None:
        """Queue the target's features `aux [r, A*H_t]` of the tokens at `first_position`, ... Refuses (ValueError)
        missing features: the target must run capturing the draft's layers."""
        self._aux.append(captured(aux))
        self._positions += range(first_position, first_position + len(self._aux[-1]))

    @torch.inference_mode()
    def block(self, anchor: int, position: int) -> torch.Tensor:
        """Return the logits `[S, V]` (float32) of the block whose slot 0 reads the committed token `anchor` at
        `position`, after the waiting features join the context (one draft forward in all)."""
        draft = self.draft
        if self._aux:
            context = draft.context(torch.cat(self._aux).to(self.device)[None])  # [1, r, H]
            added = draft.context_kv(context, torch.tensor([self._positions], device=self.device))
            self.kv = added if self.kv is None else [(torch.cat([k, k2], dim=2), torch.cat([v, v2], dim=2))
                                                     for (k, v), (k2, v2) in zip(self.kv, added)]
            self._aux, self._positions = [], []
        if self.kv is None:
            raise ValueError("dflash: a block needs the context's features first")
        S = draft.config.block_size or 0
        tokens = draft.block_tokens(torch.tensor([anchor], device=self.device))[None]  # [1, 1, S]
        positions = (position + torch.arange(S, device=self.device))[None, None]  # [1, 1, S]
        visible = torch.ones(1, 1, self.kv[0][0].shape[2], dtype=torch.bool, device=self.device)  # [1, 1, L]
        hidden = draft.blocks(tokens, positions, self.kv, BlockAttention(visible))  # [1, 1, S, H]
        self.forwards += 1
        return draft.logits(hidden[0, 0]).float()


class DFlashProposer:
    """A DFlash draft's chain of `length` tokens (at most `block_size - 1`) every round, drafted as one block."""

    def __init__(self, draft: DFlashDraft, length: int, sampling: Sampling, generator: torch.Generator) -> None:
        """`length`: at most `block_size - 1` (eyas.decode.decoder.shape_problem refuses more)."""
        self.draft, self.length, self.sampling, self.generator = draft, length, sampling, generator
        self.aux_layer_ids: list[int] | None = draft.config.aux_layer_ids

    def start(self, context: Context, prefill: TargetStep, target: TargetForwards) -> DFlashRun:
        """Return the run with the prompt's features queued (positions 0..m-1)."""
        cache = ContextCache(self.draft)
        cache.add(prefill.aux, 0)
        return DFlashRun(cache, self)


class DFlashRun:
    """One generation of a `DFlashProposer`."""

    def __init__(self, cache: ContextCache, proposer: DFlashProposer) -> None:
        self.cache, self.proposer = cache, proposer
        self.target_ids = torch.arange(proposer.draft.config.vocab_size)

    def propose(self, context: Context) -> Proposal:
        """Return the block after the last committed token as a chain."""
        p = self.proposer
        logits = self.cache.block(context.tokens[-1], context.root_position)  # [S, V]
        chain = block_chain(logits[1:p.length + 1], p.sampling, p.generator, self.target_ids, p.draft.config.vocab_size)
        return Proposal(chain, drafted=len(chain))

    def observe(self, context: Context, outcome: Outcome) -> None:
        """Queue the target's features of the committed tokens."""
        self.cache.add(outcome.aux, outcome.position)

    def finish(self) -> ProposerTally:
        return ProposerTally(self.cache.forwards)
