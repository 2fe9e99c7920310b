"""Verification: greedy acceptance on a hand-built tree, and the sampled verifiers checked to emit
tokens distributed exactly as the target (chi-square goodness of fit over 20000 seeded draws).

The statistical tests have power: the same check, with the same distributions and draws, rejects
a chain verifier whose rejection draws from `p` instead of `norm(max(p - q, 0))`, and a tree
verifier whose fallback draws from `p` without removing the rejected candidates."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from conftest import chi_square_p_value

from eyas.decode.tree import DraftTree
from eyas.decode.verify import Verdict, accept_greedy, accept_sampled_chain, accept_sampled_tree

pytestmark = pytest.mark.usefixtures("one_thread")

DRAWS = 20_000
PASS = 1e-3  # a correct verifier's p-value stays above this (fixed seeds: the outcome is deterministic)
POWER = 1e-6  # a wrong verifier's p-value must fall below this

Verifier = Callable[[DraftTree, torch.Tensor, torch.Generator], Verdict]


def token_counts(tokens: list[int], vocab: int) -> torch.Tensor:
    return torch.bincount(torch.tensor(tokens, dtype=torch.long), minlength=vocab)


def test_chi_square_helper_matches_closed_forms() -> None:
    """The helper agrees with closed forms (df 1: erfc, df 2: exp) and merges small cells."""
    # 30/10 against 1/2, 1/2: chi2 = 10, df 1 -> erfc(sqrt(5))
    assert chi_square_p_value(torch.tensor([30, 10]), torch.tensor([0.5, 0.5])) == pytest.approx(math.erfc(5**0.5))
    # df 2: p = exp(-chi2 / 2); 40/30/30 against thirds
    chi2 = (40 - 100 / 3) ** 2 / (100 / 3) + 2 * (30 - 100 / 3) ** 2 / (100 / 3)
    assert chi_square_p_value(torch.tensor([40, 30, 30]), torch.ones(3) / 3) == pytest.approx(math.exp(-chi2 / 2))
    # cells 2 + 2 + 2 expected (< 5 each) merge into one cell of 6: 3 cells in all, a perfect fit
    probs = torch.tensor([0.02, 0.02, 0.02, 0.47, 0.47])
    assert chi_square_p_value(torch.tensor([2, 2, 2, 47, 47]), probs) == pytest.approx(1.0)
    # the merged cell is judged as a whole: 6 draws spread 6/0/0 across it still fit
    assert chi_square_p_value(torch.tensor([6, 0, 0, 47, 47]), probs) == pytest.approx(1.0)
    # any draw in a probability-0 cell is an outright failure
    assert chi_square_p_value(torch.tensor([50, 49, 1]), torch.tensor([0.5, 0.5, 0.0])) == 0.0
    assert chi_square_p_value(torch.tensor([500, 500]), torch.tensor([0.9, 0.1])) < 1e-12


# ----------------------------------------------------------------------------------------------
# Greedy


def hand_tree() -> DraftTree:
    """Root children 0 (token 5) and 1 (token 3); node 2 (token 7) child of 0; node 3 (token 1)
    child of 2; node 4 (token 7) child of 1. Node 0 outscores node 1."""
    return DraftTree(
        tokens=torch.tensor([5, 3, 7, 1, 7]),
        parents=torch.tensor([-1, -1, 0, 2, 1]),
        depths=torch.tensor([1, 1, 2, 3, 2]),
        scores=torch.tensor([-0.5, -1.0, -1.5, -2.5, -3.0]),
    )


def argmax_rows(**rows: int) -> torch.Tensor:
    """Return `target_argmax [6]`: row 0 the root, row i+1 node i (`root=`, `n0=`..`n4=`), others 0."""
    names = ["root", "n0", "n1", "n2", "n3", "n4"]
    return torch.tensor([rows.get(name, 0) for name in names])


def test_greedy_accepts_a_whole_branch_and_adds_the_last_rows_argmax() -> None:
    """Every argmax matches down 0 -> 2 -> 3: all accepted, the bonus is node 3's row."""
    verdict = accept_greedy(hand_tree(), argmax_rows(root=5, n0=7, n2=1, n3=4))
    assert verdict == Verdict([0, 2, 3], 4)


