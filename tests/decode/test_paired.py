"""Paired speedups (eyas.decode.paired): the median of per-pair ratios is what a stalled sample cannot move,
outliers are marked, and a pass whose timing cannot be trusted says why."""

from __future__ import annotations

import pytest

from eyas.decode.paired import paired_speedup, quantile


def timed(seconds: list[float], tokens: int = 10) -> list[tuple[float, float]]:
    return [(tokens, s) for s in seconds]


def test_the_median_of_per_prompt_ratios_with_quartiles_range_and_the_pooled_ratio() -> None:
    figure = paired_speedup(timed([1.0] * 5), timed([0.5, 0.5, 0.5, 0.5, 0.25]))
    assert figure.ratios == pytest.approx([2, 2, 2, 2, 4])
    assert (figure.median, figure.q1, figure.q3, figure.low, figure.high) == pytest.approx((2, 2, 2, 2, 4))
    assert figure.pooled == pytest.approx((50 / 2.25) / (50 / 5))
    assert figure.outliers == [] and figure.reliable and figure.unreliable_because == []


def test_ratios_are_per_token_so_prompts_of_other_lengths_pair_up() -> None:
    figure = paired_speedup([(10, 1.0), (20, 2.0), (5, 0.5)], [(10, 0.5), (30, 1.5), (5, 0.25)])
    assert figure.ratios == pytest.approx([2, 2, 2])


def test_a_stalled_prompt_is_marked_and_does_not_move_the_median() -> None:
    """The target alone stalled 10x on one prompt of eight (the issue's loaded `make demo`): the pooled ratio
    jumps to 2.9x, the median stays at the 1.35x every other prompt shows."""
    baseline = timed([1.0] * 7 + [10.0])
    candidate = timed([1 / 1.35] * 8)
    figure = paired_speedup(baseline, candidate, labels=[3, 4, 5, 6, 7, 8, 9, 10])
    assert figure.median == pytest.approx(1.35) and figure.pooled == pytest.approx(17 / 8 * 1.35)
    assert figure.outliers == [10]  # labelled as the report names the prompt
    assert figure.reliable  # one stall in eight: isolated, and the median is untouched


def test_a_prompt_slow_on_both_sides_is_no_outlier() -> None:
    """An answer that stops after a few tokens carries its whole prefill on both sides: slow per token, but
    alike on both, so its ratio is fair; a stall slows one side only."""
    figure = paired_speedup(timed([1.0] * 7 + [5.0]), timed([0.5] * 7 + [2.0]))
    assert figure.outliers == [] and figure.reliable
    assert figure.ratios[-1] == pytest.approx(2.5)


def test_many_stalls_make_the_figure_unreliable() -> None:
    figure = paired_speedup(timed([1.0] * 6 + [5.0, 6.0]), timed([0.5] * 5 + [4.0, 0.5, 0.5]))
    assert figure.outliers == [5, 6, 7]
    assert not figure.reliable and "3 of 8 prompts ran over 3x their side's median" in figure.unreliable_because[0]


def test_a_baseline_whose_speed_drifts_makes_the_pass_unreliable_unless_its_work_varies() -> None:
    baseline = timed([1.0, 1.0, 1.0, 1.6, 1.6, 1.6, 2.0, 2.0])  # the same loop, slower and slower: the machine
    candidate = timed([0.5, 0.5, 0.5, 0.8, 0.8, 0.8, 1.0, 1.0])
    drifting = paired_speedup(baseline, candidate)
    assert drifting.outliers == [] and not drifting.reliable
    assert "the baseline's seconds per token varied 1.70x between its quartiles" in drifting.unreliable_because[0]
    assert paired_speedup(baseline, candidate, steady_baseline=False).reliable  # e.g. prompt lookup as the baseline


def test_too_few_pairs_are_unreliable() -> None:
    figure = paired_speedup(timed([1.0, 1.0]), timed([0.5, 0.5]), unit="runs")
    assert figure.median == pytest.approx(2.0)
    assert figure.unreliable_because == ["2 runs: too few to tell a stall from the trend"]


def test_refusals() -> None:
    with pytest.raises(ValueError, match="0 baseline and 0 candidate"):
        paired_speedup([], [])
    with pytest.raises(ValueError, match="2 baseline and 1 candidate"):
        paired_speedup(timed([1.0, 1.0]), timed([1.0]))
    with pytest.raises(ValueError, match="positive work and seconds"):
        paired_speedup(timed([1.0, 0.0, 1.0]), timed([1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="quantile"):
        quantile([], 0.5)


def test_quantile_is_linear_between_order_statistics() -> None:
    assert quantile([4.0, 1.0, 3.0, 2.0], 0.25) == pytest.approx(1.75)  # numpy.quantile's default
    assert quantile([4.0, 1.0, 3.0, 2.0], 0.5) == pytest.approx(2.5)
    assert quantile([7.0], 0.75) == 7.0


def test_bench_fields_and_words() -> None:
    figure = paired_speedup(timed([1.0] * 6 + [5.0, 6.0]), timed([0.5] * 5 + [4.0, 0.5, 0.5]))
    fields = figure.fields("vs_prompt_lookup")
    assert set(fields) == {"vs_prompt_lookup", "vs_prompt_lookup_quartiles", "vs_prompt_lookup_range",
                           "vs_prompt_lookup_pooled", "vs_prompt_lookup_outliers", "vs_prompt_lookup_reliable",
                           "vs_prompt_lookup_unreliable_because"}
    assert fields["vs_prompt_lookup"] == round(figure.median, 3) and fields["vs_prompt_lookup_reliable"] is False
    steady = paired_speedup(timed([1.0] * 3), timed([0.5] * 3)).fields()
    assert steady["speedup_reliable"] is True and "speedup_unreliable_because" not in steady
    assert figure.describe().startswith("2.00x (quartiles ") and "outliers: prompts 5, 6, 7" in figure.describe()
