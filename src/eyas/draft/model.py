"""The EAGLE-3 draft: `fc` fusion of the target's aux features, a decoder layer with a 2H-wide
attention input, final norm and an LM head over the draft vocabulary.

    hidden  = fc(cat(aux_1, aux_2, aux_3))                     step 0  [B, T, H]
            | the draft's own pre-norm output of step j-1       step j  [B, T, H]
    x       = cat(input_layernorm(embed(token)), hidden_norm(hidden))    [B, T, 2H]
    hidden' = hidden + attn(x);  out = hidden' + mlp(post_attention_layernorm(hidden'))
    logits  = lm_head(norm(out))                                          [B, T, N]

Further layers (`num_hidden_layers > 1`) are plain pre-norm Llama layers on `out`. The embedding
is the target's, frozen and never saved; `d2t [N]` (target id = i + d2t[i]) and `t2d [V]` are
buffers saved with the weights. Norms, MLP and rotary embedding are transformers' Llama modules.

EAGLE-3.1's options (eyas.draft.config): with `fc_norm` the fusion is `fc(cat(n_1(aux_1), .., n_A(aux_A)))`
with one RMSNorm `fc_norm.{i}` per aux feature; with `norm_output` step j+1 reads `norm(out_j)`, the
post-norm output its logits were computed from, instead of `out_j` (`carry`).

P-EAGLE (`family: peagle`): the slots past the first of a drafted block read the token `mask_token_id`
and the feature `fuse(mask_hidden)`, one learned `[A*H_t]` vector in the aux space (so it passes
`fc_norm` and `fc` as a real feature does), instead of the previous step's output (`mask_slot`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save_file
from torch import nn

from eyas.draft.attention import TTTAttention
from eyas.draft.config import CONFIG_FILE, WEIGHTS_FILE, DraftConfig, read_draft_config
from eyas.errors import EyasError
from eyas.files import read_tensors, write_atomic, write_json_atomic

FROZEN = ("embed_tokens.weight",)
MASK_HIDDEN_STD = 0.02  # the learned P-EAGLE slot feature starts small, as embeddings do


def llama_config(config: DraftConfig):  # noqa: ANN202 - transformers' LlamaConfig
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim, rms_norm_eps=config.rms_norm_eps, rope_theta=config.rope_theta,
        rope_scaling=config.rope_scaling, max_position_embeddings=config.max_position_embeddings,
        hidden_act="silu", vocab_size=config.vocab_size,
    )


@dataclass
class StepKV:
    """Keys and values of one layer, one `[B, kv, T, d]` entry per TTT step so far."""

    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)


class DraftAttention(nn.Module):
    def __init__(self, config: DraftConfig, input_width: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.q_proj = nn.Linear(input_width, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(input_width, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(input_width, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], kv: StepKV,
                attention: TTTAttention) -> torch.Tensor:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)  # [B, h, T, d]
        k = self.k_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)  # [B, kv, T, d]
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)  # [B, kv, T, d]
        q, k = apply_rotary_pos_emb(q, k, *rope)
        kv.keys.append(k)
        kv.values.append(v)
        out = attention(q, kv.keys, kv.values)  # [B, h, T, d]
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.heads * self.head_dim))


class DraftLayer(nn.Module):
    """A pre-norm decoder layer; the first one reads `cat(embedding, feature)` (2H wide)."""

    def __init__(self, config: DraftConfig, first: bool) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        self.first = first
        H = config.hidden_size
        self.input_layernorm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
        if first:
            self.hidden_norm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
        self.self_attn = DraftAttention(config, 2 * H if first else H)
        self.post_attention_layernorm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(llama_config(config))

    def forward(self, hidden: torch.Tensor, embeds: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv: StepKV, attention: TTTAttention) -> torch.Tensor:
        if self.first:
            x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)  # [B, T, 2H]
        else:
            x = self.input_layernorm(hidden)  # [B, T, H]
        hidden = hidden + self.self_attn(x, rope, kv, attention)  # residual: the feature itself
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


def frozen_embedding(config: DraftConfig) -> nn.Embedding:
    """Return the `[V, H]` embedding every draft reads: the target's (`set_embedding`), frozen and never saved."""
    embedding = nn.Embedding(config.vocab_size, config.hidden_size)
    embedding.weight.requires_grad_(False)
    return embedding


