"""The cost-aware policy alone: E(k, l) against its definition, the choice under extreme costs, learning
from hindsight (no probe rounds), costs corrected by observed forwards, and the schedule of the draft's reads while it is not verified."""

from __future__ import annotations

import random

import pytest

from eyas.decode.costs import RoundCosts
from eyas.decode.policy import READ_EVERY, READ_EVERY_MOST, AutoShape, ExpectedTokens, ShapePolicy

FLAT = RoundCosts.linear(base=1.0, per_token=0.0, draft_step=0.0)
COSTLY = RoundCosts.linear(base=1.0, per_token=10.0, draft_step=10.0)
# one token 1 s, two or more 2 s: a proposal pays only when it is usually accepted
STEEP = RoundCosts((1, 2, 16), (1.0, 2.0, 2.0), 0.0)


def expected_by_definition(draft: list[float], lookup: list[float], k: int, l: int) -> float:
    """E(k, l) term by term: the round commits depth i when either proposer reaches it."""
    total = 1.0
    for i in range(max(k, l)):
        miss_draft = 1.0 - draft[i] if i < k else 1.0
        miss_lookup = 1.0 - lookup[i] if i < l else 1.0
        total += 1.0 - miss_draft * miss_lookup
    return total


def test_expected_tokens_from_prefix_sums_is_the_definition() -> None:
    rng = random.Random(3)
    for _ in range(20):
        draft = sorted((rng.random() for _ in range(rng.randint(0, 8))), reverse=True)
        lookup = sorted((rng.random() for _ in range(rng.randint(0, 10))), reverse=True)
        expected = ExpectedTokens(draft, lookup)
        for k in range(len(draft) + 1):
            for l in range(len(lookup) + 1):
                assert expected(k, l) == pytest.approx(expected_by_definition(draft, lookup, k, l))


def test_the_choice_follows_the_costs() -> None:
    assert ShapePolicy(AutoShape(6, 8), FLAT).choose(True, 5, 3) == (6, 5)  # all there is
    assert ShapePolicy(AutoShape(6, 8), FLAT).choose(False, 20, 3) == (0, 8)
    assert ShapePolicy(AutoShape(6, 8), COSTLY).choose(True, 20, 3) == (0, 0)


def test_hindsight_alone_starts_and_stops_drafting() -> None:
    """Under STEEP costs the prior (acceptance 0.5) does not pay; hits seen in hindsight make the draft pay
    (no round verified it), and misses stop it again."""
    policy = ShapePolicy(AutoShape(4, 0), STEEP)
    assert policy.choose(True, 0, 0) == (0, 0)
    policy.draft_read([True] * 60, idle=True)
    k, _ = policy.choose(True, 0, 0)
    assert k >= 1
    policy.draft_read([False] * 60, idle=True)
    assert policy.choose(True, 0, 0) == (0, 0)


def test_lookup_hindsight_starts_and_stops_the_lookup() -> None:
    policy = ShapePolicy(AutoShape(0, 6), STEEP)
    assert policy.choose(False, 6, 3) == (0, 0)
    for _ in range(40):
        policy.lookup_hindsight(6, 6, 3)
    assert policy.choose(False, 6, 3) == (0, 6)
    for _ in range(150):  # deeper depths stay likely once the first is taken: E(0, 6) ~ 1 + 6 a_1 must fall below 2
        policy.lookup_hindsight(6, 0, 3)
    assert policy.choose(False, 6, 3) == (0, 0)


def test_lookup_estimates_are_kept_per_matched_ngram_length() -> None:
    """Three-token matches that are always taken make a three-token match pay, not a one-token match
    whose proposals were always wrong."""
    policy = ShapePolicy(AutoShape(0, 6), STEEP)
    for _ in range(40):
        policy.lookup_hindsight(6, 6, 3)
        policy.lookup_hindsight(6, 0, 1)
    assert policy.choose(False, 6, 3) == (0, 6)
    assert policy.choose(False, 6, 1) == (0, 0)


def test_observed_forward_times_correct_the_measured_costs() -> None:
    """Measured: every size costs 1 s, so the prior's lookup (E(0, 6) ~ 2) pays; plain steps then observed
    at 0.4 s make a plain step worth 2.5 tokens per second, and the policy stops verifying the lookup."""
    policy = ShapePolicy(AutoShape(0, 6), FLAT)
    assert policy.choose(False, 6, 3) == (0, 6)
    for _ in range(40):
        policy.observe(0, 0, 0, 0, forward_seconds=0.4)
    assert policy.scale[0] == pytest.approx(0.4, abs=0.01) and policy.scale[1] == 1.0
    assert policy.choose(False, 6, 3) == (0, 0)
    given = ShapePolicy(AutoShape(0, 6), FLAT, correct_costs=False)  # costs the caller vouches for stay as given
    for _ in range(40):
        given.observe(0, 0, 0, 0, forward_seconds=0.4)
    assert given.scale == [1.0, 1.0] and given.choose(False, 6, 3) == (0, 6)


def idle_rounds_until_due(policy: ShapePolicy) -> int:
    rounds = 0
    while not policy.read_due():
        policy.observe(0, 0, 0, 0, None)
        rounds += 1
    return rounds


def test_idle_reads_back_off_and_a_verified_draft_resets_them() -> None:
    policy = ShapePolicy(AutoShape(), COSTLY)
    waits = []
    for _ in range(8):
        waits.append(idle_rounds_until_due(policy))
        policy.draft_read([False], idle=True)
    assert waits == [min(READ_EVERY * 2 ** i, READ_EVERY_MOST) for i in range(8)]
    policy.observe(2, 1, 0, 0, None)  # a verified draft
    assert idle_rounds_until_due(policy) == READ_EVERY
    policy.draft_read([True], idle=False)  # a read for drafting does not move the schedule
    assert policy.read_due()
