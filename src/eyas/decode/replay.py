"""Greedy chain decoding replayed against the target's own greedy continuation: tau without verification
forwards.

The target's continuation of each prompt is generated once (`CHAIN_MOST` tokens past the budget, with no
stop, so every chain can be checked to its end), with the target's features of every token from one forward
over it. The decoder's own round loop then runs against that recording (eyas.decode.recorded), so its
accepted counts are the decoder's by construction, up to float differences between the one batched forward
and the decoder's incremental ones (tests/decode check them against the decoder on the model); the cost is
the draft's forwards only, so many drafts can be scored against one continuation (bench/quality.py).
"""

from __future__ import annotations

import torch

from eyas.decode.decoder import Decoder, Generation
from eyas.decode.recorded import Continuation
from eyas.decode.sampling import Sampling
from eyas.decode.shapes import TreeShape
from eyas.draft.model import Eagle3Draft
from eyas.models.capture import FeatureCapture
from eyas.models.parts import TargetParts

CHAIN_MOST = 16  # the longest chain a continuation can replay


def greedy_continuation(parts: TargetParts, prompt: list[int], max_new_tokens: int,
                        aux_layer_ids: list[int]) -> Continuation:
    """Return the target's greedy continuation of `prompt` and its features at `aux_layer_ids`."""
    tokens = Decoder(parts, None, None, Sampling(), set()).generate(prompt, max_new_tokens + CHAIN_MOST).tokens
    sequence = torch.tensor([prompt + tokens], device=parts.lm_head.weight.device)
    with FeatureCapture(parts, aux_layer_ids) as capture, torch.inference_mode():
        aux = capture.run(sequence, torch.ones_like(sequence)).aux[0]  # [T, A*H]
    vocab_size = parts.lm_head.weight.shape[0]
    return Continuation(prompt, tokens, max_new_tokens, aux.cpu(), list(aux_layer_ids), vocab_size)


def greedy_continuations(parts: TargetParts, prompts: list[list[int]], max_new_tokens: int,
                         aux_layer_ids: list[int]) -> list[Continuation]:
    """Return `greedy_continuation` of each prompt, in order: a held-out set's continuations, computed once
    and shared by every draft scored on them."""
    return [greedy_continuation(parts, prompt, max_new_tokens, aux_layer_ids) for prompt in prompts]


def replayed(draft: Eagle3Draft, continuation: Continuation, chain: int, eos: set[int]) -> Generation:
    """Return the generation of greedy chain-`chain` decoding of the continuation's prompt replayed against the
    recording, stopping after an EOS in `eos` or at the budget. Refuses a chain longer than `CHAIN_MOST`."""
    if not 1 <= chain <= CHAIN_MOST:
        raise ValueError(f"replay: chain {chain}: 1..{CHAIN_MOST}")
    decoder = Decoder(continuation, draft, TreeShape.chain_of(chain), Sampling(), eos)
    return decoder.generate(continuation.prompt, continuation.max_new_tokens)


def replay_chain(draft: Eagle3Draft, continuation: Continuation, chain: int, eos: set[int]) -> list[int]:
    """Return the draft tokens accepted per round of `replayed` (the prefill is not a round)."""
    return replayed(draft, continuation, chain, eos).accepted


def pooled_chain_tau(draft: Eagle3Draft, continuations: list[Continuation], chain: int, eos: set[int]) -> dict[str, float]:
    """Return `pooled_figures` of greedy chain-`chain` decoding replayed over every continuation."""
    return pooled_figures([replayed(draft, continuation, chain, eos) for continuation in continuations])


def pooled_figures(generations: list[Generation]) -> dict[str, float]:
    """Return `tau` (1 + mean accepted per round), `first_acceptance` (share of rounds accepting a token) and
    `rounds` of `generations`, rounds pooled: functions of the tokens alone, so a rerun gives the same figures."""
    rounds = [a for generation in generations for a in generation.accepted]
    return {"tau": round(1 + sum(rounds) / len(rounds), 4),
            "first_acceptance": round(sum(a > 0 for a in rounds) / len(rounds), 4), "rounds": len(rounds)}
