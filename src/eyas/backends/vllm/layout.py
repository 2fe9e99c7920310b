"""What the vLLM backend asks vLLM for, and how vLLM's per-request hidden states become aux and last features.

vLLM's `eagle_aux_hidden_state_layer_ids` count in the *input* convention (id k: the residual
stream entering decoder layer k; id N: the last layer's output, before the final norm), which
is the convention the store keeps. The backend asks for the sorted, unique union of the aux
ids and N; vLLM returns the layers in ascending id order, `hidden_states [T, n, H]`.
"""

from __future__ import annotations

import numpy as np
import torch

from eyas.errors import EyasError
from eyas.models.layers import from_input_convention


def vllm_layer_ids(aux_ids: list[int], num_layers: int) -> list[int]:
    """Return the ids to request from vLLM (input convention, sorted, unique): the aux ids and `num_layers`."""
    return sorted(set(from_input_convention(aux_ids, "input")) | {num_layers})


def layer_features(hidden: torch.Tensor, token_ids: torch.Tensor, requested: list[int], aux_ids: list[int],
                   num_layers: int, input_ids: np.ndarray, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Return `(aux [T, A*H], last [T, H])` of one request from vLLM's `hidden [T, len(requested), H]` and
    `token_ids [T]` (aux in the order of `aux_ids`; the caller stores them under its sample).

    Refuses (naming `where`) tokens that are not the request's `input_ids`, or a layer count or length
    that does not match: features of another prompt must never be stored under this sample's id.
    """
    length = len(input_ids)
    if hidden.dim() != 3 or hidden.shape[1] != len(requested):
        raise EyasError(f"{where}: hidden_states has shape {tuple(hidden.shape)}, expected [{length}, {len(requested)}, H]")
    if hidden.shape[0] < length or not torch.equal(token_ids[:length].cpu().long(), torch.from_numpy(input_ids.astype(np.int64))):
        raise EyasError(f"{where}: the tokens vLLM ran are not this sample's (length {hidden.shape[0]} vs {length}); "
                        "was prefix caching or chunked prefill switched on?")
    column = {layer: i for i, layer in enumerate(requested)}
    states = hidden[:length]  # [T, n, H]
    aux = torch.cat([states[:, column[k]] for k in aux_ids], dim=-1).cpu()  # [T, A*H]
    return aux, states[:, column[num_layers]].cpu()  # [T, H]
