"""Sampling settings to probabilities: greedy refuses, temperature is softmax(logits / T), top-k
keeps exactly the k largest, top-p keeps the smallest most-likely prefix whose mass reaches p (a
token stays when the mass of the strictly more likely tokens is below p), on batched inputs too."""

from __future__ import annotations

import pytest
import torch

from eyas.decode.sampling import Sampling

pytestmark = pytest.mark.usefixtures("one_thread")

# Dyadic probabilities: softmax(log(P)) reproduces them exactly in float32, so top-p boundaries are exact.
P = torch.tensor([0.125, 0.5, 0.0625, 0.25, 0.0625])  # sorted: 1 (0.5), 3 (0.25), 0 (0.125), 2/4 (0.0625)
LOGITS = P.log()


def test_temperature_zero_is_greedy_and_has_no_distribution() -> None:
    """Temperature 0 (the default) is greedy; asking it for probabilities is an error."""
    assert Sampling().greedy
    assert Sampling(temperature=0.0, top_p=0.5, top_k=3).greedy
    assert not Sampling(temperature=0.7).greedy
    with pytest.raises(ValueError, match="argmax"):
        Sampling(temperature=0.0).probs(torch.zeros(4))


@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
def test_temperature_scales_the_logits(temperature: float) -> None:
    """Without filters the distribution is softmax(logits / T), in float32 whatever the input dtype."""
    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    probs = Sampling(temperature=temperature).probs(logits)
    assert probs.dtype == torch.float32 and probs.shape == (3, 11)
    torch.testing.assert_close(probs, torch.softmax(logits / temperature, dim=-1).float())
    assert Sampling(temperature=temperature).probs(logits.bfloat16()).dtype == torch.float32


def test_top_k_keeps_exactly_the_k_largest() -> None:
    """The k largest logits keep their renormalised softmax mass; every other token is exactly 0."""
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(5, 20, generator=generator)  # distinct values almost surely
    for k in (1, 3, 7):
        probs = Sampling(temperature=0.8, top_k=k).probs(logits)
        top = logits.topk(k, dim=-1).indices
        kept = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, top, True)
        assert torch.equal(probs > 0, kept)
        assert bool((probs[~kept] == 0).all())
        torch.testing.assert_close(probs.sum(-1), torch.ones(5))
        expected = torch.softmax((logits / 0.8).masked_fill(~kept, float("-inf")), dim=-1)
        torch.testing.assert_close(probs, expected)