class Eagle3Draft(nn.Module):
    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        self.config = config
        H = config.hidden_size
        self.embed_tokens = frozen_embedding(config)
        if config.fc_norm:
            self.fc_norm = nn.ModuleList([LlamaRMSNorm(config.target_hidden_size, eps=config.rms_norm_eps)
                                          for _ in range(config.num_aux)])
        self.fc = nn.Linear(config.num_aux * config.target_hidden_size, H, bias=False)
        if config.family == "peagle":
            self.mask_hidden = nn.Parameter(torch.randn(config.num_aux * config.target_hidden_size) * MASK_HIDDEN_STD)
        self.layers = nn.ModuleList([DraftLayer(config, first=i == 0) for i in range(config.num_hidden_layers)])
        self.norm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(H, config.draft_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(llama_config(config))
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))

    def new_kv(self) -> list[StepKV]:
        """Return empty per-layer key/value lists for one unroll."""
        return [StepKV() for _ in self.layers]

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """Return `fc(aux)`: `[..., H]` from the target's concatenated aux features `[..., A*H_t]` (each feature
        normed first with `fc_norm`)."""
        aux = aux.to(self.fc.weight.dtype)
        if self.config.fc_norm:
            aux = torch.cat([norm(chunk) for norm, chunk in zip(self.fc_norm, aux.chunk(self.config.num_aux, dim=-1))],
                            dim=-1)
        return self.fc(aux)

    def mask_slot(self) -> tuple[int, torch.Tensor]:
        """Return what every parallel slot of a P-EAGLE block reads: the mask token id and the feature `[H]`.
        Refuses (ValueError) a draft of another family."""
        if self.config.mask_token_id is None:
            raise ValueError(f"parallel slots: a {self.config.family} draft has none")
        return self.config.mask_token_id, self.fuse(self.mask_hidden)

    def carry(self, out: torch.Tensor) -> torch.Tensor:
        """Return the feature the next draft step reads from this step's pre-norm outputs `out [..., H]`: the
        outputs themselves, or with `norm_output` their final norm."""
        return self.norm(out) if self.config.norm_output else out

    def step(self, hidden: torch.Tensor, input_ids: torch.Tensor, position_ids: torch.Tensor, kv: list[StepKV],
             attention: TTTAttention) -> torch.Tensor:
        """Return the pre-norm output `[B, T, H]` of one draft step.

        `hidden [B, T, H]` is the fused feature (step 0) or the previous step's output,
        `input_ids [B, T]` the tokens whose embeddings are read, `position_ids [B, T]` their
        rotary positions; the step's keys and values are appended to `kv`.
        """
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)  # [B, T, H]
        rope = self.rotary_emb(hidden, position_ids)
        for layer, layer_kv in zip(self.layers, kv):
            hidden = layer(hidden, embeds, rope, layer_kv, attention)
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Return draft-vocabulary logits `[B, T, N]` of pre-norm outputs `[B, T, H]`."""
        return self.lm_head(self.norm(hidden))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Return target token ids for draft-vocabulary ids (any shape)."""
        return draft_ids + self.d2t[draft_ids]

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Return the saved tensors: every weight and buffer except the frozen target embedding."""
        return {name: t for name, t in self.state_dict().items() if name not in FROZEN}


def save_draft(draft: Draft, out: Path) -> None:
    """Write `out/config.json` and `out/model.safetensors` (embedding excluded), each atomically."""
    write_draft(draft.config, draft.trainable_state(), out)


def write_draft(config: DraftConfig, tensors: dict[str, torch.Tensor], out: Path) -> None:
    """Write a draft directory from its config and saved tensors (as `trainable_state` names them)."""
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
    write_atomic(out / WEIGHTS_FILE, lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
    write_json_atomic(out / CONFIG_FILE, config.model_dump(mode="json"))


NAMED_NON_FINITE = 3  # tensors named one by one in `non_finite_problems`; the rest are counted


def non_finite_problems(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """Return what holds a NaN or an infinity among the floating-point `tensors` (empty: every value is finite):
    one problem per tensor, counting its values, for the first few, then one counting the rest. The one check
    of a draft's weights wherever one is read (`load_draft`, and `eyas import` / `eyas check-draft` through
    `eyas.export.reader.tensor_problems`)."""
    counts = {name: (int((~torch.isfinite(t)).sum()), t.numel()) for name, t in tensors.items() if t.is_floating_point()}
    bad = [(name, count, total) for name, (count, total) in counts.items() if count]
    problems = [f"{name}: {count} of {total} values are NaN or Inf" for name, count, total in bad[:NAMED_NON_FINITE]]
    if len(bad) > NAMED_NON_FINITE:
        rest = bad[NAMED_NON_FINITE:]
        problems.append(f"{len(rest)} more tensors hold NaN or Inf ({sum(c for _, c, _ in rest)} of "
                        f"{sum(t for _, _, t in rest)} values)")
    return problems


if TYPE_CHECKING:
    from eyas.draft.dflash import Draft


def new_draft(config: DraftConfig) -> Draft:
    """Return a freshly initialised draft of `config`'s family (eyas.draft.dflash for `dflash`)."""
    from eyas.draft.dflash import DFlashDraft

    return DFlashDraft(config) if config.family == "dflash" else Eagle3Draft(config)


def load_draft(draft_dir: Path, embed_weight: torch.Tensor | None = None) -> Draft:
    """Return the draft saved in `draft_dir` (of its config's family), with the target's embedding `[V, H]` when given.

    Refuses, in one line naming the weights file: a file that cannot be read (missing, truncated:
    `eyas.files.reading`), and weights whose names or shapes do not match the config or that hold
    NaN or Inf (`non_finite_problems`), naming each tensor.
    """
    config = read_draft_config(draft_dir)
    draft = new_draft(config)
    path = draft_dir / WEIGHTS_FILE
    if not path.is_file():
        raise EyasError(f"{path}: not found")
    tensors = read_tensors(path)
    expected = draft.trainable_state()
    problems = [f"{name}: missing" for name in expected if name not in tensors]
    problems += [f"{name}: unexpected tensor" for name in tensors if name not in expected]
    problems += [f"{name}: shape {list(tensors[name].shape)}, config implies {list(t.shape)}"
                 for name, t in expected.items() if name in tensors and tensors[name].shape != t.shape]
    problems += non_finite_problems(tensors)
    if problems:
        raise EyasError(f"{path}: " + "; ".join(problems))
    draft.load_state_dict(tensors, strict=False)
    if embed_weight is not None:
        set_embedding(draft, embed_weight)
    return draft


def set_embedding(draft: Draft, weight: torch.Tensor) -> None:
    """Copy the target's input embedding `[V, H]` into the draft (frozen); refuses another shape."""
    if tuple(weight.shape) != tuple(draft.embed_tokens.weight.shape):
        raise EyasError(f"target embedding: shape {list(weight.shape)}, the draft needs "
                        f"{list(draft.embed_tokens.weight.shape)} (vocab_size x hidden_size)")
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(weight)
