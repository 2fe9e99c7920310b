"""The block drafters (P-EAGLE, DFlash) decoding through the one round loop, with drafts trained on the learned
pair's store.

Greedy: the output equals transformers' own greedy `generate` for chains (and, P-EAGLE, the auto shape), with one
draft forward per round (the block). Sampling: the joint distribution of the first three tokens matches the
target's exact distribution, by the chi-square test the EAGLE-3 chain passes, and the same draws through a verifier
with the wrong residual fail it (the test's power).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_decoder import (FLAT, NEW_TOKENS, exact_joint, hf_greedy, joint_p_value, overconfident, repeating,
                          sample_joint, wrong_residual_p_value)

from eyas.decode.costs import RoundCosts
from eyas.decode.decoder import Decoder
from eyas.decode.sampling import Sampling
from eyas.decode.shapes import AutoShape, TreeShape
from eyas.draft.dflash import Draft
from eyas.draft.model import Eagle3Draft, load_draft
from eyas.models.load import load_target
from eyas.models.parts import TargetParts
from eyas.testing.learned import decode_prompts

pytestmark = pytest.mark.usefixtures("one_thread")

SHORT = RoundCosts.linear(base=1.0, per_token=0.6, draft_step=0.01)  # a second verified token rarely pays


@pytest.fixture(scope="module")
def pair(learned: dict[str, Path], learned_peagle: Path) -> tuple[TargetParts, Eagle3Draft, list[list[int]]]:
    parts = load_target(learned["target"], torch.float64, "cpu")
    draft = load_draft(learned_peagle, parts.embed.weight.detach()).double().eval()
    return parts, draft, decode_prompts(learned["target"])


@pytest.fixture(scope="module", params=["peagle", "dflash"])
def block_pair(request: pytest.FixtureRequest, learned: dict[str, Path]) -> tuple[TargetParts, Draft, list[list[int]]]:
    """The learned target in float64 with a P-EAGLE or a DFlash draft."""
    parts = load_target(learned["target"], torch.float64, "cpu")
    draft_dir = request.getfixturevalue(f"learned_{request.param}")
    draft = load_draft(draft_dir, parts.embed.weight.detach()).double().eval()
    return parts, draft, decode_prompts(learned["target"])


# The block of 4 a DFlash draft trains with TTT_STEPS drafts 3 tokens; a P-EAGLE block may be longer than trained.
@pytest.mark.parametrize("length", [1, 3])
def test_greedy_block_output_is_the_targets_own_in_one_draft_forward_per_round(block_pair, length: int) -> None:
    parts, draft, prompts = block_pair
    rounds = []
    for prompt in prompts:
        generated = Decoder(parts, draft, TreeShape.chain_of(length), Sampling(), set()).generate(prompt, NEW_TOKENS)
        assert generated.tokens == hf_greedy(parts, prompt, NEW_TOKENS, None), prompt
        assert generated.draft_forwards == len(generated.accepted)  # the block, with the features it reads
        assert set(generated.drafted) == {length}
        rounds += generated.accepted
    assert 1 + sum(rounds) / len(rounds) > 1.05  # drafts are accepted (thresholds per family: below)
    if draft.config.family == "peagle":
        assert 1 + sum(rounds) / len(rounds) > 1.3 and (length == 1 or max(rounds) >= 2)


def test_a_peagle_block_longer_than_trained_is_still_the_targets_own(pair) -> None:
    parts, draft, prompts = pair
    for prompt in prompts[:4]:
        generated = Decoder(parts, draft, TreeShape.chain_of(5), Sampling(), set()).generate(prompt, NEW_TOKENS)
        assert generated.tokens == hf_greedy(parts, prompt, NEW_TOKENS, None), prompt


def test_a_tree_of_a_block_drafter_is_refused(block_pair) -> None:
    parts, draft, _ = block_pair
    with pytest.raises(ValueError, match="drafts a chain in one forward, not a tree 3,2,5"):
        Decoder(parts, draft, TreeShape(3, 2, 5), Sampling(), set())


def test_dflash_refuses_a_chain_longer_than_its_block_and_the_auto_draft_branch(learned: dict[str, Path],
                                                                                learned_dflash: Path) -> None:
    parts = load_target(learned["target"], torch.float64, "cpu")
    draft = load_draft(learned_dflash, parts.embed.weight.detach()).double().eval()
    with pytest.raises(ValueError, match="block size 4 drafts at most 3 tokens, not a chain of 5"):
        Decoder(parts, draft, TreeShape.chain_of(5), Sampling(), set())
    with pytest.raises(ValueError, match="the auto shape drafts with an eagle3 or peagle draft"):
        Decoder(parts, draft, AutoShape(4, 6), Sampling(), set())


@pytest.mark.parametrize("costs", [FLAT, SHORT, None], ids=["flat", "short", "measured"])
def test_greedy_auto_with_the_block_is_the_targets_own(pair, costs: RoundCosts | None) -> None:
    """Under flat costs every round drafts the longest block, one draft forward whatever its length; under costs
    where a verified token costs more than a draft step saves, one-token blocks after idle reads (the root read
    already: no forward); under the measured costs whatever the policy picks."""
    parts, draft, prompts = pair
    decoder = Decoder(parts, draft, AutoShape(4, 6), Sampling(), set(), costs=costs)
    drafted = []
    for prompt in prompts:
        generated = decoder.generate(prompt, NEW_TOKENS)
        assert generated.tokens == hf_greedy(parts, prompt, NEW_TOKENS, None), prompt
        assert generated.draft_forwards <= len(generated.accepted)  # at most one per round
        drafted += generated.drafted
    if costs is FLAT:
        assert min(drafted) == 4
    if costs is SHORT:
        assert 1 in drafted and max(drafted) <= 2


def test_sampling_with_the_block_preserves_the_targets_distribution(block_pair) -> None:
    """Both families' sampled blocks; the DFlash draft, trained as briefly but learning slower, is accepted less
    often, so it is held to fewer accepted first rounds (the verifier's power is the P-EAGLE case's below)."""
    parts, draft, prompts = block_pair
    sampling = Sampling(temperature=2.0, top_k=5)
    prompt = prompts[0]
    expected = exact_joint(parts, prompt, sampling, 3)
    decoder = Decoder(parts, overconfident(draft), TreeShape.chain_of(3), sampling, set(), seed=7)
    observed, accepted, rejected = sample_joint(decoder, prompt, 1200)
    assert accepted > (200 if draft.config.family == "peagle" else 50) and rejected > 200
    assert joint_p_value(observed, expected) > 1e-3


def test_the_block_check_catches_a_wrong_residual(pair, monkeypatch: pytest.MonkeyPatch) -> None:
    parts, draft, prompts = pair
    assert wrong_residual_p_value(parts, draft, prompts[0], monkeypatch) < 1e-4


def test_sampling_with_the_auto_block_preserves_the_targets_distribution(pair) -> None:
    parts, draft, prompts = pair
    sampling = Sampling(temperature=2.0, top_k=5)
    prompt = repeating(parts, prompts[0])
    expected = exact_joint(parts, prompt, sampling, 3)
    decoder = Decoder(parts, overconfident(draft), AutoShape(3, 3), sampling, set(), seed=7, costs=FLAT)
    observed, accepted, rejected = sample_joint(decoder, prompt, 1200)
    assert accepted > 100 and rejected > 100
    assert joint_p_value(observed, expected) > 1e-3
