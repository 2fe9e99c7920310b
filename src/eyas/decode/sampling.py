"""Sampling settings and the distribution they turn logits into.

Temperature 0 is greedy decoding. Otherwise logits are divided by the temperature, then top-k
and top-p (nucleus) filters keep the smallest set of most likely tokens, and the result is
renormalised: speculative decoding preserves exactly this distribution of the target.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Return float32 probabilities `[..., V]` of `logits [..., V]` after temperature, top-k and top-p.

        Refuses greedy settings (there is no distribution to sample from: use argmax).
        """
        if self.greedy:
            raise ValueError("greedy sampling has no distribution; take the argmax")
        scaled = logits.float() / self.temperature
        if 0 < self.top_k < scaled.shape[-1]:
            kth = scaled.topk(self.top_k, dim=-1).values[..., -1:]  # [..., 1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        if self.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the more likely tokens, sorted order
            drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before >= self.top_p)
            probs = probs.masked_fill(drop, 0.0)
            probs = probs / probs.sum(-1, keepdim=True)
        return probs
