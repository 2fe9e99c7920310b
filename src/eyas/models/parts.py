"""Locate the pieces of a causal LM that eyas needs, generically across model families."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from eyas.errors import EyasError

_LAYER_LISTS = ("layers", "h", "blocks", "decoder.layers")
_FINAL_NORMS = ("norm", "final_layernorm", "final_layer_norm", "ln_f", "final_norm")


@dataclass(frozen=True)
class TargetParts:
    """The base model (decoder stack without LM head) and the modules capture and the teacher use."""

    model: nn.Module
    base: nn.Module
    layers: nn.ModuleList
    final_norm: nn.Module
    lm_head: nn.Linear
    embed: nn.Module

    @property
    def num_layers(self) -> int:
        return len(self.layers)


def _attr(module: nn.Module, dotted: str) -> Any:
    for name in dotted.split("."):
        module = getattr(module, name, None)
        if module is None:
            return None
    return module


def locate_parts(model: nn.Module) -> TargetParts:
    """Return the parts of a Hugging Face causal LM (Llama, Qwen, Mistral, Gemma, Phi-3, GPT-NeoX,
    DeepSeek-V3, ...); refuses, naming the model class, one whose layout it cannot find."""
    name = type(model).__name__
    base = getattr(model, "base_model", None)
    if base is None or base is model:  # a prefix naming no attribute (Llama4ForCausalLM's): the usual `model`
        base = getattr(model, "model", None)
    if not isinstance(base, nn.Module) or base is model:
        raise EyasError(f"{name}: no base model under the LM head; eyas needs a *ForCausalLM model")
    expected = getattr(model.config, "num_hidden_layers", None)
    layers = next(
        (found for path in _LAYER_LISTS if isinstance(found := _attr(base, path), nn.ModuleList)
         and (expected is None or len(found) == expected)),
        None,
    )
    norm = next((found for path in _FINAL_NORMS if isinstance(found := _attr(base, path), nn.Module)), None)
    lm_head = model.get_output_embeddings()
    problems = [
        what for what, found in (
            (f"decoder layer list (looked for {', '.join(_LAYER_LISTS)} with {expected} entries)", layers),
            (f"final norm (looked for {', '.join(_FINAL_NORMS)})", norm),
            ("LM head (get_output_embeddings)", lm_head),
        ) if found is None
    ]
    if problems:
        raise EyasError(f"{name}: cannot locate the {'; the '.join(problems)}")
    return TargetParts(model, base, layers, norm, lm_head, model.get_input_embeddings())
