"""Divergences of a greedy speculative output from the target alone's (eyas.decode.divergence): the rounding
bound, the classification of a first divergence as a near-tie or a bug, and on real decoding in reduced
precision: every divergence a near-tie, and a deliberately wrong verifier's divergences none."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from eyas.decode import decoder as decoder_module
from eyas.decode.choices import TargetChoices
from eyas.decode.costs import RoundCosts
from eyas.decode.decoder import Decoder, Generation
from eyas.decode.divergence import first_divergence, rounding_bound, summarize_divergences, ulp
from eyas.decode.runners import TargetRunner, TargetStep
from eyas.decode.sampling import Sampling
from eyas.decode.shapes import AutoShape, TreeShape
from eyas.decode.tree import DraftTree
from eyas.decode.verify import Verdict, accept_greedy
from eyas.draft.model import load_draft
from eyas.models.load import load_target
from eyas.models.tokenizer import load_tokenizer
from eyas.testing.learned import corpus_conversations, decode_prompts

pytestmark = pytest.mark.usefixtures("one_thread")


def test_ulp_is_the_spacing_of_the_dtype_at_a_magnitude() -> None:
    assert ulp(torch.bfloat16, 1.0) == 2.0 ** -7
    assert ulp(torch.bfloat16, 27.0) == 0.125 and ulp(torch.bfloat16, 32.0) == 0.25 and ulp(torch.bfloat16, -27.0) == 0.125
    assert ulp(torch.float16, 27.0) == 2.0 ** -6 and ulp(torch.float32, 1.0) == 2.0 ** -23
    assert ulp(torch.float64, 1.0) == 2.0 ** -52
    assert 0 < ulp(torch.bfloat16, 0.0) < torch.finfo(torch.bfloat16).tiny  # the subnormal spacing
    for value in (0.75, 3.0, 27.0, 1000.0):  # the next number up is one ulp away
        exact = torch.tensor(value, dtype=torch.bfloat16)
        assert float(torch.nextafter(exact, torch.tensor(math.inf, dtype=torch.bfloat16))) - value == ulp(torch.bfloat16, value)
    with pytest.raises(TypeError):
        ulp(torch.int32, 1.0)


def test_the_rounding_bound() -> None:
    # 8 ulps of the dtype plus 2 sqrt(H) ulps of the float32 accumulator, at the row's largest |logit|
    assert rounding_bound(torch.bfloat16, 27.0, 576) == pytest.approx(8 * 0.125 + 2 * 24 * 2.0 ** -19)
    assert rounding_bound(torch.float32, 27.0, 576) == pytest.approx((8 + 2 * 24) * 2.0 ** -19)
    assert rounding_bound(torch.float64, 1.0, 64) == pytest.approx((8 + 2 * 8) * 2.0 ** -52)  # float64 accumulates in float64
    magnitudes = [0.5, 1.0, 9.0, 27.0, 100.0]
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        bounds = [rounding_bound(dtype, m, 576) for m in magnitudes]
        assert bounds == sorted(bounds)  # a larger logit rounds coarser
    assert rounding_bound(torch.bfloat16, 27.0, 576) > rounding_bound(torch.float16, 27.0, 576) > \
        rounding_bound(torch.float32, 27.0, 576)
    # what it was calibrated on (SmolLM2-135M, H = 576, docstring): the largest measured disagreements fit
    assert 3 * ulp(torch.bfloat16, 27.0) < rounding_bound(torch.bfloat16, 27.0, 576)
    assert 3 * ulp(torch.float16, 27.0) < rounding_bound(torch.float16, 27.0, 576)
    assert 20 * ulp(torch.float32, 27.0) < rounding_bound(torch.float32, 27.0, 576)


def generation(tokens: list[int], rows: list[tuple[float, float, int, int]]) -> Generation:
    """A greedy generation whose row t holds (top-1 logit, top-2 logit, top-1 = argmax, top-2)."""
    logits = torch.tensor([[t1, t2, max(abs(t1), abs(t2))] for t1, t2, _, _ in rows])
    return Generation(tokens, choices=TargetChoices(logits, torch.tensor([[i1, i1, i2] for *_, i1, i2 in rows])))


FIRST = (12.0, 8.0, 5, 6)  # a confident first token, the same in both runs


def test_identical_outputs_have_no_divergence() -> None:
    same = generation([5, 7], [FIRST, (10.0, 9.0, 7, 9)])
    assert first_divergence(same, same, torch.bfloat16, 64) is None


def test_a_flip_within_rounding_is_a_near_tie() -> None:
    alone = generation([5, 7, 1], [FIRST, (10.0, 9.9375, 7, 9), (3.0, 1.0, 1, 2)])
    speculative = generation([5, 9, 4], [FIRST, (10.0, 10.0, 9, 7), (5.0, 1.0, 4, 2)])
    found = first_divergence(alone, speculative, torch.bfloat16, 64)
    assert found is not None and found["position"] == 1 and found["near_tie"] and found["verified_top1"]
    assert found["tokens"] == {"target_alone": 7, "speculative": 9}
    assert found["top2"] == {"target_alone": [7, 9], "speculative": [9, 7]}
    assert (found["margin_alone"], found["margin_speculative"], found["magnitude"]) == (0.0625, 0.0, 10.0)
    assert found["bound"] == rounding_bound(torch.bfloat16, 10.0, 64) == pytest.approx(0.5, abs=1e-3)  # 8 ulp(10)


def test_margins_too_wide_for_rounding_are_a_bug() -> None:
    alone = generation([5, 7], [FIRST, (10.0, 9.0, 7, 9)])
    speculative = generation([5, 9], [FIRST, (10.0, 9.0, 9, 7)])
    found = first_divergence(alone, speculative, torch.bfloat16, 64)
    assert found is not None and found["verified_top1"] and not found["near_tie"]  # 1 + 1 > 8 ulp(10) = 0.5


def test_a_token_the_verification_did_not_rank_first_is_a_bug_however_close() -> None:
    alone = generation([5, 7], [FIRST, (10.0, 9.9375, 7, 9)])
    speculative = generation([5, 9], [FIRST, (10.0, 9.9375, 7, 9)])  # committed 9, its own argmax was 7
    found = first_divergence(alone, speculative, torch.bfloat16, 64)
    assert found is not None and not found["verified_top1"] and not found["near_tie"]


def test_refusals() -> None:
    alone = generation([5, 7], [FIRST, (10.0, 9.0, 7, 9)])
    with pytest.raises(ValueError, match="agree where both exist"):
        first_divergence(alone, generation([5], [FIRST]), torch.bfloat16, 64)
    with pytest.raises(ValueError, match="greedy decoding"):
        first_divergence(alone, Generation([5, 7]), torch.bfloat16, 64)


def test_summary_of_result_lines() -> None:
    near = {"position": 3, "margin_alone": 0.0, "margin_speculative": 0.0625, "bound": 0.5, "verified_top1": True,
            "near_tie": True}
    bug = {**near, "margin_alone": 2.0, "near_tie": False}
    lines = [{"prompt": 0, "same_tokens": True, "divergence": None}, {"prompt": 1, "same_tokens": False, "divergence": near},
             {"prompt": 2, "same_tokens": False, "divergence": bug}, {"prompt": 3, "same_tokens": False}]
    summary = summarize_divergences(lines)
    assert (summary.prompts, summary.identical, summary.unexamined) == (4, 1, 1)
    assert [d.prompt for d in summary.near_ties] == [1] and [d.prompt for d in summary.unexplained] == [2]
    assert summary.unexplained[0].margin_alone == 2.0


@pytest.fixture(scope="module")
def prompts(learned: dict[str, Path]) -> list[list[int]]:
    return decode_prompts(learned["target"])


class RoundingRunner(TargetRunner):
    """The target, with every logit of its forwards moved by up to `ULPS` units in the last place of the
    dtype at that logit: a stand-in for kernels that round a batched forward differently from a one-token
    one, as other CPUs, thread counts and GPUs do (whether this machine's do depends on its kernels)."""

    ULPS = 1
    dtype = torch.bfloat16
    generator = torch.Generator().manual_seed(0)

    def forward(self, *args, **kwargs) -> TargetStep:  # noqa: ANN002, ANN003 - TargetRunner.forward's
        step = super().forward(*args, **kwargs)
        _, exponent = torch.frexp(step.logits)  # logits = m * 2**exponent, m in [0.5, 1)
        spacing = torch.finfo(self.dtype).eps * torch.pow(2.0, exponent.float() - 1)  # ulp of each logit [n, V]
        moved = torch.randint(-self.ULPS, self.ULPS + 1, step.logits.shape, generator=self.generator)
        return TargetStep(step.logits + moved * spacing, step.aux)


def test_reduced_precision_divergences_are_all_near_ties(learned: dict[str, Path], monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """In bfloat16 and float16 the speculative decoder's verification forwards may round differently from the
    target alone's one-token forwards, and near-ties flip: every divergence must be one. 20 chat prompts x 64
    tokens with no stop (so answers run on past their end), a tree and the auto shape under flat costs (every
    proposal verified). Whether this machine's kernels round the two forwards differently depends on its
    kernels and thread count (on an AVX512-BF16 Xeon: 11 with one OpenMP thread, 0-4 with two), so
    the same decoding runs again with every logit of the speculative run moved by up to 1 ulp of the dtype,
    as such kernels would: it must diverge (24 divergences there), and each divergence must be a near-tie
    within the bound (their margins summed to at most 0.37 of it)."""
    tokenizer = load_tokenizer(learned["target"])
    prompts = [tokenizer(tokenizer.apply_chat_template([c[0]], tokenize=False, add_generation_prompt=True),
                         add_special_tokens=False)["input_ids"] for c in corpus_conversations(20, seed=7)]
    flat = RoundCosts(tuple(range(1, 33)), (0.01,) * 32, 0.0)
    natural, rounded = [], []
    for dtype in (torch.bfloat16, torch.float16):
        parts = load_target(learned["target"], dtype, "cpu")
        draft = load_draft(learned["run"] / "final", parts.embed.weight.detach()).to(dtype).eval()
        alone = [Decoder(parts, None, None, Sampling(), set()).generate(prompt, 64) for prompt in prompts]
        for found, runner in ((natural, TargetRunner), (rounded, RoundingRunner)):
            monkeypatch.setattr(decoder_module, "TargetRunner", runner)
            monkeypatch.setattr(RoundingRunner, "dtype", dtype)
            for shape, costs in ((TreeShape(5, 4, 16), None), (AutoShape(4, 6), flat)):
                speculative = Decoder(parts, draft, shape, Sampling(), set(), costs=costs)
                found += [first_divergence(a, speculative.generate(prompt, 64), dtype, parts.lm_head.weight.shape[1])
                          for a, prompt in zip(alone, prompts)]
    diverged = [d for d in natural + rounded if d is not None]
    assert [d for d in rounded if d is not None], "no divergence to explain: the check was not exercised"
    assert all(d["near_tie"] for d in diverged), [
        {key: d[key] for key in ("margin_alone", "margin_speculative", "bound", "magnitude", "verified_top1")}
        for d in diverged if not d["near_tie"]]
    assert all(d["margin_alone"] + d["margin_speculative"] <= d["bound"] for d in diverged)


def accept_a_wrong_token(tree: DraftTree, target_argmax: torch.Tensor) -> Verdict:
    """A broken greedy verifier: where the target rejects the root's best child, it is accepted anyway."""
    verdict = accept_greedy(tree, target_argmax)
    children = tree.children(-1)
    if verdict.accepted or not children:
        return verdict
    return Verdict([children[0]], int(target_argmax[children[0] + 1]))


def test_a_wrong_verifier_diverges_without_a_near_tie(learned: dict[str, Path], prompts: list[list[int]],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The check has power: the divergences of a verifier that commits tokens the target did not choose are
    all classified as bugs (float32: no rounding flip comes first)."""
    parts = load_target(learned["target"], torch.float32, "cpu")
    draft = load_draft(learned["run"] / "final", parts.embed.weight.detach()).eval()
    hidden = parts.lm_head.weight.shape[1]
    alone = [Decoder(parts, None, None, Sampling(), set()).generate(prompt, 32) for prompt in prompts]
    monkeypatch.setattr(decoder_module, "accept_greedy", accept_a_wrong_token)
    broken = Decoder(parts, draft, TreeShape.chain_of(3), Sampling(), set())
    found = [first_divergence(a, broken.generate(prompt, 32), torch.float32, hidden) for a, prompt in zip(alone, prompts)]
    diverged = [d for d in found if d is not None]
    assert len(diverged) >= len(prompts) // 2, found
    assert all(not d["verified_top1"] and not d["near_tie"] for d in diverged)
