"""Draft trees: tokens proposed after the last committed token, each with a parent.

The root is the last committed token (verified by the target in the same forward, not a node).
Node i holds a target token id, its parent (-1 for the root), its depth (1 for the root's
children) and its score (the draft's cumulative log-probability of the path). A chain is the
tree where node i's parent is i-1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    """`tokens [n]` target ids, `parents [n]` (-1: the root), `depths [n]`, `scores [n]` float;
    `draft_probs [n, V]`: the distribution each node was *sampled* from (sampled chains only)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    scores: torch.Tensor
    draft_probs: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.tokens.numel())

    def children(self, node: int) -> list[int]:
        """Return the children of `node` (-1: the root), best score first."""
        found = (self.parents == node).nonzero().flatten().tolist()
        return sorted(found, key=lambda i: -float(self.scores[i]))

    def ancestor_mask(self) -> torch.Tensor:
        """Return `[n, n]` bool: node i may attend to node j when j is i or one of i's ancestors."""
        n = len(self)
        mask = torch.eye(n, dtype=torch.bool)
        for i in range(n):  # parents come before children
            parent = int(self.parents[i])
            if parent >= 0:
                mask[i] |= mask[parent]
        return mask

    def path_to(self, node: int) -> list[int]:
        """Return the nodes from the root's child down to `node`."""
        path = []
        while node >= 0:
            path.append(node)
            node = int(self.parents[node])
        return path[::-1]


def select_nodes(parents: torch.Tensor, scores: torch.Tensor, depths: torch.Tensor, total: int) -> torch.Tensor:
    """Return the indices of the `total` best-scoring nodes, ancestors first (EAGLE-2 reranking).

    A child never scores above its parent (log-probabilities add up), and ties go to the shallower
    node, so the kept set contains every kept node's ancestors; it is checked all the same.
    """
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), int(depths[i]), i))[:total]
    kept = set(order)
    for i in order:
        parent = int(parents[i])
        if parent >= 0 and parent not in kept:
            raise RuntimeError(f"draft tree: node {i} kept without its parent {parent}")
    return torch.tensor(sorted(order, key=lambda i: (int(depths[i]), i)), dtype=torch.long)


def subtree(tree: DraftTree, keep: torch.Tensor) -> DraftTree:
    """Return the tree of nodes `keep` (ancestors first), parents renumbered."""
    new_index = {int(old): new for new, old in enumerate(keep.tolist())}
    parents = torch.tensor([new_index[int(p)] if int(p) >= 0 else -1 for p in tree.parents[keep]], dtype=torch.long)
    probs = tree.draft_probs[keep] if tree.draft_probs is not None else None
    return DraftTree(tree.tokens[keep], parents, tree.depths[keep], tree.scores[keep], probs)


def is_chain(tree: DraftTree) -> bool:
    """Return whether every node's parent is the node before it (causal attention verifies it)."""
    if len(tree) < 2:  # no node, or one child of the root
        return True
    return bool((tree.parents == torch.arange(-1, len(tree) - 1)).all())


def chain_union(first: list[int], second: list[int]) -> DraftTree:
    """Return the tree of two token chains after the root, sharing their common prefix.

    Nodes `0..len(first)-1` are `first` in order; the nodes of `second` beyond the shared prefix
    follow, the first of them a child of the last shared node. Scores are minus the depth (the
    verifiers try siblings in node order: `first`'s child, then `second`'s).
    """
    shared = 0
    while shared < min(len(first), len(second)) and first[shared] == second[shared]:
        shared += 1
    rest = second[shared:]
    tokens = first + rest
    parents = list(range(-1, len(first) - 1))
    parents += [shared - 1 if i == 0 else len(first) + i - 1 for i in range(len(rest))]
    depths = list(range(1, len(first) + 1)) + list(range(shared + 1, shared + len(rest) + 1))
    return DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long),
                     torch.tensor(depths, dtype=torch.long), -torch.tensor(depths, dtype=torch.float64))
