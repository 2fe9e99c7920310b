"""Auxiliary layer ids and the two conventions engines use for them.

eyas stores every id in the *input* convention: id `k` is the residual-stream input of decoder
layer `k` (the EAGLE reference trainer and vLLM read ids this way); id `N` is the input of the
final norm, i.e. the last layer's output. SGLang, SpecForge and ModelOpt use the *output*
convention: id `k` is the output of decoder layer `k`, which is the input of layer `k + 1`.
Same tensors, numbers one apart; converting is explicit everywhere.
"""

from __future__ import annotations

from typing import Literal

from eyas.errors import EyasError

Convention = Literal["input", "output"]


def default_aux_layers(num_layers: int) -> list[int]:
    """Return EAGLE-3's default ids in the input convention: inputs of layers 2, N//2 and N-3."""
    ids = [2, num_layers // 2, num_layers - 3]
    if len(set(ids)) < 3 or ids != sorted(ids):
        raise EyasError(f"num_hidden_layers: {num_layers} is too few for EAGLE-3's default layers {ids}; give --layers")
    return ids


def to_input_convention(ids: list[int], convention: Convention, num_layers: int) -> list[int]:
    """Return `ids` (given in `convention`) in the input convention; refuses ids out of range.

    Input ids run from 0 (the embeddings) to N (the final norm's input); output ids from 0 to N-1.
    """
    highest = num_layers if convention == "input" else num_layers - 1
    bad = [i for i in ids if not 0 <= i <= highest]
    if bad:
        raise EyasError(
            f"layers: {bad} out of range for a {num_layers}-layer target in the {convention} convention (0..{highest})"
        )
    if len(set(ids)) != len(ids):
        raise EyasError(f"layers: {ids} repeats an id")
    return [i + 1 for i in ids] if convention == "output" else list(ids)


def from_input_convention(ids: list[int], convention: Convention) -> list[int]:
    """Return input-convention `ids` written in `convention` (for export to an engine)."""
    return [i - 1 for i in ids] if convention == "output" else list(ids)
