"""Starting the draft's decoder layers from one of the target's (`train.init_layer`).

A draft layer has a target layer's shapes except where the first one reads `cat(embedding, feature)`:
its `q_proj`, `k_proj`, `v_proj` are `[out, 2H]`, the embedding half first. The target layer's
projections `[out, H]` read the residual stream, which is what the fused feature stands for, so they
go to the feature half `[:, H:]`; the embedding half keeps its random initialisation. The target
layer's `input_layernorm` (the norm of its residual-stream input) becomes the first layer's
`hidden_norm`; its `input_layernorm` on the embedding stays at ones. Every other tensor (`o_proj`,
the MLP, `post_attention_layernorm`; all of a later layer) is copied as it is.
"""

from __future__ import annotations

import torch

from eyas.draft.model import DraftLayer
from eyas.errors import EyasError

FEATURE_HALF = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")


def _placement(layer: DraftLayer, name: str) -> str:
    """Return the draft tensor that target tensor `name` initialises in `layer`."""
    if layer.first and name == "input_layernorm.weight":
        return "hidden_norm.weight"
    return name


@torch.no_grad()
def init_from_target_layer(layer: DraftLayer, target_layer: dict[str, torch.Tensor], where: str) -> None:
    """Copy `target_layer` (a target decoder layer's tensors by their names in the layer) into `layer`.

    Refuses, naming `where` and the tensor, a target tensor the draft layer has no place for (biases,
    per-head q/k norms, experts) or one whose shape differs from its place: a draft that cannot take a
    whole layer is not started from part of one.
    """
    own = dict(layer.named_parameters())
    hidden = layer.post_attention_layernorm.weight.shape[0]
    for name, tensor in target_layer.items():
        place = _placement(layer, name)
        if place not in own:
            raise EyasError(f"{where}: {name}: the draft's decoder layer has no such tensor; init_layer needs a "
                            "Llama-shaped target layer (attention without biases or q/k norms, a SwiGLU MLP)")
        weight = own[place]
        destination = weight[:, hidden:] if layer.first and name in FEATURE_HALF else weight  # [out, H] of [out, 2H]
        if destination.shape != tensor.shape:
            raise EyasError(f"{where}: {name}: shape {list(tensor.shape)}, the draft's {place} takes "
                            f"{list(destination.shape)}")
        destination.copy_(tensor.to(weight.dtype))
