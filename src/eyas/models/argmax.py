"""The target's greedy token at every position, from the last layer's output before the final norm.

`TargetArgmax(last)` is the argmax over the target's whole vocabulary of float32 logits
`lm_head(final_norm(last))`: the final norm runs in float32, the LM-head weights are used as given
(upcast to float32 block by block, so no float32 copy of the head is held), and the final-logit soft
cap is left out (it is monotone). Ties go to the lowest token id, as `torch.argmax`. It is the one
definition of the label the draft is scored against: `eyas extract` stores it per token (the store's
`argmax` tensor, computed from `last` as stored) and training recomputes it this way from a store made
before that (`eyas.train.sources`).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

CHUNK_ELEMENTS = 1 << 26


class TargetArgmax(nn.Module):
    """The target's final norm and LM head, reduced to the full-vocabulary argmax of stored `last` states."""

    def __init__(self, final_norm: nn.Module, lm_head_weight: torch.Tensor, chunk_elements: int = CHUNK_ELEMENTS) -> None:
        """Keep `lm_head_weight [V, H]` as it is (shared, not copied) and a float32 copy of `final_norm` (the
        module itself when it already holds float32 weights); `chunk_elements` bounds each float32 logits block."""
        super().__init__()
        floats = all(p.dtype == torch.float32 for p in final_norm.parameters())
        self.final_norm = (final_norm if floats else copy.deepcopy(final_norm).float()).requires_grad_(False)
        self.register_buffer("weight", lm_head_weight.detach(), persistent=False)  # [V, H]
        vocab, hidden = lm_head_weight.shape
        self.chunk_rows = max(1, chunk_elements // vocab)
        self.vocab_block = max(1, chunk_elements // hidden)

    @property
    def vocab_size(self) -> int:
        return int(self.weight.shape[0])

    @torch.no_grad()
    def forward(self, last: torch.Tensor) -> torch.Tensor:
        """Return the target ids `[...]` (int64, on the head's device) of the largest logit at each position of
        `last [..., H]`; the logits exist one `[chunk_rows, vocab_block]` block at a time, and each block of
        the head is upcast once per call."""
        norm_device = next(self.final_norm.parameters(), self.weight).device  # a device map may part norm and head
        normed = self.final_norm(last.to(norm_device, torch.float32)).to(self.weight.device)  # [..., H]
        flat = normed.reshape(-1, normed.shape[-1])  # [M, H]
        best = torch.full((len(flat),), float("-inf"), device=flat.device)  # [M]
        index = torch.zeros(len(flat), dtype=torch.long, device=flat.device)  # [M]
        for start in range(0, self.vocab_size, self.vocab_block):
            block = self.weight[start:start + self.vocab_block].float()  # [C, H]
            for first in range(0, len(flat), self.chunk_rows):
                rows = slice(first, first + self.chunk_rows)
                value, at = (flat[rows] @ block.T).max(-1)  # [R], [R]: the first maximum within the block
                better = value > best[rows]  # strictly: an earlier block keeps a tie
                best[rows] = torch.where(better, value, best[rows])
                index[rows] = torch.where(better, at + start, index[rows])
        return index.view(normed.shape[:-1])
