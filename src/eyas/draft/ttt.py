"""The training-time-test (TTT) unroll: k draft steps over a whole (packed) batch at once.

Anchor position t of step j reads the token `t+1+j` and, from step 1 on, the draft's own
pre-norm output of step j-1 at t as its feature; it predicts the target's distribution at
position `t+1+j`. Its rotary position is the sample position of t plus j (the position the
drafted token has at inference), and its attention sees the step-0 keys of its document's
causal prefix plus its own position at each earlier step (see attention.py).

A P-EAGLE draft (`family: peagle`) is unrolled the same way, except that step j >= 1 reads the mask token
and the learned mask feature instead of the token `t+1+j` and step j-1's output: the K slots of a block
drafted in one forward at anchor t are exactly the K steps at t, with the same positions and the same
attention (the context's step-0 keys and the block's earlier slots), so one unroll trains what the engine
drafts. Step j is still scored against the target at `t+1+j`: the slot at position t+j guesses the
token after it, having seen the context up to the token `t+1` only.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from eyas.draft.attention import AttentionFactory, default_attention
from eyas.draft.model import Eagle3Draft


def shift_left(x: torch.Tensor, shift: int, fill: int | bool = 0) -> torch.Tensor:
    """Return `x [B, T, ...]` moved `shift` positions left along dim 1, `fill` in the freed tail."""
    out = torch.full_like(x, fill)
    if shift < x.shape[1]:
        out[:, : x.shape[1] - shift] = x[:, shift:]
    return out


def unroll(draft: Eagle3Draft, aux: torch.Tensor, input_ids: torch.Tensor, position_ids: torch.Tensor,
           doc_ids: torch.Tensor, steps: int, attention: AttentionFactory | None = None) -> Iterator[torch.Tensor]:
    """Yield the draft logits `[B, T, N]` of steps 0..steps-1, one at a time.

    `aux [B, T, A*H_t]` are the target's features, `input_ids [B, T]` the tokens, `position_ids
    [B, T]` the sample positions (restarting at 0 in each packed document), `doc_ids [B, T]` the
    document of each position (-1 for padding). Yielding step by step lets the caller reduce each
    step's logits to a loss before the next step allocates its own.
    """
    attend = (attention or default_attention(aux.device))(doc_ids)
    kv = draft.new_kv()
    hidden = draft.fuse(aux)  # [B, T, H]
    for j in range(steps):
        if j and draft.config.family == "peagle":
            mask_token, mask_feature = draft.mask_slot()  # [H]
            tokens = torch.full_like(input_ids, mask_token)  # [B, T]
            hidden = mask_feature.expand_as(hidden)  # [B, T, H]
        else:
            tokens = shift_left(input_ids, 1 + j)  # [B, T]: token t+1+j
        out = draft.step(hidden, tokens, position_ids + j, kv, attend)  # [B, T, H]
        yield draft.logits(out)  # [B, T, N]
        hidden = draft.carry(out)
