"""The EAGLE-3 draft's side of decoding: its anchors across rounds, and the tree or chain it grows in one.

Anchors: with committed tokens `x_0..x_m`, the draft cache holds anchors `0..m-1`, anchor t reading the
target's feature of `x_t` and the token `x_{t+1}`; a node at depth d is drafted by an anchor at position
`m-1+d` whose feature is its parent's anchor output (the training-time-test layout, docs/train.md). After
a round the draft drops its tree anchors and reads the committed tokens' anchors with the target's own
features (as EAGLE does); `DraftAnchors` queues them until a draft is wanted, then reads them in one forward.

Growing a tree (EAGLE-2's dynamic tree, or a chain):

Depth 1: the root anchor's logits give the `top_k` best tokens. Each further depth runs the
`top_k` best-scoring nodes of the previous depth through the draft in one forward (each sees the
committed anchors, its ancestors' tree anchors and itself), and each proposes its `top_k` best
children. Scores are cumulative log-probabilities of the draft (temperature 1). All proposed
nodes are then reranked and the `total` best are verified. A sampled chain draws each token from
the draft's warped distribution and remembers it, for speculative sampling.

A P-EAGLE draft proposes a block instead (`DraftAnchors.block`): one forward runs the waiting anchors
and K-1 parallel slots after the root anchor, at positions `root+1..root+K-1`, each reading the mask
token and the mask feature and seeing the cached anchors and the slots before it (eyas.draft.ttt: the
layout it was trained in). The root anchor's logits give token 1 and slot i's give token i+1; the
slots leave the cache again. `block_chain` makes the block a chain: top-1 tokens, or each drawn from
its slot's warped distribution, which it carries for speculative sampling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eyas.decode.runners import DraftRunner, DraftStep
from eyas.decode.sampling import Sampling
from eyas.decode.shapes import TreeShape
from eyas.decode.tree import DraftTree, select_nodes, subtree
from eyas.draft.model import Eagle3Draft


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


class DraftAnchors:
    """The draft's cache across the rounds of one generation: anchors whose target features are known wait
    until `read` runs them in one forward; `root` is the latest read's output (its last row: the root anchor,
    once nothing waits); `target_ids [N]`: the target token id of each draft-vocabulary id."""

    def __init__(self, draft: Eagle3Draft) -> None:
        self.runner = DraftRunner(draft)
        self.target_ids = target_ids_of(self.runner)
        self._root: DraftStep | None = None
        self._root_position = 0
        self._aux: list[torch.Tensor] = []  # [r, A*H_t] each
        self._tokens: list[int] = []
        self._positions: list[int] = []

    @property
    def waiting(self) -> int:
        """The number of anchors not read yet."""
        return len(self._tokens)

    @property
    def first_waiting(self) -> int | None:
        """The position of the first anchor not read yet (None: none waits)."""
        return self._positions[0] if self._positions else None

    @property
    def root(self) -> DraftStep:
        """The latest read's output. Refuses (ValueError) before the first read."""
        if self._root is None:
            raise ValueError("draft anchors: nothing read yet")
        return self._root

    def add(self, aux: torch.Tensor | None, tokens: list[int], first_position: int) -> None:
        """Queue anchors reading `aux [r, A*H_t]` and the next tokens `tokens [r]`, from `first_position` on.
        Refuses (ValueError) missing features: the target must run capturing the draft's layers."""
        self._aux.append(captured(aux))
        self._tokens += tokens
        self._positions += range(first_position, first_position + len(tokens))

    def read(self) -> tuple[int, DraftStep]:
        """Run the waiting anchors through the draft (one forward); return the first one's position and the
        output, which becomes `root`. Refuses (ValueError) when none waits."""
        if not self._tokens:
            raise ValueError("draft anchors: nothing to read")
        first = self._positions[0]
        self._forward(0)
        return first, self.root

    def block(self, length: int) -> torch.Tensor:
        """Return `[length, N]` logits of a P-EAGLE block after the root anchor: the root's, then those of
        `length-1` parallel slots, run in one forward with the waiting anchors (which it reads: `root` moves
        on); the slots leave the cache again. Refuses (ValueError) a draft of another family, and a block
        before the first read when no anchor waits."""
        if not self._tokens and self._root is None:
            raise ValueError("draft anchors: nothing read yet")
        slots = length - 1
        if not slots and not self._tokens:  # the root's logits, read already
            return self.root.logits[-1:]
        step = self._forward(slots)
        self.runner.crop(self.runner.length - slots)
        return torch.cat([self.root.logits[-1:], step.logits[step.logits.shape[0] - slots:]])

    def _forward(self, slots: int) -> DraftStep:
        """Run the waiting anchors, then `slots` parallel slots, in one forward (eyas.draft.ttt: a slot sees the
        cache and the slots before it); the anchors' output becomes `root`. Return the whole step."""
        draft, waiting = self.runner.draft, len(self._tokens)
        features = [self.runner.fuse(torch.cat(self._aux))] if waiting else []  # [r, H]
        tokens, positions = list(self._tokens), list(self._positions)
        if slots:
            with torch.inference_mode():
                mask_token, mask_feature = draft.mask_slot()
            features.append(mask_feature[None].expand(slots, -1))  # [slots, H]
            last = positions[-1] if waiting else self._root_position
            tokens += [mask_token] * slots
            positions += range(last + 1, last + 1 + slots)
        step = self.runner.forward(torch.cat(features), torch.tensor(tokens), torch.tensor(positions))
        if waiting:
            self._root = DraftStep(step.hidden[:waiting], step.logits[:waiting])
            self._root_position = self._positions[-1]
            self._aux, self._tokens, self._positions = [], [], []
        return step


