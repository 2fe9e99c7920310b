"""Draft trees on hand-built cases: the ancestor mask, children ordered by score, paths from the
root, EAGLE-2 reranking (`select_nodes`: the best nodes, ancestors first, ties to the shallower
node, closed under ancestors) and `subtree` renumbering parents."""

from __future__ import annotations

import math
import random

import pytest
import torch

from eyas.decode.tree import DraftTree, select_nodes, subtree

pytestmark = pytest.mark.usefixtures("one_thread")

V = 8


def hand_tree(with_probs: bool = False) -> DraftTree:
    """Root children 0 and 1; node 2 child of 0; node 3 child of 2; node 4 child of 1.

    Scores are cumulative log-probabilities: node 1 scores above node 0, so the root's children
    by score are [1, 0].
    """
    probs = torch.softmax(torch.arange(5 * V, dtype=torch.float32).reshape(5, V) / 7, dim=-1) if with_probs else None
    return DraftTree(
        tokens=torch.tensor([5, 3, 7, 1, 7]),
        parents=torch.tensor([-1, -1, 0, 2, 1]),
        depths=torch.tensor([1, 1, 2, 3, 2]),
        scores=torch.tensor([-1.0, -0.5, -1.5, -2.5, -3.0]),
        draft_probs=probs,
    )


def test_ancestor_mask_matches_the_hand_built_tree() -> None:
    """Each row holds the node itself and exactly its ancestors, nothing else."""
    expected = torch.tensor([
        [1, 0, 0, 0, 0],  # 0: itself
        [0, 1, 0, 0, 0],  # 1: itself
        [1, 0, 1, 0, 0],  # 2: 0, itself
        [1, 0, 1, 1, 0],  # 3: 0, 2, itself
        [0, 1, 0, 0, 1],  # 4: 1, itself
    ], dtype=torch.bool)
    mask = hand_tree().ancestor_mask()
    assert mask.dtype == torch.bool
    assert torch.equal(mask, expected)


def test_ancestor_mask_of_a_chain_is_lower_triangular() -> None:
    """A chain (parent i-1) attends causally."""
    n = 4
    chain = DraftTree(torch.arange(n), torch.arange(n) - 1, torch.arange(n) + 1, -torch.arange(n, dtype=torch.float32))
    assert torch.equal(chain.ancestor_mask(), torch.ones(n, n, dtype=torch.bool).tril())


def test_children_are_ordered_by_score_best_first() -> None:
    """children() follows score, not index: node 1 outscores node 0 among the root's children."""
    tree = hand_tree()
    assert tree.children(-1) == [1, 0]
    assert tree.children(0) == [2]
    assert tree.children(1) == [4]
    assert tree.children(3) == []
    wide = DraftTree(torch.tensor([4, 2, 6, 1]), torch.tensor([-1, -1, -1, -1]), torch.ones(4, dtype=torch.long),
                     torch.tensor([-2.0, -0.1, -3.0, -1.0]))
    assert wide.children(-1) == [1, 3, 0, 2]
    assert len(wide) == 4


def test_path_to_runs_from_the_roots_child_down_to_the_node() -> None:
    """path_to lists the ancestors top-down, ending with the node itself."""
    tree = hand_tree()
    assert tree.path_to(0) == [0]
    assert tree.path_to(2) == [0, 2]
    assert tree.path_to(3) == [0, 2, 3]
    assert tree.path_to(4) == [1, 4]
    assert tree.path_to(-1) == []


def test_select_nodes_keeps_the_best_scores_ancestors_first() -> None:
    """The `total` best scores are kept, listed by depth then index (ancestors before descendants)."""
    tree = hand_tree()
    # scores: 1 (-0.5) > 0 (-1.0) > 2 (-1.5) > 3 (-2.5) > 4 (-3.0)
    assert select_nodes(tree.parents, tree.scores, tree.depths, 1).tolist() == [1]
    assert select_nodes(tree.parents, tree.scores, tree.depths, 2).tolist() == [0, 1]
    assert select_nodes(tree.parents, tree.scores, tree.depths, 3).tolist() == [0, 1, 2]
    assert select_nodes(tree.parents, tree.scores, tree.depths, 4).tolist() == [0, 1, 2, 3]
    assert select_nodes(tree.parents, tree.scores, tree.depths, 5).tolist() == [0, 1, 2, 4, 3]
    assert select_nodes(tree.parents, tree.scores, tree.depths, 9).tolist() == [0, 1, 2, 4, 3]
    assert select_nodes(tree.parents, tree.scores, tree.depths, 5).dtype == torch.long


