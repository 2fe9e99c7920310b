"""Capture of residual-stream states inside a vLLM model, with forward pre-hooks (no vLLM import).

vLLM's decoder layers take and return `(hidden_states, residual)` unsummed, and the next layer's
fused add-norm overwrites both in place; the residual stream entering layer k is their sum,
computed here inside the hook (a new tensor), so later in-place updates cannot change it. Id N
is the sum entering the final norm: the last layer's output before the norm. One record per
forward: `token_ids [T]` and `hidden_states [T, n, H]` (ids ascending), the keys and shapes of
vLLM's own hidden-states connector files.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], name: str, position: int) -> Any:
    """Return the call's argument `name` (by keyword, else at `position`), or None when it was not passed."""
    if name in kwargs:
        return kwargs[name]
    return args[position] if len(args) > position else None


def _stream(hidden: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    """Return the residual stream `[T, H]`: `hidden + residual` (a new tensor), or a copy of `hidden` before layer 0."""
    return hidden.clone() if residual is None else hidden + residual


class ResidualCapture:
    """Hooks on `model` (a vLLM base model with `.layers` and `.norm`) recording `layer_ids` per forward."""

    def __init__(self, model: nn.Module, layer_ids: list[int]) -> None:
        self.model, self.layer_ids = model, sorted(set(layer_ids))
        layers = list(model.layers)
        if self.layer_ids[0] < 0 or self.layer_ids[-1] > len(layers):
            raise ValueError(f"layer ids {self.layer_ids} out of range for {len(layers)} layers")
        self.records: list[dict[str, torch.Tensor]] = []
        self._current: dict[int, torch.Tensor] = {}
        self._token_ids: torch.Tensor | None = None
        self._handles = [model.register_forward_pre_hook(self._on_model, with_kwargs=True)]
        for layer_id in self.layer_ids:
            if layer_id < len(layers):
                self._handles.append(layers[layer_id].register_forward_pre_hook(self._on_layer(layer_id), with_kwargs=True))
        self._handles.append(model.norm.register_forward_pre_hook(self._on_norm, with_kwargs=True))

    def _on_model(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._current = {}
        self._token_ids = _argument(args, kwargs, "input_ids", 0)

    def _on_layer(self, layer_id: int):  # noqa: ANN202 - a torch hook closure
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            hidden = _argument(args, kwargs, "hidden_states", 1)  # [T, H]
            self._current[layer_id] = _stream(hidden, _argument(args, kwargs, "residual", 2))

        return hook

    def _on_norm(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = _argument(args, kwargs, "x", 0)  # [T, H]
        self._current[len(self.model.layers)] = _stream(hidden, _argument(args, kwargs, "residual", 1))
        if self._token_ids is None:
            raise RuntimeError("eyas capture: the model was called without input_ids (inputs_embeds?)")
        self.records.append({
            "token_ids": self._token_ids.detach().to("cpu", torch.int64),  # [T]
            "hidden_states": torch.stack([self._current[k] for k in self.layer_ids], dim=1).cpu(),  # [T, n, H]
        })
        self._current, self._token_ids = {}, None

    def take(self) -> list[dict[str, torch.Tensor]]:
        """Return the records of the forwards since the last call, oldest first, and forget them."""
        records, self.records = self.records, []
        return records

    def remove(self) -> None:
        """Remove every hook."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
