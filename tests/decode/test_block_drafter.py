"""The P-EAGLE draft decoding through the one round loop, with a draft trained on the learned pair's store.

Greedy: the output equals transformers' own greedy `generate` for chains and the auto shape, with one draft
forward per round (the block). Sampling: the joint distribution of the first three tokens matches the target's
exact distribution, by the chi-square test the EAGLE-3 chain passes, and the same draws through a verifier with
the wrong residual fail it (the test's power).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_decoder import (FLAT, NEW_TOKENS, exact_joint, hf_greedy, joint_p_value, overconfident, repeating,
                          sample_joint, wrong_chain_verifier)

from eyas.decode.decoder import Decoder
from eyas.decode.sampling import Sampling
from eyas.decode.shapes import AutoShape, TreeShape
from eyas.draft.model import Eagle3Draft, load_draft
from eyas.models.load import load_target
from eyas.models.parts import TargetParts
from eyas.testing.learned import decode_prompts

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pair(learned: dict[str, Path], learned_peagle: Path) -> tuple[TargetParts, Eagle3Draft, list[list[int]]]:
    parts = load_target(learned["target"], torch.float64, "cpu")
    draft = load_draft(learned_peagle, parts.embed.weight.detach()).double().eval()
    return parts, draft, decode_prompts(learned["target"])


@pytest.mark.parametrize("length", [1, 3, 5])
def test_greedy_block_output_is_the_targets_own_in_one_draft_forward_per_round(pair, length: int) -> None:
    parts, draft, prompts = pair
    rounds = []
    for prompt in prompts:
        generated = Decoder(parts, draft, TreeShape.chain_of(length), Sampling(), set()).generate(prompt, NEW_TOKENS)
        assert generated.tokens == hf_greedy(parts, prompt, NEW_TOKENS, None), prompt
        assert generated.draft_forwards == len(generated.accepted)  # the block, with the anchors it reads
        assert set(generated.drafted) == {length}
        rounds += generated.accepted
    if length > 1:
        assert max(rounds) >= 2  # the parallel slots' tokens were accepted too
    assert 1 + sum(rounds) / len(rounds) > 1.3  # a learned draft (an untrained one stays near 1.0)


def test_a_tree_of_a_block_drafter_is_refused(pair) -> None:
    parts, draft, _ = pair
    with pytest.raises(ValueError, match="drafts a chain in one forward, not a tree 3,2,5"):
        Decoder(parts, draft, TreeShape(3, 2, 5), Sampling(), set())


def test_greedy_auto_with_the_block_is_the_targets_own(pair) -> None:
    """Under flat costs every round drafts the longest block, one draft forward whatever its length."""
    parts, draft, prompts = pair
    decoder = Decoder(parts, draft, AutoShape(4, 6), Sampling(), set(), costs=FLAT)
    for prompt in prompts:
        generated = decoder.generate(prompt, NEW_TOKENS)
        assert generated.tokens == hf_greedy(parts, prompt, NEW_TOKENS, None), prompt
        assert min(generated.drafted) == 4
        assert generated.draft_forwards == len(generated.accepted)


def test_sampling_with_the_block_preserves_the_targets_distribution(pair) -> None:
    parts, draft, prompts = pair
    sampling = Sampling(temperature=2.0, top_k=5)
    prompt = prompts[0]
    expected = exact_joint(parts, prompt, sampling, 3)
    decoder = Decoder(parts, overconfident(draft), TreeShape.chain_of(3), sampling, set(), seed=7)
    observed, accepted, rejected = sample_joint(decoder, prompt, 1200)
    assert accepted > 200 and rejected > 200
    assert joint_p_value(observed, expected) > 1e-3


def test_the_block_check_catches_a_wrong_residual(pair, monkeypatch: pytest.MonkeyPatch) -> None:
    parts, draft, prompts = pair
    sampling = Sampling(temperature=2.0, top_k=5)
    prompt = prompts[0]
    expected = exact_joint(parts, prompt, sampling, 3)
    monkeypatch.setattr("eyas.decode.decoder.accept_sampled_chain", wrong_chain_verifier)
    decoder = Decoder(parts, overconfident(draft), TreeShape.chain_of(3), sampling, set(), seed=7)
    observed, _, _ = sample_joint(decoder, prompt, 1200)
    assert joint_p_value(observed, expected) < 1e-4


def test_sampling_with_the_auto_block_preserves_the_targets_distribution(pair) -> None:
    parts, draft, prompts = pair
    sampling = Sampling(temperature=2.0, top_k=5)
    prompt = repeating(parts, prompts[0])
    expected = exact_joint(parts, prompt, sampling, 3)
    decoder = Decoder(parts, overconfident(draft), AutoShape(3, 3), sampling, set(), seed=7, costs=FLAT)
    observed, accepted, rejected = sample_joint(decoder, prompt, 1200)
    assert accepted > 100 and rejected > 100
    assert joint_p_value(observed, expected) > 1e-3
