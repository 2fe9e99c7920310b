"""Why a greedy speculative output differs from the target alone's: a rounding near-tie, or a bug.

Under greedy decoding the speculative decoder commits the target's argmax at every position, so its
output equals the target alone's unless the two runs' target forwards disagree on an argmax. They can:
the target alone computes each token in a one-token forward, the speculative decoder in a verification
forward over several tokens, and in reduced precision the two round differently. Such a flip is a
near-tie: at the first position p where the outputs differ, with `a` the target alone's token and `s`
the speculative one, and the two forwards' top-2 margins `m_alone = z_a - z_second` (one-token forward)
and `m_spec = z_s - z_second` (verification forward),

    m_alone + m_spec <= (z_a - z_s)_alone - (z_a - z_s)_spec,

the change of one logit difference between two forwards of the same text, which rounding bounds
(`rounding_bound`). A divergence is explained when the verification committed its own row's argmax and
the margins sum to no more than the bound; anything else (a token the verification did not rank first,
or margins too wide for rounding) is a decoder bug.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from eyas.decode.decoder import Generation

OUTPUT_ULPS = 8.0  # ulp(M) allowed for the dtype's own roundings (derivation: rounding_bound)
ACCUMULATION_ULPS = 2.0  # times sqrt(H) ulp(M) of the accumulator, for reordered sums over the hidden size


def ulp(dtype: torch.dtype, magnitude: float) -> float:
    """Return the spacing of `dtype`'s numbers at `magnitude` (its unit in the last place; the subnormal
    spacing below the smallest normal). Refuses a non-floating dtype."""
    info = torch.finfo(dtype)
    _, exponent = math.frexp(max(abs(magnitude), info.tiny))  # magnitude = m * 2**exponent, m in [0.5, 1)
    return info.eps * 2.0 ** (exponent - 1)


def rounding_bound(dtype: torch.dtype, magnitude: float, hidden_size: int) -> float:
    """Return how far two forwards of the same text in `dtype`, batched differently, may disagree on the
    difference of two logits of a row whose largest |logit| is `magnitude` (M); H = `hidden_size`.

        bound = 8 ulp_dtype(M) + 2 sqrt(H) ulp_acc(M),   acc = float64 for float64, float32 otherwise

    - The dtype's roundings: each logit is stored in the dtype, so a difference of two logits carries at
      most one ulp(M) of output rounding per forward, two between two forwards; the hidden state it reads
      was rounded to the dtype at every layer by kernels that differ between a one-token and a batched
      forward, which adds as much again or less. Measured on SmolLM2-135M (30 layers, H = 576), one-token
      against 5- and 16-token forwards on ~1,100 positions: at most 3 ulp(M) in bfloat16 and in float16;
      8 allows 2.7x that.
    - Accumulation: the dot products over the hidden size sum in float32 (bfloat16 and float16 kernels
      accumulate in float32) in an order that differs between the two forwards; the error of such a sum
      grows as sqrt(H) ulps of the accumulator at the scale of its result (probabilistic rounding-error
      analysis, Higham and Mary 2019). Measured in float32 on the same model: at most 20 ulp(M) =
      0.83 sqrt(H); 2 sqrt(H) allows 2.4x that. In bfloat16 this term is 2^-16 of the first, negligible.
    Refuses a non-floating dtype.
    """
    accumulator = torch.float64 if dtype == torch.float64 else torch.float32
    return OUTPUT_ULPS * ulp(dtype, magnitude) + ACCUMULATION_ULPS * math.sqrt(hidden_size) * ulp(accumulator, magnitude)


def first_divergence(alone: Generation, speculative: Generation, dtype: torch.dtype,
                     hidden_size: int) -> dict[str, Any] | None:
    """Return None when the two greedy generations are identical, else the first divergence: `position`
    (of the new tokens), `tokens` the two runs committed there, each forward's top-2 `top2` and margin
    (`margin_alone`, `margin_speculative`), `magnitude` (the larger row's largest |logit|), `bound`
    (`rounding_bound`), `verified_top1` (the verification committed its row's argmax) and `near_tie`
    (module docstring). Refuses generations without choices (sampled) and outputs that differ in length
    only (two greedy runs with the same stops cannot)."""
    if alone.choices is None or speculative.choices is None:
        raise ValueError("divergence: both generations need their target choices (greedy decoding)")
    position = next((p for p, (a, s) in enumerate(zip(alone.tokens, speculative.tokens)) if a != s), None)
    if position is None:
        if len(alone.tokens) != len(speculative.tokens):
            raise ValueError(f"divergence: outputs of {len(alone.tokens)} and {len(speculative.tokens)} tokens "
                             "agree where both exist")
        return None
    top1_a, top2_a, scale_a = alone.choices.logits[position].tolist()
    top1_s, top2_s, scale_s = speculative.choices.logits[position].tolist()
    argmax_s = int(speculative.choices.ids[position, 0])
    magnitude = max(scale_a, scale_s)
    bound = rounding_bound(dtype, magnitude, hidden_size)
    margin_alone, margin_spec = top1_a - top2_a, top1_s - top2_s
    verified_top1 = speculative.tokens[position] == argmax_s
    return {"position": position,
            "tokens": {"target_alone": alone.tokens[position], "speculative": speculative.tokens[position]},
            "top2": {"target_alone": alone.choices.ids[position, 1:].tolist(),
                     "speculative": speculative.choices.ids[position, 1:].tolist()},
            "margin_alone": margin_alone, "margin_speculative": margin_spec, "magnitude": magnitude, "bound": bound,
            "verified_top1": verified_top1, "near_tie": verified_top1 and margin_alone + margin_spec <= bound}


class Divergence(BaseModel):
    """Where one prompt's outputs first differ, and whether rounding explains it (`first_divergence`)."""

    prompt: int
    position: int
    margin_alone: float
    margin_speculative: float
    bound: float
    verified_top1: bool


class DivergenceSummary(BaseModel):
    """Greedy decoding: the speculative outputs against the target alone's, over the prompts."""

    prompts: int
    identical: int
    near_ties: list[Divergence] = Field(description="divergences a rounding near-tie explains")
    unexplained: list[Divergence] = Field(description="divergences rounding does not explain: a decoder bug")
    unexamined: int = Field(0, description="differing outputs decoded before eyas recorded divergences")


def summarize_divergences(results: list[dict[str, Any]]) -> DivergenceSummary:
    """Return the summary of eval's per-prompt `results` lines (`divergence`: `first_divergence`'s record;
    a line without one, written by an older eyas, counts as unexamined when its outputs differ)."""
    near_ties: list[Divergence] = []
    unexplained: list[Divergence] = []
    unexamined = 0
    for line in results:
        if "divergence" not in line:
            unexamined += not line["same_tokens"]
        elif (found := line["divergence"]) is not None:
            (near_ties if found["near_tie"] else unexplained).append(Divergence(prompt=line["prompt"], **{
                key: found[key] for key in ("position", "margin_alone", "margin_speculative", "bound", "verified_top1")}))
    return DivergenceSummary(prompts=len(results), identical=sum(line["same_tokens"] for line in results),
                             near_ties=near_ties, unexplained=unexplained, unexamined=unexamined)
