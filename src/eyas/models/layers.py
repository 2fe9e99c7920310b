"""Auxiliary layer ids: the two conventions engines count them in, EAGLE-3's defaults, and the one
check every list of ids passes.

eyas stores every id in the *input* convention: id `k` is the residual-stream input of decoder
layer `k` (the EAGLE reference trainer and vLLM read ids this way); id `N` is the input of the
final norm, i.e. the last layer's output. SGLang, SpecForge and ModelOpt use the *output*
convention: id `k` is the output of decoder layer `k`, which is the input of layer `k + 1`.
Same tensors, numbers one apart; converting is explicit everywhere.

Ids must be in range for the target and distinct. eyas captures them in the order given, but
vLLM and SGLang collect the aux hidden states in their layer loop, so they concatenate them in
ascending order whatever order the ids are written in: ids an engine reads must ascend, or the
draft would read its features shuffled.
"""

from __future__ import annotations

from typing import Literal

from eyas.errors import EyasError

Convention = Literal["input", "output"]


def _range_problems(ids: list[int], convention: Convention, num_layers: int | None) -> list[str]:
    """Return the ids of `ids` out of range in `convention` as one phrase (empty when all are in range)."""
    if num_layers is None:
        bad = [i for i in ids if i < 0]
        where = f"in the {convention} convention (ids start at 0)"
    else:
        highest = num_layers if convention == "input" else num_layers - 1
        bad = [i for i in ids if not 0 <= i <= highest]
        where = f"for a {num_layers}-layer target in the {convention} convention (0..{highest})"
    if not bad:
        return []
    if convention == "output" and -1 in bad:
        where += "; the embedding output (input id 0) has no output-convention id"
    return [f"{bad} out of range {where}"]


def layer_id_problems(ids: list[int], convention: Convention, num_layers: int | None, engine: bool = False) -> list[str]:
    """Return what is wrong with aux layer `ids` counted in `convention` (empty: nothing), one phrase each:
    ids out of range for a `num_layers`-layer target (when `num_layers` is None, only negative ids),
    a repeated id, and, for ids an `engine` reads, ids not in ascending order."""
    problems = _range_problems(ids, convention, num_layers)
    if len(set(ids)) != len(ids):
        problems.append(f"{ids} repeats an id")
    elif engine and ids != sorted(ids):
        problems.append(f"{ids} not ascending (engines concatenate the layers in ascending order)")
    return problems


def check_layer_ids(ids: list[int], convention: Convention, num_layers: int | None, field: str = "layers",
                    engine: bool = False) -> list[int]:
    """Return `ids` when `layer_id_problems` finds nothing; refuses them otherwise, in one line naming `field`."""
    problems = layer_id_problems(ids, convention, num_layers, engine)
    if problems:
        raise EyasError("; ".join(f"{field}: {problem}" for problem in problems))
    return list(ids)


def default_aux_layers(num_layers: int, remedy: str = "give --layers") -> list[int]:
    """Return EAGLE-3's default ids in the input convention: inputs of layers 2, N//2 and N-3.

    Refuses a target too shallow for three distinct ascending ids, naming `remedy`.
    """
    ids = [2, num_layers // 2, num_layers - 3]
    if layer_id_problems(ids, "input", num_layers, engine=True):
        raise EyasError(f"num_hidden_layers: {num_layers} is too few for EAGLE-3's default layers {ids}; {remedy}")
    return ids


def to_input_convention(ids: list[int], convention: Convention, num_layers: int | None,
                        field: str = "layers", engine: bool = False) -> list[int]:
    """Return `ids` (given in `convention`; written for an engine when `engine`) in the input convention;
    refuses what `check_layer_ids` refuses.

    Input ids run from 0 (the embeddings) to N (the final norm's input); output ids from 0 to N-1.
    """
    check_layer_ids(ids, convention, num_layers, field, engine)
    return [i + 1 for i in ids] if convention == "output" else list(ids)


def from_input_convention(ids: list[int], convention: Convention, num_layers: int | None = None,
                          field: str = "aux_layer_ids", engine: bool = False) -> list[int]:
    """Return input-convention `ids` written in `convention` (for an engine when `engine`); refuses
    results that `check_layer_ids` refuses, e.g. input id 0 (the embeddings) in the output convention."""
    converted = [i - 1 for i in ids] if convention == "output" else list(ids)
    return check_layer_ids(converted, convention, num_layers, field, engine)


def to_engine_ids(ids: list[int], convention: Convention) -> list[int]:
    """Return input-convention `ids` as an engine counting in `convention` reads them (for export);
    refuses ids it would misread: ids the convention cannot name, ids out of ascending order."""
    return from_input_convention(ids, convention, engine=True)
