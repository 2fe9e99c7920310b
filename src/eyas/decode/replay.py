"""Greedy chain decoding replayed against the target's own greedy continuation: tau without verification forwards.

Under greedy decoding the committed text is the target's greedy continuation whatever the draft
proposes, and the draft's chain in a round depends only on the committed text and the target's
features of it. So the target's continuation (generated once, `CHAIN_MOST` tokens past the budget,
with no stop, so every chain can be checked to its end) and one target forward over it give
everything a chain round needs: the draft proposes K tokens from the root anchor, the round accepts
the leading ones that equal the continuation, commits them and one more (stopping at an EOS or the
budget as the decoder does), and the draft reads the new anchors with the target's features. The
accepted counts equal those of `Decoder(..., TreeShape.chain_of(K), Sampling())` (tests/decode check
it against the decoder itself), up to float differences between one batched forward and the
decoder's incremental ones; the cost is draft forwards only, so many drafts can be scored against
one continuation (bench/quality.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eyas.decode.decoder import Decoder, commit_tokens, generation_done, matched_prefix
from eyas.decode.drafting import draft_chain, target_ids_of
from eyas.decode.runners import DraftRunner
from eyas.decode.sampling import Sampling
from eyas.draft.model import Eagle3Draft
from eyas.models.capture import FeatureCapture
from eyas.models.parts import TargetParts

CHAIN_MOST = 16  # the longest chain a continuation can replay


@dataclass(frozen=True)
class Continuation:
    """A prompt, the target's greedy continuation `tokens` (`max_new_tokens + CHAIN_MOST`, no stop), the
    budget, and `aux [len(prompt) + len(tokens), A*H]`: the target's features of every token."""

    prompt: list[int]
    tokens: list[int]
    max_new_tokens: int
    aux: torch.Tensor


def greedy_continuation(parts: TargetParts, prompt: list[int], max_new_tokens: int,
                        aux_layer_ids: list[int]) -> Continuation:
    """Return the target's greedy continuation of `prompt` and its features at `aux_layer_ids`."""
    tokens = Decoder(parts, None, None, Sampling(), set()).generate(prompt, max_new_tokens + CHAIN_MOST).tokens
    sequence = torch.tensor([prompt + tokens], device=parts.lm_head.weight.device)
    with FeatureCapture(parts, aux_layer_ids) as capture, torch.inference_mode():
        aux = capture.run(sequence, torch.ones_like(sequence)).aux[0]  # [T, A*H]
    return Continuation(prompt, tokens, max_new_tokens, aux)


def greedy_continuations(parts: TargetParts, prompts: list[list[int]], max_new_tokens: int,
                         aux_layer_ids: list[int]) -> list[Continuation]:
    """Return `greedy_continuation` of each prompt, in order: a held-out set's continuations, computed once
    and shared by every draft scored on them."""
    return [greedy_continuation(parts, prompt, max_new_tokens, aux_layer_ids) for prompt in prompts]


def replay_chain(draft: Eagle3Draft, continuation: Continuation, chain: int, eos: set[int]) -> list[int]:
    """Return the draft tokens accepted per round by greedy chain-`chain` decoding of the continuation's
    prompt (the prefill is not a round), stopping after an EOS in `eos` or at the budget.
    Refuses a chain longer than `CHAIN_MOST`."""
    if not 1 <= chain <= CHAIN_MOST:
        raise ValueError(f"replay: chain {chain}: 1..{CHAIN_MOST}")
    sequence = continuation.prompt + continuation.tokens  # x_0 .. x_T-1
    drafter = DraftRunner(draft)
    target_ids = target_ids_of(drafter)
    last = len(continuation.prompt)  # index of the last committed token (the prefill committed x_P)
    committed = [sequence[last]]
    root = drafter.forward(drafter.fuse(continuation.aux[:last]), torch.tensor(sequence[1:last + 1]),
                           torch.arange(last))  # anchors 0..P-1
    accepted: list[int] = []
    while not generation_done(committed, continuation.max_new_tokens, eos):
        proposed = draft_chain(drafter, root, last - 1, chain, target_ids)
        drafter.crop(last)
        matched = matched_prefix(proposed, sequence[last + 1:last + 1 + chain])
        accepted.append(matched)
        new = sequence[last + 1:last + matched + 2]
        commit_tokens(committed, new, continuation.max_new_tokens, eos)
        root = drafter.forward(drafter.fuse(continuation.aux[last:last + len(new)]), torch.tensor(new),
                               torch.arange(last, last + len(new)))  # anchors of the new tokens
        last += len(new)
    return accepted


def pooled_chain_tau(draft: Eagle3Draft, continuations: list[Continuation], chain: int, eos: set[int]) -> dict[str, float]:
    """Return `tau` (1 + mean accepted per round), `first_acceptance` (share of rounds accepting a token) and
    `rounds` of greedy chain-`chain` decoding replayed over every continuation, rounds pooled."""
    rounds = [a for continuation in continuations for a in replay_chain(draft, continuation, chain, eos)]
    return {"tau": round(1 + sum(rounds) / len(rounds), 4),
            "first_acceptance": round(sum(a > 0 for a in rounds) / len(rounds), 4), "rounds": len(rounds)}
