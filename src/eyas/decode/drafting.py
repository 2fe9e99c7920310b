"""Growing the draft tree of one round (EAGLE-2's dynamic tree, or a chain).

Depth 1: the root anchor's logits give the `top_k` best tokens. Each further depth runs the
`top_k` best-scoring nodes of the previous depth through the draft in one forward (each sees the
committed anchors, its ancestors' tree anchors and itself), and each proposes its `top_k` best
children. Scores are cumulative log-probabilities of the draft (temperature 1). All proposed
nodes are then reranked and the `total` best are verified. A sampled chain draws each token from
the draft's warped distribution and remembers it, for speculative sampling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eyas.decode.runners import DraftRunner, DraftStep
from eyas.decode.sampling import Sampling
from eyas.decode.tree import DraftTree, select_nodes, subtree


@dataclass(frozen=True)
class TreeShape:
    """EAGLE-2 dynamic tree: `depth` draft steps, `top_k` children per expanded node and `top_k`
    nodes expanded per depth, the `total` best nodes (cumulative log-probability) verified.
    A chain of k tokens is `TreeShape.chain_of(k)`: with sampling its tokens are drawn from the
    draft's distribution instead of taken top-1."""

    depth: int
    top_k: int
    total: int
    chain: bool = False

    @classmethod
    def chain_of(cls, k: int) -> TreeShape:
        return cls(k, 1, k, chain=True)

    def describe(self) -> str:
        return f"chain {self.depth}" if self.chain else f"tree {self.depth},{self.top_k},{self.total}"


@dataclass
class _Growing:
    """Nodes proposed so far, as parallel lists."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    scores: list[float]
    inputs: list[torch.Tensor]  # [H] per node: the feature its anchor reads (its parent's output)
    dists: list[torch.Tensor]  # [V] per node, sampled chains only

    def tree(self) -> DraftTree:
        return DraftTree(torch.tensor(self.tokens), torch.tensor(self.parents), torch.tensor(self.depths),
                         torch.tensor(self.scores, dtype=torch.float64),
                         torch.stack(self.dists) if self.dists else None)


def target_ids_of(drafter: DraftRunner) -> torch.Tensor:
    """Return `[N]`: the target token id of each draft-vocabulary id."""
    draft = drafter.draft
    return draft.to_target_ids(torch.arange(draft.config.draft_vocab_size, device=draft.d2t.device)).cpu()


def draft_chain(drafter: DraftRunner, root: DraftStep, root_anchor: int, length: int, target_ids: torch.Tensor
                ) -> list[int]:
    """Return the draft's greedy chain of `length` target token ids after the root.

    `root` is the draft's output at anchor position `root_anchor` (its last row), which the draft
    cache ends with; the chain's anchors are appended to the cache (the caller crops them). A chain
    anchor sees every cached anchor and itself, which is the causal default of `DraftRunner.forward`.
    """
    chain: list[int] = []
    logits, hidden = root.logits[-1], root.hidden[-1:]  # [N], [1, H]
    for depth in range(1, length + 1):
        chain.append(int(target_ids[int(logits.argmax())]))
        if depth == length:
            break
        step = drafter.forward(hidden, torch.tensor([chain[-1]]), torch.tensor([root_anchor + depth]))
        logits, hidden = step.logits[-1], step.hidden[-1:]
    return chain


class TreeDrafter:
    """Grows the tree of a round from the draft's output at the root anchor."""

    def __init__(self, drafter: DraftRunner, shape: TreeShape, sampling: Sampling, generator: torch.Generator) -> None:
        self.drafter, self.shape, self.sampling, self.generator = drafter, shape, sampling, generator
        self.target_ids = target_ids_of(drafter)
        self.vocab = drafter.draft.config.vocab_size
        self.forwards = 0

    def _children(self, logits: torch.Tensor, score: float) -> list[tuple[float, int, torch.Tensor | None]]:
        """Return `(score, target id, draft distribution over the target vocab or None)` of proposed children."""
        logp = torch.log_softmax(logits.float().cpu(), dim=-1)  # [N]
        if self.shape.chain and not self.sampling.greedy:
            q = self.sampling.probs(logits.cpu())  # [N]
            draft_id = int(torch.multinomial(q, 1, generator=self.generator))
            dist = torch.zeros(self.vocab).index_copy_(0, self.target_ids, q)  # [V]
            return [(score + float(logp[draft_id]), int(self.target_ids[draft_id]), dist)]
        top = logp.topk(self.shape.top_k)
        return [(score + float(v), int(self.target_ids[i]), None) for v, i in zip(top.values, top.indices)]

    def grow(self, root: DraftStep, root_anchor: int) -> DraftTree:
        """Return the round's tree; `root` is the draft's output at anchor position `root_anchor`
        (its last row), which the draft cache ends with."""
        grown = _Growing([], [], [], [], [], [])
        committed = self.drafter.length
        slot_of: dict[int, int] = {}  # node -> its anchor's index in the draft cache
        frontier, outputs = [-1], root
        for depth in range(1, self.shape.depth + 1):
            first = len(grown.tokens)
            for row, parent in enumerate(frontier):
                parent_score = grown.scores[parent] if parent >= 0 else 0.0
                logits = outputs.logits[row] if parent >= 0 else outputs.logits[-1]
                feature = outputs.hidden[row] if parent >= 0 else outputs.hidden[-1]
                for score, token, dist in self._children(logits, parent_score):
                    grown.tokens.append(token)
                    grown.parents.append(parent)
                    grown.depths.append(depth)
                    grown.scores.append(score)
                    grown.inputs.append(feature)
                    if dist is not None:
                        grown.dists.append(dist)
            if depth == self.shape.depth:
                break
            frontier = sorted(range(first, len(grown.tokens)), key=lambda i: -grown.scores[i])[:self.shape.top_k]
            visible = self._visibility(frontier, grown.parents, slot_of, committed)
            outputs = self.drafter.forward(torch.stack([grown.inputs[i] for i in frontier]),
                                           torch.tensor([grown.tokens[i] for i in frontier]),
                                           torch.full((len(frontier),), root_anchor + depth), visible)
            self.forwards += 1
            for k, node in enumerate(frontier):
                slot_of[node] = self.drafter.length - len(frontier) + k
        tree = grown.tree()
        if self.shape.chain:
            return tree
        return subtree(tree, select_nodes(tree.parents, tree.scores, tree.depths, self.shape.total))

    def _visibility(self, frontier: list[int], parents: list[int], slot_of: dict[int, int], committed: int
                    ) -> torch.Tensor:
        """Return `[f, L+f]` bool: the committed anchors, each node's ancestors' anchors, itself."""
        cached, f = self.drafter.length, len(frontier)
        visible = torch.zeros(f, cached + f, dtype=torch.bool)
        visible[:, :committed] = True
        for row, node in enumerate(frontier):
            visible[row, cached + row] = True
            ancestor = parents[node]
            while ancestor >= 0:
                visible[row, slot_of[ancestor]] = True
                ancestor = parents[ancestor]
        return visible
