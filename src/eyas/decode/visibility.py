"""Which cached keys a verified token may see, per attention layer type of the target.

A verification forward runs new tokens (the root and draft nodes) after the cached prefix with an
explicit mask, and transformers uses an explicit 4D mask as given: it no longer applies the
model's own per-layer restrictions. The mask must therefore carry them. For a new token at
sequence position `p` and a key at position `k` (cached keys sit at their positions, since the
cache holds the committed path only; new keys at the positions given to the forward):

    full_attention     k <= p                      (the causal rule; the tree adds: k is the token
                                                   itself, an ancestor, or committed)
    sliding_attention  p - W < k <= p              W = config.sliding_window (transformers'
                                                   `sliding_window_overlay`: kv > q - W)
    chunked_attention  k // C == p // C, k <= p    C = config.attention_chunk_size

Each rule is applied to *positions*, never to cache indices: a tree node's cache index exceeds
its position (siblings take indices, not positions), so an index-based window would hide keys the
target alone sees. Attention sinks (GPT-OSS) add a learned logit to each softmax and need no mask
of their own. Layer types whose state is not a key/value cache (linear attention, convolutions,
recurrent blocks) cannot be trimmed to an accepted path: `attention_layout` refuses them before a
token is generated.

The layer types come from the text config as transformers' `create_masks_for_generate` reads
them: `layer_types` when the config has it, else every layer sliding when `sliding_window` is set,
else every layer full. A model whose layers differ takes a mapping from layer type to mask
(transformers' `causal_mask_mapping`); one whose layers agree takes the single mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from eyas.errors import EyasError

TRIMMABLE = ("full_attention", "sliding_attention", "chunked_attention")


@dataclass(frozen=True)
class AttentionLayout:
    """The distinct attention layer types of a target (sorted) and the sizes their rules read."""

    layer_types: tuple[str, ...]
    sliding_window: int | None = None
    chunk_size: int | None = None

    def describe(self) -> str:
        """Return e.g. `full_attention + sliding_attention (window 512)`."""
        sizes = [f"window {self.sliding_window}"] if "sliding_attention" in self.layer_types else []
        sizes += [f"chunk {self.chunk_size}"] if "chunked_attention" in self.layer_types else []
        return " + ".join(self.layer_types) + (f" ({', '.join(sizes)})" if sizes else "")

    def allowed(self, layer_type: str, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        """Return `[n, K]` bool: whether a query at `query_positions [n]` may see a key at `key_positions [K]`
        in layers of `layer_type`, by position alone (causality included; tree visibility is separate)."""
        query, key = query_positions[:, None], key_positions[None, :]  # [n, 1], [1, K]
        allowed = key <= query
        if layer_type == "sliding_attention":
            allowed &= key > query - self.sliding_window
        elif layer_type == "chunked_attention":
            allowed &= torch.div(key, self.chunk_size, rounding_mode="floor") == \
                torch.div(query, self.chunk_size, rounding_mode="floor")
        return allowed

    def masks(self, visible: torch.Tensor, positions: torch.Tensor, cached: int,
              dtype: torch.dtype) -> torch.Tensor | dict[str, torch.Tensor]:
        """Return the additive attention mask(s) `[1, 1, n, cached+n]` of new tokens at `positions [n]` after
        `cached` committed keys, where `visible [n, n]` bool says which new tokens each new token sees:
        one tensor when every layer has the same type, else one per layer type."""
        key_positions = torch.cat([torch.arange(cached), positions])  # [cached+n]
        seen = torch.cat([torch.ones(len(positions), cached, dtype=torch.bool), visible], dim=1)  # [n, cached+n]
        built = {}
        for layer_type in self.layer_types:
            allowed = seen & self.allowed(layer_type, positions, key_positions)  # [n, cached+n]
            mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
            built[layer_type] = mask[None, None]
        return built[self.layer_types[0]] if len(built) == 1 else built


def attention_layout(config: Any) -> AttentionLayout:
    """Return the attention layout of a transformers model config (its text config for composite models).

    Refuses, in one line naming the layer types, a target with a layer type whose cache cannot be
    trimmed to a draft path, and a sliding or chunked layer without its size."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(text, "sliding_window", None)
    declared = getattr(text, "layer_types", None)
    types = tuple(sorted(set(declared))) if declared else (("sliding_attention",) if window else ("full_attention",))
    unsupported = [kind for kind in types if kind not in TRIMMABLE]
    if unsupported:
        raise EyasError(f"{type(text).__name__}: speculative decoding needs attention layers whose key/value cache can "
                        f"be trimmed to the accepted path; layer types {', '.join(unsupported)} cannot be "
                        f"(supported: {', '.join(TRIMMABLE)})")
    chunk = getattr(text, "attention_chunk_size", None)
    for kind, size, field in (("sliding_attention", window, "sliding_window"), ("chunked_attention", chunk, "attention_chunk_size")):
        if kind in types and not (isinstance(size, int) and size > 0):
            raise EyasError(f"{type(text).__name__}: {field}: {size!r}; {kind} layers need a positive size")
    return AttentionLayout(types, window if "sliding_attention" in types else None,
                           chunk if "chunked_attention" in types else None)