def test_greedy_stops_at_the_first_mismatch() -> None:
    """A mismatch ends acceptance; the bonus is the mismatching argmax (the target's own token)."""
    assert accept_greedy(hand_tree(), argmax_rows(root=5, n0=6, n2=1)) == Verdict([0], 6)
    assert accept_greedy(hand_tree(), argmax_rows(root=5, n0=7, n2=2)) == Verdict([0, 2], 2)
    assert accept_greedy(hand_tree(), argmax_rows(root=4, n0=7, n2=1)) == Verdict([], 4)


def test_greedy_chooses_the_matching_sibling() -> None:
    """The root's argmax 3 picks node 1 (not the better-scored node 0); token 7 then means node 4, not node 2."""
    assert accept_greedy(hand_tree(), argmax_rows(root=3, n1=7, n4=0, n0=7, n2=1)) == Verdict([1, 4], 0)
    assert accept_greedy(hand_tree(), argmax_rows(root=3, n1=6)) == Verdict([1], 6)


def test_greedy_reads_each_nodes_own_row() -> None:
    """Rows are node index + 1: node 2's row decides after node 2 even when other rows disagree."""
    target = torch.tensor([5, 7, 9, 1, 2, 9])  # root 5 -> node 0, row 1: 7 -> node 2, row 3: 1 -> node 3, row 4: 2
    assert accept_greedy(hand_tree(), target) == Verdict([0, 2, 3], 2)


# ----------------------------------------------------------------------------------------------
# Sampled chain

V = 6
# Target rows: root, after node 0, after node 1. Token 3 is impossible at the root (the draft
# proposes it often); token 4 is impossible after node 0.
P_CHAIN = torch.tensor([
    [0.30, 0.05, 0.20, 0.00, 0.25, 0.20],
    [0.10, 0.30, 0.05, 0.25, 0.00, 0.30],
    [0.15, 0.15, 0.30, 0.10, 0.20, 0.10],
])
# Draft rows for nodes 0 and 1, far from the target (acceptance of node 0: sum min(p, q) = 0.4).
Q_CHAIN = torch.tensor([
    [0.05, 0.40, 0.10, 0.25, 0.05, 0.15],
    [0.30, 0.05, 0.30, 0.05, 0.20, 0.10],
])


def wrong_accept_sampled_chain(tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator) -> Verdict:
    """A broken verifier: on rejection it draws from `p` itself instead of `norm(max(p - q, 0))`."""
    assert tree.draft_probs is not None
    accepted: list[int] = []
    for i in range(len(tree)):
        p, q = target_probs[i], tree.draft_probs[i]
        token = int(tree.tokens[i])
        if float(torch.rand((), generator=generator)) * float(q[token]) < float(p[token]):
            accepted.append(i)
            continue
        return Verdict(accepted, int(torch.multinomial(p, 1, generator=generator)))
    return Verdict(accepted, int(torch.multinomial(target_probs[len(tree)], 1, generator=generator)))


