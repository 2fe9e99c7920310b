"""Attention of the training-time-test (TTT) unroll, without a `[T, k*T]` mask.

At TTT step j a query at position t attends to the causal prefix (same document) of the
step-0 keys and to the keys at its own position t of steps 1..j. Instead of concatenating the
steps' keys and masking a `[T, (j+1)T]` score matrix, the step-0 scores `[T, T]` are joined
with the j diagonal scores `q_t . k_i[t]`, and one softmax runs over both:

    p = softmax([q K0^T + causal_document_mask, (q * K_1).sum(-1), ..., (q * K_j).sum(-1)])
    out = p[:, :T] V0 + sum_i p[:, T+i-1] V_i[t]

`EagerTTTAttention` does exactly that (SDPA at step 0); `FlexTTTAttention` (CUDA) computes the
step-0 part with FlexAttention over a block-sparse causal-document mask and merges the diagonal
terms through its log-sum-exp. Both take `doc_ids [B, T]` once per unroll (packed rows: a query
sees keys of its own document only; padding has id -1 and only sees padding).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F


class TTTAttention(Protocol):
    def __call__(self, q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
        """Return `[B, h, T, d]` for queries `q [B, h, T, d]` and per-step `keys`/`values` `[B, kv, T, d]`."""
        ...


AttentionFactory = Callable[[torch.Tensor], TTTAttention]


def causal_document_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """Return `[B, 1, T, T]` bool: query t may see key s when s <= t and both are in the same document."""
    T = doc_ids.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=doc_ids.device).tril()  # [T, T]
    same_doc = doc_ids[:, :, None] == doc_ids[:, None, :]  # [B, T, T]
    return (causal & same_doc)[:, None]


def _per_head(kv: torch.Tensor, heads: int) -> torch.Tensor:
    """Return `[B, kv, T, d]` repeated to `[B, heads, T, d]` (grouped-query attention)."""
    return kv.repeat_interleave(heads // kv.shape[1], dim=1)


def _diagonal_scores(q: torch.Tensor, keys: list[torch.Tensor], scale: float) -> torch.Tensor:
    """Return `[B, h, T, j]`: the score of each query against its own position's key at steps 1..j."""
    return torch.stack([(q * _per_head(k, q.shape[1])).sum(-1) for k in keys[1:]], dim=-1) * scale


def _diagonal_values(probs: torch.Tensor, values: list[torch.Tensor]) -> torch.Tensor:
    """Return `sum_i probs[..., i] * V_i[t]`: `[B, h, T, d]` from `probs [B, h, T, j]`."""
    stacked = torch.stack([_per_head(v, probs.shape[1]) for v in values[1:]], dim=-2)  # [B, h, T, j, d]
    return torch.einsum("bhtj,bhtjd->bhtd", probs, stacked)


class EagerTTTAttention:
    """The CPU path: SDPA at step 0, then `[T, T]` scores plus `j` diagonal scores per step."""

    def __init__(self, doc_ids: torch.Tensor) -> None:
        self.mask = causal_document_mask(doc_ids)  # [B, 1, T, T]

    def __call__(self, q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
        scale = q.shape[-1] ** -0.5
        if len(keys) == 1:
            return F.scaled_dot_product_attention(q, keys[0], values[0], attn_mask=self.mask, scale=scale,
                                                  enable_gqa=q.shape[1] != keys[0].shape[1])
        T = q.shape[2]
        scores = (q @ _per_head(keys[0], q.shape[1]).transpose(-1, -2)) * scale  # [B, h, T, T]
        scores = scores.masked_fill(~self.mask, float("-inf"))
        joined = torch.cat([scores, _diagonal_scores(q, keys, scale)], dim=-1)  # [B, h, T, T + j]
        probs = joined.softmax(dim=-1, dtype=torch.float32).to(q.dtype)
        out = probs[..., :T] @ _per_head(values[0], q.shape[1])  # [B, h, T, d]
        return out + _diagonal_values(probs[..., T:], values)


class FlexTTTAttention:
    """The CUDA path: FlexAttention over a block-sparse causal-document mask, diagonals merged by log-sum-exp."""

    def __init__(self, doc_ids: torch.Tensor) -> None:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def same_document_causal(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
            return (kv <= q) & (doc_ids[b, q] == doc_ids[b, kv])

        B, T = doc_ids.shape
        self.block_mask = create_block_mask(same_document_causal, B, None, T, T, device=doc_ids.device)
        self.flex = _compiled(flex_attention) if doc_ids.is_cuda else flex_attention

    def __call__(self, q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
        scale = q.shape[-1] ** -0.5
        out, lse = self.flex(q, keys[0], values[0], block_mask=self.block_mask, scale=scale,
                             enable_gqa=q.shape[1] != keys[0].shape[1], **_LSE_REQUEST)  # [B, h, T, d], [B, h, T]
        lse = getattr(lse, "lse", lse)
        if len(keys) == 1:
            return out
        diagonal = _diagonal_scores(q, keys, scale).float()  # [B, h, T, j]
        total = torch.logsumexp(torch.cat([lse[..., None].float(), diagonal], dim=-1), dim=-1)  # [B, h, T]
        weight0 = torch.exp(lse.float() - total)[..., None].to(q.dtype)  # [B, h, T, 1]
        probs = torch.exp(diagonal - total[..., None]).to(q.dtype)  # [B, h, T, j]
        return weight0 * out + _diagonal_values(probs, values)


def _lse_request() -> dict[str, object]:
    """Return the keyword asking FlexAttention for its log-sum-exp (`return_aux` from torch 2.9 on)."""
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:
        return {"return_lse": True}
    return {"return_aux": AuxRequest(lse=True)}


_LSE_REQUEST = _lse_request()
_COMPILED: dict[int, Callable[..., object]] = {}


def _compiled(fn: Callable[..., object]) -> Callable[..., object]:
    """Return `torch.compile(fn)`, compiled once per process (FlexAttention is fused only when compiled)."""
    if id(fn) not in _COMPILED:
        _COMPILED[id(fn)] = torch.compile(fn, dynamic=True)
    return _COMPILED[id(fn)]


def default_attention(device: torch.device) -> AttentionFactory:
    """Return the TTT attention for `device`: FlexAttention on CUDA, the eager path elsewhere."""
    return FlexTTTAttention if device.type == "cuda" else EagerTTTAttention
