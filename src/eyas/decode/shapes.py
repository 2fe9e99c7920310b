"""The decoding shapes a user chooses: what each round may propose (eyas.decode.proposers builds the
proposer of each).

- `TreeShape`: an EAGLE-2 dynamic tree of the draft's best candidates, or a chain (`chain_of(k)`).
- `AutoShape`: per round, a greedy draft chain and a prompt-lookup branch of lengths the cost-aware
  policy chooses (eyas.decode.policy), down to none (a plain target step).
- No shape (`None`): the target alone, one forward per token.
"""

from __future__ import annotations

from dataclasses import dataclass


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


@dataclass(frozen=True)
class AutoShape:
    """The cost-aware shape: draft chains of at most `max_chain` tokens and lookup branches of at most
    `lookup` tokens, chosen per round (0 and 0: a plain target step)."""

    max_chain: int = 8
    lookup: int = 10

    @property
    def depth(self) -> int:
        """The most tokens a round can accept."""
        return max(self.max_chain, self.lookup)

    def describe(self) -> str:
        return f"auto (chain <= {self.max_chain}, lookup <= {self.lookup})"