def test_select_nodes_breaks_ties_toward_the_shallower_node() -> None:
    """Equal scores go to the shallower node, even over a lower index (a child of probability 1 ties its parent)."""
    parents = torch.tensor([-1, 0, -1])
    depths = torch.tensor([1, 2, 1])
    scores = torch.tensor([-0.5, -1.0, -1.0])  # node 1 (depth 2) ties node 2 (depth 1)
    assert select_nodes(parents, scores, depths, 2).tolist() == [0, 2]
    # a child with log-probability 0 ties its parent: the parent must win the last slot
    parents = torch.tensor([-1, -1, 1])
    depths = torch.tensor([1, 1, 2])
    scores = torch.tensor([-0.2, -0.7, -0.7])
    assert select_nodes(parents, scores, depths, 2).tolist() == [0, 1]


def test_select_nodes_refuses_a_child_kept_without_its_parent() -> None:
    """Scores that are not cumulative (a child above its parent) are caught, not silently kept."""
    parents = torch.tensor([-1, 0])
    with pytest.raises(RuntimeError, match="without its parent"):
        select_nodes(parents, torch.tensor([-2.0, -1.0]), torch.tensor([1, 2]), 1)


def random_tree(rng: random.Random, depth: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return parents, depths, cumulative log-prob scores of an EAGLE-like tree; some children have
    probability 1 (ties with their parent) and some siblings tie."""
    parents: list[int] = []
    depths: list[int] = []
    scores: list[float] = []
    frontier = [(-1, 0.0)]
    for d in range(1, depth + 1):
        layer = []
        for parent, parent_score in frontier:
            for _ in range(rng.randint(0, width)):
                prob = rng.choice([1.0, 0.5, 0.25, rng.random() or 0.5])
                parents.append(parent)
                depths.append(d)
                scores.append(parent_score + math.log(prob))
                layer.append((len(parents) - 1, scores[-1]))
        frontier = rng.sample(layer, min(len(layer), 3))
    return torch.tensor(parents, dtype=torch.long), torch.tensor(depths), torch.tensor(scores, dtype=torch.float32)


def test_select_nodes_on_random_trees_is_closed_under_ancestors() -> None:
    """For every budget: exactly the best `total` scores, every kept node's parent kept and listed earlier."""
    rng = random.Random(0)
    trees = 0
    while trees < 30:
        parents, depths, scores = random_tree(rng, depth=4, width=3)
        if len(parents) < 2:
            continue
        trees += 1
        for total in range(1, len(parents) + 1):
            keep = select_nodes(parents, scores, depths, total).tolist()
            assert len(keep) == total == len(set(keep))
            dropped = sorted(set(range(len(parents))) - set(keep))
            if dropped:
                assert float(scores[keep].min()) >= float(scores[dropped].max())
            position = {node: at for at, node in enumerate(keep)}
            for node in keep:
                parent = int(parents[node])
                if parent >= 0:
                    assert parent in position and position[parent] < position[node]


def test_subtree_renumbers_parents_and_carries_every_field() -> None:
    """Kept nodes keep their tokens, depths, scores and draft rows; parents point at the new indices."""
    tree = hand_tree(with_probs=True)
    assert tree.draft_probs is not None
    keep = torch.tensor([0, 1, 2, 4])
    sub = subtree(tree, keep)
    assert sub.parents.tolist() == [-1, -1, 0, 1]
    assert sub.tokens.tolist() == [5, 3, 7, 7]
    assert sub.depths.tolist() == [1, 1, 2, 2]
    assert sub.scores.tolist() == [-1.0, -0.5, -1.5, -3.0]
    assert sub.draft_probs is not None and torch.equal(sub.draft_probs, tree.draft_probs[keep])
    assert torch.equal(sub.ancestor_mask(), tree.ancestor_mask()[keep][:, keep])

    deep = subtree(tree, torch.tensor([0, 2, 3]))
    assert deep.parents.tolist() == [-1, 0, 1]
    assert deep.path_to(2) == [0, 1, 2]

    right = subtree(hand_tree(), torch.tensor([1, 4]))
    assert right.parents.tolist() == [-1, 0]
    assert right.tokens.tolist() == [3, 7]
    assert right.draft_probs is None


def test_subtree_of_select_nodes_is_a_consistent_tree() -> None:
    """Reranking then cutting keeps the attention structure of the kept nodes."""
    tree = hand_tree()
    for total in range(1, len(tree) + 1):
        keep = select_nodes(tree.parents, tree.scores, tree.depths, total)
        sub = subtree(tree, keep)
        assert len(sub) == total
        assert torch.equal(sub.ancestor_mask(), tree.ancestor_mask()[keep][:, keep])
        assert all(int(p) < i for i, p in enumerate(sub.parents.tolist()))