def run_chain(verifier: Verifier, length: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """Draw `DRAWS` chains (node i's token ~ Q_CHAIN[i]) and verify them against P_CHAIN.

    Returns (accepted nodes, emitted tokens: the accepted tokens then the bonus) per draw.
    """
    generator = torch.Generator().manual_seed(seed)
    q = Q_CHAIN[:length]
    drafted = torch.multinomial(q, DRAWS, replacement=True, generator=generator).T  # [DRAWS, length]
    parents = torch.arange(length) - 1
    depths = torch.arange(length) + 1
    scores = -torch.arange(length, dtype=torch.float32)
    target = P_CHAIN[:length + 1]
    results = []
    for tokens in drafted:
        verdict = verifier(DraftTree(tokens, parents, depths, scores, q), target, generator)
        assert verdict.accepted == list(range(len(verdict.accepted)))  # a chain accepts a prefix
        emitted = [int(tokens[i]) for i in verdict.accepted] + [verdict.bonus]
        results.append((verdict.accepted, emitted))
    return results


def first_emitted_p_value(results: list[tuple[list[int], list[int]]], target: torch.Tensor) -> float:
    return chi_square_p_value(token_counts([emitted[0] for _, emitted in results], V), target)


def second_emitted_after_node_0(results: list[tuple[list[int], list[int]]]) -> list[int]:
    """The second emitted token of the draws whose node 0 was accepted."""
    return [emitted[1] for accepted, emitted in results if accepted and accepted[0] == 0]


@pytest.mark.parametrize("length", [1, 2])
def test_sampled_chain_emits_the_target_distribution(length: int) -> None:
    """First emitted token ~ p[root]; after an accepted node 0 the next token ~ p[node 0's row]
    (accepted node 1 or the residual), and for length 2 after both nodes the bonus ~ p[node 1's row]."""
    results = run_chain(accept_sampled_chain, length, seed=10 + length)
    assert first_emitted_p_value(results, P_CHAIN[0]) > PASS
    second = second_emitted_after_node_0(results)
    assert 0.35 * DRAWS < len(second) < 0.45 * DRAWS  # node 0 accepted with probability sum min(p, q) = 0.4
    assert chi_square_p_value(token_counts(second, V), P_CHAIN[1]) > PASS
    if length == 2:
        third = [emitted[2] for accepted, emitted in results if len(accepted) == 2]
        assert len(third) > 2000
        assert chi_square_p_value(token_counts(third, V), P_CHAIN[2]) > PASS
    # the target-impossible draft token 3 is never emitted first
    assert all(emitted[0] != 3 for _, emitted in results)


def test_the_chain_check_rejects_a_verifier_with_the_wrong_residual() -> None:
    """Power: the same checks on the same p, q and number of draws catch residual = p, both on the
    first emitted token (which depends on node 0 only, so length 1 is covered) and on the second."""
    results = run_chain(wrong_accept_sampled_chain, 2, seed=12)
    assert first_emitted_p_value(results, P_CHAIN[0]) < POWER
    second = second_emitted_after_node_0(results)
    assert chi_square_p_value(token_counts(second, V), P_CHAIN[1]) < POWER


def test_sampled_chain_accepts_everything_when_draft_equals_target() -> None:
    """p == q: every node is accepted (min(1, p/q) = 1); the bonus comes from the last row."""
    generator = torch.Generator().manual_seed(5)
    q = P_CHAIN[:2].clone()
    tree = DraftTree(torch.tensor([0, 1]), torch.tensor([-1, 0]), torch.tensor([1, 2]), torch.tensor([0.0, -1.0]), q)
    for _ in range(200):
        verdict = accept_sampled_chain(tree, P_CHAIN, generator)
        assert verdict.accepted == [0, 1]
        assert P_CHAIN[2, verdict.bonus] > 0


def test_sampled_chain_never_accepts_a_token_the_target_forbids() -> None:
    """p(x) = 0 rejects x outright, and the residual never emits it either."""
    generator = torch.Generator().manual_seed(6)
    tree = DraftTree(torch.tensor([3]), torch.tensor([-1]), torch.tensor([1]), torch.tensor([0.0]), Q_CHAIN[:1])
    for _ in range(200):
        verdict = accept_sampled_chain(tree, P_CHAIN[:2], generator)
        assert verdict.accepted == []
        assert verdict.bonus != 3 and float(P_CHAIN[0, verdict.bonus] - Q_CHAIN[0, verdict.bonus]) > 0


def test_sampled_chain_needs_draft_distributions() -> None:
    """Without `draft_probs` the acceptance ratio is undefined: refused."""
    tree = DraftTree(torch.tensor([1]), torch.tensor([-1]), torch.tensor([1]), torch.tensor([0.0]))
    with pytest.raises(ValueError, match="distributions"):
        accept_sampled_chain(tree, P_CHAIN[:2], torch.Generator().manual_seed(0))


# ----------------------------------------------------------------------------------------------
# Sampled tree (fixed candidates)

# Root candidates: tokens 2, 5, 1 (scores descending); node 0 (token 2) has candidates 4 and 0.
TREE = DraftTree(
    tokens=torch.tensor([2, 5, 1, 4, 0]),
    parents=torch.tensor([-1, -1, -1, 0, 0]),
    depths=torch.tensor([1, 1, 1, 2, 2]),
    scores=torch.tensor([-0.5, -1.0, -1.5, -0.9, -2.0]),
)
P_TREE = torch.tensor([
    [0.10, 0.15, 0.25, 0.05, 0.15, 0.30],  # root: the candidates cover 0.7
    [0.20, 0.10, 0.05, 0.25, 0.30, 0.10],  # after node 0
    [0.10, 0.20, 0.20, 0.20, 0.20, 0.10],  # after node 1 (no candidates: the bonus)
    [0.20, 0.20, 0.20, 0.20, 0.10, 0.10],  # after node 2
    [0.30, 0.10, 0.10, 0.10, 0.20, 0.20],  # after node 3
    [0.05, 0.05, 0.30, 0.30, 0.10, 0.20],  # after node 4
])
# The same root row but the second candidate (token 5) impossible for the target.
P_ZERO = P_TREE.clone()
P_ZERO[0] = torch.tensor([0.20, 0.25, 0.30, 0.05, 0.20, 0.00])


def wrong_accept_sampled_tree(tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator) -> Verdict:
    """A broken verifier: when every child is rejected it draws from the original `p`, the rejected
    candidates included."""
    accepted: list[int] = []
    node, row = -1, 0
    while True:
        p = target_probs[row].clone()
        for child in tree.children(node):
            token = int(tree.tokens[child])
            mass = float(p.sum())
            if mass > 0 and float(torch.rand((), generator=generator)) * mass < float(p[token]):
                accepted.append(child)
                node, row = child, child + 1
                break
            p[token] = 0.0
        else:
            return Verdict(accepted, int(torch.multinomial(target_probs[row], 1, generator=generator)))


def run_tree(verifier: Verifier, target: torch.Tensor, seed: int) -> list[tuple[list[int], list[int]]]:
    """Verify TREE `DRAWS` times; return (accepted nodes, emitted tokens) per draw."""
    generator = torch.Generator().manual_seed(seed)
    results = []
    for _ in range(DRAWS):
        verdict = verifier(TREE, target, generator)
        emitted = [int(TREE.tokens[i]) for i in verdict.accepted] + [verdict.bonus]
        results.append((verdict.accepted, emitted))
    return results


def test_sampled_tree_emits_the_target_distribution() -> None:
    """First emitted token ~ p[root] whichever candidate (or none) took it; after node 0 the next
    token ~ p[node 0's row]; each root candidate is accepted with its own target probability."""
    results = run_tree(accept_sampled_tree, P_TREE, seed=20)
    assert first_emitted_p_value(results, P_TREE[0]) > PASS
    second = second_emitted_after_node_0(results)
    assert chi_square_p_value(token_counts(second, V), P_TREE[1]) > PASS
    # the first accepted node is a root candidate (0, 1, 2) or nothing: candidate i with p(token_i)
    first_node = token_counts([accepted[0] if accepted else 5 for accepted, _ in results], V)
    assert int(first_node[3:5].sum()) == 0
    expected = torch.tensor([0.25, 0.30, 0.15, 0.0, 0.0, 0.30])  # nodes 0, 1, 2, -, -, none
    assert chi_square_p_value(first_node, expected) > PASS
    # acceptance is always along a path: a depth-2 node only after node 0
    assert all(accepted[1:] == [] or (accepted[0] == 0 and accepted[1] in (3, 4)) for accepted, _ in results)


def test_sampled_tree_never_accepts_a_candidate_the_target_forbids() -> None:
    """A candidate of probability 0 (node 1, token 5) is never accepted nor emitted; the others
    still come out as p."""
    results = run_tree(accept_sampled_tree, P_ZERO, seed=21)
    assert all(1 not in accepted for accepted, _ in results)
    assert first_emitted_p_value(results, P_ZERO[0]) > PASS
    second = second_emitted_after_node_0(results)
    assert chi_square_p_value(token_counts(second, V), P_ZERO[1]) > PASS


def test_the_tree_check_rejects_a_fallback_that_keeps_rejected_candidates() -> None:
    """Power: the same check on the same p and number of draws catches a fallback drawn from the full p."""
    results = run_tree(wrong_accept_sampled_tree, P_TREE, seed=20)
    assert first_emitted_p_value(results, P_TREE[0]) < POWER
