"""Capture of the auxiliary hidden states and the last layer's output with forward pre-hooks.

Aux id `k` (input convention) is recorded as the hidden state entering decoder layer `k` (or the
final norm when `k == N`); `last` is the hidden state entering the final norm, i.e. the last
layer's output *before* the norm, from which the teacher is recomputed at training time. Only
the base model runs: the full-vocabulary LM head is never computed during extraction.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch
from torch import nn

from eyas.models.parts import TargetParts


@dataclass(frozen=True)
class Captured:
    """`aux [B, T, len(ids) * H]` (ids concatenated in order) and `last [B, T, H]`."""

    aux: torch.Tensor
    last: torch.Tensor


class FeatureCapture:
    """Context manager holding the hooks; `run` does one base-model forward and returns the features."""

    def __init__(self, parts: TargetParts, aux_ids: list[int]) -> None:
        self.parts = parts
        self.aux_ids = list(aux_ids)
        self._seen: dict[int, torch.Tensor] = {}
        self._handles: list[Any] = []

    def _module_for(self, layer_id: int) -> nn.Module:
        return self.parts.final_norm if layer_id == self.parts.num_layers else self.parts.layers[layer_id]

    def _recorder(self, key: int):  # noqa: ANN202 - a torch hook closure
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self._seen[key] = args[0] if args else kwargs["hidden_states"]

        return hook

    def __enter__(self) -> FeatureCapture:
        keys = sorted(set(self.aux_ids) | {self.parts.num_layers})
        self._handles = [
            self._module_for(key).register_forward_pre_hook(self._recorder(key), with_kwargs=True) for key in keys
        ]
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._seen = {}

    @torch.no_grad()  # not inference_mode: online training feeds these tensors into autograd
    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Captured:
        """Return the features of `input_ids [B, T]` (`attention_mask` 2-D padding mask, or a 4-D mask)."""
        self.parts.base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return self._collect()

    @torch.no_grad()
    def run_model(self, **inputs: Any) -> tuple[Any, Captured]:
        """Return the whole model's output for `inputs` (with a KV cache, say) and the features of its tokens."""
        output = self.parts.model(**inputs)
        return output, self._collect()

    def _collect(self) -> Captured:
        aux = torch.cat([self._seen[k] for k in self.aux_ids], dim=-1)  # [B, T, 3H]
        last = self._seen[self.parts.num_layers]  # [B, T, H]
        self._seen = {}
        return Captured(aux, last)


@torch.no_grad()
def teacher_logits(parts: TargetParts, last: torch.Tensor) -> torch.Tensor:
    """Return the target's logits `[..., V]` from stored pre-norm last hidden states `[..., H]`.

    Applies the final norm, the LM head, and final-logit soft-capping where the config has it
    (Gemma 2/3), so the result equals the model's own logits. The teacher is a constant of
    training: no graph is recorded.
    """
    logits = parts.lm_head(parts.final_norm(last.to(parts.lm_head.weight.dtype)))  # [..., V]
    cap = getattr(parts.model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits
