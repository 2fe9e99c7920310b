"""The DFlash draft (arXiv 2602.06036): a block of tokens drafted in one forward, the target's features of
the context injected as keys and values of every layer.

With committed tokens `x_0..x_m` and the target's aux features of `x_0..x_{m-1}`, a block of S =
`block_size` slots sits at positions m..m+S-1: slot 0 reads the last committed token `x_m`, slots 1..S-1
the token `mask_token_id`; slot s >= 1 guesses `x_{m+s}`, so a block drafts S-1 tokens.

    c      = hidden_norm(fc(cat(aux_1, .., aux_A)))                context  [T, H]
    h      = embed(block tokens)                                  block    [S, H]
    per layer:  x = input_layernorm(h)
                q = rope(q_norm(q_proj(x)))                                 [S, h, d]
                K = [rope(k_norm(k_proj(c))), rope(k_norm(k_proj(x)))]     [T + S, kv, d]
                V = [v_proj(c), v_proj(x)]
                h = h + o_proj(softmax(q K^T / sqrt(d)) V)                  every slot sees the whole
                h = h + mlp(post_attention_layernorm(h))                    context and the whole block
    logits = lm_head(norm(h))                                               [S, V]

The layers are Qwen3's (per-head `q_norm`/`k_norm`), as vLLM's `DFlashDraftModel` and z-lab's `dflash`
package build them; the context goes through each layer's `k_proj`/`v_proj` only (no layer norm, no MLP),
so its keys and values are computed once per committed token. The embedding and the LM head are the
target's, frozen: the embedding is not saved (as EAGLE-3's), the LM head is (a frozen copy, so that a draft
decodes without the target's head at hand), and the draft vocabulary is the target's whole vocabulary
(`d2t` zeros), which is what both loaders read.

Training (`block_steps`) drafts a block after every position at once, and reads it as the training-time
test's steps: the block whose slot 0 reads `x_{t+1}` sees the context features up to t, so its slot j+1 is
step j at anchor t, scored against the target at `t+1+j` (eyas.draft.objective, unchanged). Each block
attends to its document's context up to its anchor and to its own S slots; the `[T, T]` context scores of
every slot and the `[S, S]` scores inside each block are joined under one softmax, so no `[T*S, T + T*S]`
mask is built (`BlockAttention`).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from eyas.draft.config import DraftConfig
from eyas.draft.model import FROZEN, Eagle3Draft, frozen_embedding, llama_config


def _per_head(kv: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
    """Return `kv` with its kv-head dimension `dim` repeated to `heads` (grouped-query attention)."""
    return kv.repeat_interleave(heads // kv.shape[dim], dim=dim)


class BlockAttention:
    """Attention of blocks over their context: `keys_ctx`/`values_ctx` `[B, kv, T, d]` of the context,
    queries `[B, h, n, S, d]` of n blocks of S slots with their own keys/values `[B, kv, n, S, d]`.

    `visible [B, n, T]` bool says which context positions block i sees (its document up to its anchor)."""

    def __init__(self, visible: torch.Tensor) -> None:
        self.visible = visible

    def __call__(self, q: torch.Tensor, keys_ctx: torch.Tensor, values_ctx: torch.Tensor, keys_blk: torch.Tensor,
                 values_blk: torch.Tensor) -> torch.Tensor:
        """Return `[B, h, n, S, d]`."""
        heads, scale = q.shape[1], q.shape[-1] ** -0.5
        context = torch.einsum("bhnsd,bhtd->bhnst", q, _per_head(keys_ctx, heads, 1)) * scale  # [B, h, n, S, T]
        context = context.masked_fill(~self.visible[:, None, :, None, :], float("-inf"))
        inside = torch.einsum("bhnsd,bhnzd->bhnsz", q, _per_head(keys_blk, heads, 1)) * scale  # [B, h, n, S, S]
        probs = torch.cat([context, inside], dim=-1).softmax(dim=-1, dtype=torch.float32).to(q.dtype)
        T = context.shape[-1]
        out = torch.einsum("bhnst,bhtd->bhnsd", probs[..., :T], _per_head(values_ctx, heads, 1))
        return out + torch.einsum("bhnsz,bhnzd->bhnsd", probs[..., T:], _per_head(values_blk, heads, 1))


class DFlashLayer(nn.Module):
    """A Qwen3 decoder layer whose keys and values also hold the context's."""

    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        H, d = config.hidden_size, config.head_dim
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.input_layernorm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(H, self.heads * d, bias=False)
        self.self_attn.k_proj = nn.Linear(H, self.kv_heads * d, bias=False)
        self.self_attn.v_proj = nn.Linear(H, self.kv_heads * d, bias=False)
        self.self_attn.o_proj = nn.Linear(self.heads * d, H, bias=False)
        self.self_attn.q_norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.self_attn.k_norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(llama_config(config))

    def context_kv(self, context: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the keys and values `[B, kv, T, d]` of context features `[B, T, H]` at the rotary angles `rope`."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        B, T, _ = context.shape
        attn = self.self_attn
        k = attn.k_norm(attn.k_proj(context).view(B, T, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = attn.v_proj(context).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope
        _, k = apply_rotary_pos_emb(k, k, cos, sin)
        return k, v

    def forward(self, h: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], context_kv: tuple[torch.Tensor, torch.Tensor],
                attention: BlockAttention) -> torch.Tensor:
        """Return the block states `[B, n, S, H]` after this layer; `rope` holds the slots' angles `[B, n*S, d]`."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        B, n, S, _ = h.shape
        attn, d = self.self_attn, self.head_dim
        x = self.input_layernorm(h).reshape(B, n * S, -1)
        q = attn.q_norm(attn.q_proj(x).view(B, n * S, self.heads, d)).transpose(1, 2)  # [B, h, nS, d]
        k = attn.k_norm(attn.k_proj(x).view(B, n * S, self.kv_heads, d)).transpose(1, 2)  # [B, kv, nS, d]
        v = attn.v_proj(x).view(B, n * S, self.kv_heads, d).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *rope)
        out = attention(q.reshape(B, self.heads, n, S, d), *context_kv, k.reshape(B, self.kv_heads, n, S, d),
                        v.reshape(B, self.kv_heads, n, S, d))  # [B, h, n, S, d]
        h = h + attn.o_proj(out.permute(0, 2, 3, 1, 4).reshape(B, n, S, self.heads * d))
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDraft(nn.Module):
    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        self.config = config
        H = config.hidden_size
        self.embed_tokens = frozen_embedding(config)
        self.fc = nn.Linear(config.num_aux * config.target_hidden_size, H, bias=False)
        self.hidden_norm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList([DFlashLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(H, config.vocab_size, bias=False)
        self.lm_head.weight.requires_grad_(False)
        self.rotary_emb = LlamaRotaryEmbedding(llama_config(config))
        self.register_buffer("d2t", torch.zeros(config.vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool))

    def context(self, aux: torch.Tensor) -> torch.Tensor:
        """Return `hidden_norm(fc(aux))`: the context features `[..., H]` of aux features `[..., A*H_t]`."""
        return self.hidden_norm(self.fc(aux.to(self.fc.weight.dtype)))

    def context_kv(self, context: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Return each layer's keys and values `[B, kv, T, d]` of context features `[B, T, H]` at `positions [B, T]`."""
        rope = self.rotary_emb(context, positions)
        return [layer.context_kv(context, rope) for layer in self.layers]

    def blocks(self, tokens: torch.Tensor, positions: torch.Tensor, context_kv: list[tuple[torch.Tensor, torch.Tensor]],
               attention: BlockAttention) -> torch.Tensor:
        """Return the final states `[B, n, S, H]` (pre-norm) of n blocks of slot tokens `tokens [B, n, S]` at
        `positions [B, n, S]`, over each layer's context keys and values."""
        B, n, S = tokens.shape
        h = self.embed_tokens(tokens).to(self.fc.weight.dtype)  # [B, n, S, H]
        rope = self.rotary_emb(h, positions.reshape(B, n * S))
        for layer, kv in zip(self.layers, context_kv):
            h = layer(h, rope, kv, attention)
        return h

    def block_tokens(self, anchors: torch.Tensor) -> torch.Tensor:
        """Return `[..., S]`: each block's slot tokens, the anchor token `anchors [...]` then the mask tokens."""
        assert self.config.mask_token_id is not None and self.config.block_size is not None  # the config demands them
        masks = torch.full((*anchors.shape, self.config.block_size - 1), self.config.mask_token_id, device=anchors.device)
        return torch.cat([anchors[..., None], masks], dim=-1)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Return logits `[..., V]` over the target's vocabulary of pre-norm states `[..., H]`."""
        return self.lm_head(self.norm(hidden))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Return target token ids for draft-vocabulary ids: the same ids (the vocabulary is the target's)."""
        return draft_ids

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Return the saved tensors: every weight and buffer except the frozen target embedding."""
        return {name: t for name, t in self.state_dict().items() if name not in FROZEN}


Draft = Eagle3Draft | DFlashDraft  # a draft of any family


def block_steps(draft: DFlashDraft, aux: torch.Tensor, input_ids: torch.Tensor, position_ids: torch.Tensor,
                doc_ids: torch.Tensor, steps: int) -> Iterator[torch.Tensor]:
    """Yield the logits `[B, T, V]` of steps 0..steps-1 (block slots 1..steps) of the block drafted after every
    anchor t: slot 0 reads the token `t+1` at the position after t, and the block sees t's document up to t.

    `aux [B, T, A*H_t]`, `input_ids`, `position_ids`, `doc_ids [B, T]` as the TTT unroll takes them
    (eyas.draft.ttt). Refuses (ValueError) more steps than the block drafts."""
    from eyas.draft.ttt import shift_left

    S = draft.config.block_size or 0
    if steps > S - 1:
        raise ValueError(f"dflash: {steps} steps, a block of {S} drafts {S - 1} tokens")
    T = input_ids.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=doc_ids.device).tril()  # [T(anchor), T(context)]
    visible = causal & (doc_ids[:, :, None] == doc_ids[:, None, :]) & (doc_ids[:, :, None] >= 0)  # [B, T, T]
    context = draft.context(aux)  # [B, T, H]
    kv = draft.context_kv(context, position_ids)
    tokens = draft.block_tokens(shift_left(input_ids, 1))  # [B, T, S]
    slots = position_ids[:, :, None] + 1 + torch.arange(S, device=position_ids.device)  # [B, T, S]
    hidden = draft.blocks(tokens, slots, kv, BlockAttention(visible))  # [B, T, S, H]
    for j in range(steps):
        yield draft.logits(hidden[:, :, j + 1])  # [B, T, V]
