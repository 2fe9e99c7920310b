"""The target and the draft, each with a KV cache kept across decoding steps.

Both take new tokens with explicit positions and, for draft trees, an explicit visibility
mask among the new tokens (every new token sees the cached prefix; the target's per-layer
restrictions, such as sliding windows, are added by eyas.decode.visibility). After a verification
the target keeps the cache entries of the accepted path only; the draft drops its tree entries
and re-reads the accepted tokens with the target's own features (as EAGLE does).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from eyas.decode.visibility import attention_layout
from eyas.draft.model import Eagle3Draft, StepKV
from eyas.models.capture import FeatureCapture
from eyas.models.parts import TargetParts


@dataclass(frozen=True)
class TargetStep:
    """`logits [n, V]` float32 of the new tokens and their aux features `[n, A*H]` (None without a draft)."""

    logits: torch.Tensor
    aux: torch.Tensor | None


class TargetForwards(Protocol):
    """What the round loop asks of a target: forwards after a cache it can trim (`TargetRunner` runs the model;
    eyas.decode.recorded answers from a recorded greedy continuation)."""

    device: torch.device

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor | None = None,
                last_only: bool = False) -> TargetStep:
        """Return the logits (and features) of `tokens` at `positions` after the cache, which keeps them."""

    def keep(self, new_count: int, kept: list[int]) -> None:
        """Keep the cached prefix and, of the last `new_count` entries, those at indices `kept`."""


class TargetRunner:
    """The target model with a transformers `DynamicCache` (every layer keeps all its keys, sliding ones
    too, so that it can be trimmed to any path), optionally capturing aux features."""

    def __init__(self, parts: TargetParts, capture: FeatureCapture | None) -> None:
        """Refuses a target whose attention layout cannot be verified exactly (eyas.decode.visibility)."""
        from transformers import DynamicCache

        self.parts, self.capture = parts, capture
        self.layout = attention_layout(parts.model.config)
        self.cache = DynamicCache()
        # transformers 5.x names the argument `cache` (`past_key_values` is deprecated there); 4.x knows only the latter
        parameters = inspect.signature(parts.model.forward).parameters
        self.cache_argument = "cache" if "cache" in parameters else "past_key_values"
        self.can_keep_last = "logits_to_keep" in parameters
        self.length = 0
        self.device = parts.lm_head.weight.device
        self.dtype = parts.lm_head.weight.dtype

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor | None = None,
                last_only: bool = False) -> TargetStep:
        """Run `tokens [n]` at `positions [n]` after the cached prefix; `visible [n, n]` bool says which
        new tokens each new token sees (None: causal). The new entries stay in the cache until `keep`.
        With `last_only` (a prefill) the logits may hold the last token's row only."""
        n = tokens.numel()
        inputs = {"input_ids": tokens[None].to(self.device), "position_ids": positions[None].to(self.device),
                  self.cache_argument: self.cache, "use_cache": True,
                  "cache_position": torch.arange(self.length, self.length + n, device=self.device)}
        if last_only and self.can_keep_last:
            inputs["logits_to_keep"] = 1  # a prompt's [n, V] logits are never read
        if visible is not None:
            masks = self.layout.masks(visible.cpu(), positions.cpu(), self.length, self.dtype)  # [1, 1, n, L+n] additive
            inputs["attention_mask"] = masks.to(self.device) if isinstance(masks, torch.Tensor) else \
                {kind: mask.to(self.device) for kind, mask in masks.items()}
        if self.capture is None:
            output, aux = self.parts.model(**inputs), None
        else:
            output, captured = self.capture.run_model(**inputs)
            aux = captured.aux[0]
        self.length += n
        return TargetStep(output.logits[0].float(), aux)

    def keep(self, new_count: int, kept: list[int]) -> None:
        """Keep the cached prefix and, of the last `new_count` entries, those at indices `kept` (ascending)."""
        start = self.length - new_count
        prefix = kept == list(range(len(kept)))  # a chain's accepted run: truncating is enough
        if prefix and len(kept) == new_count:
            return  # everything stays (a plain step); returns before inference mode, which costs ~10 us to enter
        with torch.inference_mode():
            index = torch.tensor(kept, dtype=torch.long, device=self.device) + start
            for layer in self.cache.layers:
                for name in ("keys", "values"):
                    tensor = getattr(layer, name)  # [1, kv, L, d]
                    if not prefix:
                        tensor[:, :, start:start + len(kept)] = tensor[:, :, index]
                    setattr(layer, name, tensor[:, :, :start + len(kept)])
        self.length = start + len(kept)


class _CachedAttention:
    """Attention of new draft queries over the cached keys plus the new ones, with a visibility mask."""

    def __init__(self, visible: torch.Tensor) -> None:
        self.visible = visible  # [n, L+n] bool

    def __call__(self, q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
        k, v = torch.cat(keys, dim=2), torch.cat(values, dim=2)  # [1, kv, L+n, d]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.visible[None, None], enable_gqa=True)


@dataclass(frozen=True)
class DraftStep:
    """`hidden [n, H]`: the features the next draft step reads (the draft's outputs, `Eagle3Draft.carry`);
    `logits [n, N]` float32 over the draft vocabulary."""

    hidden: torch.Tensor
    logits: torch.Tensor


class DraftRunner:
    """The EAGLE-3 draft with per-layer key/value tensors `[1, kv, L, d]`."""

    def __init__(self, draft: Eagle3Draft) -> None:
        self.draft = draft
        self.keys: list[torch.Tensor | None] = [None] * len(draft.layers)
        self.values: list[torch.Tensor | None] = [None] * len(draft.layers)
        self.length = 0
        self.forwards = 0  # draft forwards run so far
        self.device = draft.lm_head.weight.device

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """Return the draft features `[n, H]` of target aux features `[n, A*H_t]`."""
        with torch.inference_mode():
            return self.draft.fuse(aux.to(self.device))

    @torch.inference_mode()
    def forward(self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                visible: torch.Tensor | None = None) -> DraftStep:
        """Run anchors with features `hidden [n, H]`, next tokens `tokens [n]` (target ids) at `positions [n]`.

        `visible [n, L+n]` bool says which cache entries and new anchors each new anchor sees (None:
        the whole cache, and the new anchors causally). The new entries are appended to the cache.
        """
        n = tokens.numel()
        if visible is None:
            visible = torch.cat([torch.ones(n, self.length, dtype=torch.bool),
                                 torch.ones(n, n, dtype=torch.bool).tril()], dim=1)
        allowed = visible.to(self.device)  # [n, L+n]
        kv = [StepKV([k], [v]) if k is not None else StepKV() for k, v in zip(self.keys, self.values)]
        out = self.draft.step(hidden[None].to(self.device), tokens[None].to(self.device),
                              positions[None].to(self.device), kv, _CachedAttention(allowed))  # [1, n, H]
        for i, layer_kv in enumerate(kv):
            self.keys[i], self.values[i] = torch.cat(layer_kv.keys, dim=2), torch.cat(layer_kv.values, dim=2)
        self.length += n
        self.forwards += 1
        return DraftStep(self.draft.carry(out)[0], self.draft.logits(out)[0].float())

    def crop(self, length: int) -> None:
        """Drop every cache entry after the first `length`."""
        self.keys = [k[:, :, :length] if k is not None else None for k in self.keys]
        self.values = [v[:, :, :length] if v is not None else None for v in self.values]
        self.length = length
