"""Verification: which drafted tokens the target accepts, and the token it adds after them.

Row 0 of the target's outputs belongs to the root (the last committed token) and row i+1 to
node i; each row is the target's next-token prediction after that token.

- Greedy: follow the child whose token is the target's argmax; the bonus token is the argmax
  after the last accepted node. The output is the target's own greedy output.
- Sampled chain (Leviathan et al.): node i was drawn from the draft's `q_i`; it is accepted with
  probability `min(1, p(x) / q_i(x))`, and on rejection the token is drawn from
  `norm(max(p - q_i, 0))`. Every emitted token is distributed as `p`.
- Sampled tree (recursive rejection with the candidates as fixed proposals): the children of a
  node are tried best first; child c is accepted with probability `p(c) / sum(p)` and otherwise
  removed from `p`; when none is accepted the token is drawn from what is left of `p`. This is
  exact for candidates chosen deterministically (EAGLE-2's top-k expansion): the emitted token is
  `c_1` with probability `p(c_1)`, `c_2` with `(1 - p(c_1)) p(c_2) / (1 - p(c_1))`, ..., and any
  other token x with `p(x)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eyas.decode.tree import DraftTree


@dataclass(frozen=True)
class Verdict:
    """`accepted`: the accepted nodes, root's child first; `bonus`: the target's token after them."""

    accepted: list[int]
    bonus: int

    @property
    def rows(self) -> list[int]:
        """The verification rows to keep: the root's (0) and the accepted nodes' (node + 1)."""
        return [0] + [node + 1 for node in self.accepted]

    def committed(self, tree: DraftTree) -> list[int]:
        """Return the tokens the round commits: the accepted nodes' tokens, then the bonus token."""
        return [int(tree.tokens[node]) for node in self.accepted] + [self.bonus]


def accept_greedy(tree: DraftTree, target_argmax: torch.Tensor) -> Verdict:
    """Return the verdict for `target_argmax [n+1]` (row 0: the root)."""
    accepted: list[int] = []
    node, row = -1, 0
    while True:
        wanted = int(target_argmax[row])
        child = next((c for c in tree.children(node) if int(tree.tokens[c]) == wanted), None)
        if child is None:
            return Verdict(accepted, wanted)
        accepted.append(child)
        node, row = child, child + 1


def _draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def accept_sampled_chain(tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator) -> Verdict:
    """Return the verdict for a chain whose node i was sampled from `tree.draft_probs[i]`.

    `target_probs [n+1, V]` are the target's (warped) distributions, row 0 the root's.
    Refuses a tree without draft distributions.
    """
    if tree.draft_probs is None:
        raise ValueError("a sampled chain needs the distributions its tokens were drawn from")
    accepted: list[int] = []
    for i in range(len(tree)):
        p, q = target_probs[i], tree.draft_probs[i]  # [V], [V]
        token = int(tree.tokens[i])
        if float(torch.rand((), generator=generator)) * float(q[token]) < float(p[token]):
            accepted.append(i)
            continue
        residual = (p - q).clamp_min(0)
        if float(residual.sum()) <= 0:  # p == q: a rejection has probability 0; guard rounding
            residual = p
        return Verdict(accepted, _draw(residual / residual.sum(), generator))
    return Verdict(accepted, _draw(target_probs[len(tree)], generator))


def accept_sampled_tree(tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator) -> Verdict:
    """Return the verdict for a tree of fixed candidates, `target_probs [n+1, V]` (row 0: the root)."""
    accepted: list[int] = []
    node, row = -1, 0
    while True:
        p = target_probs[row].clone()  # [V]
        for child in tree.children(node):
            token = int(tree.tokens[child])
            mass = float(p.sum())
            if mass > 0 and float(torch.rand((), generator=generator)) * mass < float(p[token]):
                accepted.append(child)
                node, row = child, child + 1
                break
            p[token] = 0.0
        else:
            return Verdict(accepted, _draw(p / p.sum(), generator))