def captured(aux: torch.Tensor | None) -> torch.Tensor:
    """Return the target's features of committed tokens; refuses (ValueError) none: the target must run capturing
    the draft's layers, whose every committed token a draft reads."""
    if aux is None:
        raise ValueError("the draft reads the target's features of every committed token, and none were captured")
    return aux


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


def chain_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator, target_ids: torch.Tensor,
                vocab: int) -> tuple[float, int, torch.Tensor | None]:
    """Return `(log-probability, target id, distribution)` of the next token of a chain from the draft's
    `logits [N]`: the top-1 token with greedy decoding (no distribution), else one drawn from the draft's warped
    distribution, which comes back over the target vocabulary `[vocab]`."""
    logp = torch.log_softmax(logits.float().cpu(), dim=-1)  # [N]
    if sampling.greedy:
        draft_id = int(logp.argmax())
        return float(logp[draft_id]), int(target_ids[draft_id]), None
    q = sampling.probs(logits.cpu())  # [N]
    draft_id = int(torch.multinomial(q, 1, generator=generator))
    return float(logp[draft_id]), int(target_ids[draft_id]), torch.zeros(vocab).index_copy_(0, target_ids, q)


def block_chain(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator, target_ids: torch.Tensor,
                vocab: int) -> DraftTree:
    """Return the chain of a P-EAGLE block's `logits [K, N]` (`DraftAnchors.block`): token i from row i,
    top-1 or drawn (`chain_token`), scored by cumulative log-probability."""
    picked = [chain_token(row, sampling, generator, target_ids, vocab) for row in logits]
    scores = torch.tensor([logp for logp, _, _ in picked], dtype=torch.float64).cumsum(0)
    dists = [dist for _, _, dist in picked if dist is not None]
    length = len(picked)
    return DraftTree(torch.tensor([token for _, token, _ in picked]), torch.arange(-1, length - 1),
                     torch.arange(1, length + 1), scores, torch.stack(dists) if dists else None)


class TreeDrafter:
    """Grows the tree of a round from the draft's output at the root anchor, in the cache of `anchors`."""

    def __init__(self, anchors: DraftAnchors, shape: TreeShape, sampling: Sampling, generator: torch.Generator) -> None:
        self.drafter, self.target_ids = anchors.runner, anchors.target_ids
        self.shape, self.sampling, self.generator = shape, sampling, generator
        self.vocab = self.drafter.draft.config.vocab_size

    def _children(self, logits: torch.Tensor, score: float) -> list[tuple[float, int, torch.Tensor | None]]:
        """Return `(score, target id, draft distribution over the target vocab or None)` of proposed children."""
        if self.shape.chain:
            token_logp, token, dist = chain_token(logits, self.sampling, self.generator, self.target_ids, self.vocab)
            return [(score + token_logp, token, dist)]
        logp = torch.log_softmax(logits.float().cpu(), dim=-1)  # [N]
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