@pytest.mark.parametrize("top_k", [0, 20, 50])
def test_top_k_off_or_at_least_the_vocabulary_filters_nothing(top_k: int) -> None:
    """top_k 0 or >= V leaves the tempered softmax unchanged."""
    logits = torch.randn(2, 20, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(Sampling(temperature=1.3, top_k=top_k).probs(logits), torch.softmax(logits / 1.3, -1))


@pytest.mark.parametrize(("top_p", "kept"), [
    (0.3, [1]),           # 0.5 alone reaches 0.3
    (0.5, [1]),           # boundary: token 3 has 0.5 more likely, not < 0.5: dropped
    (0.5001, [1, 3]),
    (0.7499, [1, 3]),
    (0.75, [1, 3]),       # boundary: token 0 has 0.75 more likely: dropped
    (0.7501, [1, 3, 0]),
    (0.875, [1, 3, 0]),   # boundary: the tied 0.0625 tokens have >= 0.875 more likely
    (0.95, [1, 3, 0, 2, 4]),
])
def test_top_p_keeps_the_smallest_prefix_reaching_p(top_p: float, kept: list[int]) -> None:
    """Hand-computed nucleus: token x stays iff the mass of the tokens sorted before it is < p."""
    probs = Sampling(temperature=1.0, top_p=top_p).probs(LOGITS)
    mask = torch.zeros(5, dtype=torch.bool)
    mask[kept] = True
    assert torch.equal(probs > 0, mask)
    expected = torch.where(mask, P, torch.zeros(5))
    torch.testing.assert_close(probs, expected / expected.sum())


def test_top_p_keeps_one_of_two_tied_tokens_at_the_edge() -> None:
    """Ties at the edge: of the two 0.0625 tokens only the one sorted first stays at p = 0.9
    (0.875 < 0.9 before it, 0.9375 before the other); which one is unspecified."""
    probs = Sampling(temperature=1.0, top_p=0.9).probs(LOGITS)
    assert bool((probs[[1, 3, 0]] > 0).all())
    assert int((probs[[2, 4]] > 0).sum()) == 1
    torch.testing.assert_close(probs.sum(), torch.tensor(1.0))
    torch.testing.assert_close(probs[[1, 3, 0]], P[[1, 3, 0]] / 0.9375)


def test_top_p_one_keeps_everything() -> None:
    """top_p 1.0 (the default) filters nothing, even tokens of tiny mass."""
    torch.testing.assert_close(Sampling(temperature=1.0, top_p=1.0).probs(LOGITS), P)


def test_top_p_applies_after_temperature_and_top_k() -> None:
    """The nucleus is taken on the tempered, top-k filtered distribution, then renormalised."""
    # T = 0.5 squares the probabilities: [4, 64, 1, 16, 1] / 86, so token 1 holds 64/86 = 0.744
    assert (Sampling(temperature=1.0, top_p=0.7).probs(LOGITS) > 0).tolist() == [False, True, False, True, False]
    assert (Sampling(temperature=0.5, top_p=0.7).probs(LOGITS) > 0).tolist() == [False, True, False, False, False]
    torch.testing.assert_close(Sampling(temperature=0.5, top_p=0.76).probs(LOGITS),
                               torch.tensor([0, 0.8, 0, 0.2, 0]))
    # top-k 2 first leaves {1: 2/3, 3: 1/3}: top_p 0.6 is reached by token 1 alone ...
    assert (Sampling(temperature=1.0, top_k=2, top_p=0.6).probs(LOGITS) > 0).tolist() == [False, True, False, False,
                                                                                          False]
    # ... while at 0.7 (which keeps 1 and 3 of the unfiltered distribution too) token 0 stays cut by top-k
    torch.testing.assert_close(Sampling(temperature=1.0, top_k=2, top_p=0.7).probs(LOGITS),
                               torch.tensor([0, 2 / 3, 0, 1 / 3, 0]))
    # without top-k, p = 0.8 would also keep token 0 (0.75 before it)
    assert (Sampling(temperature=1.0, top_p=0.8).probs(LOGITS) > 0).tolist() == [True, True, False, True, False]
    torch.testing.assert_close(Sampling(temperature=1.0, top_k=2, top_p=0.8).probs(LOGITS),
                               torch.tensor([0, 2 / 3, 0, 1 / 3, 0]))


def test_batched_rows_are_filtered_independently() -> None:
    """[n, V] and [b, n, V] inputs give, row by row, the result of the single-row call."""
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 3, 16, generator=generator) * 3
    settings = [Sampling(temperature=0.7), Sampling(temperature=1.0, top_k=4), Sampling(temperature=1.2, top_p=0.8),
                Sampling(temperature=0.9, top_k=6, top_p=0.6)]
    for sampling in settings:
        for batch in (logits[0], logits):
            probs = sampling.probs(batch)
            assert probs.shape == batch.shape
            torch.testing.assert_close(probs.sum(-1), torch.ones(batch.shape[:-1]))
            rows = batch.reshape(-1, 16)
            expected = torch.stack([sampling.probs(row) for row in rows]).reshape(batch.shape)
            torch.testing.assert_close(probs, expected)
    # rows with different nuclei: a peaked row keeps one token, a flat row keeps all
    mixed = torch.stack([torch.tensor([10.0, 0, 0, 0]), torch.zeros(4)])
    kept = Sampling(temperature=1.0, top_p=0.9).probs(mixed) > 0
    assert kept.tolist() == [[True, False, False, False], [True, True, True, True]]
