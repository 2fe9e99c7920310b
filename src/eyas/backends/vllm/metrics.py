"""vLLM's speculative-decoding counters, read from `LLM.get_metrics()` snapshots (no vLLM import).

vLLM counts, per engine: `vllm:spec_decode_num_drafts` (verification steps that carried a draft),
`..._num_draft_tokens`, `..._num_accepted_tokens`, and `..._num_accepted_tokens_per_pos` (a vector:
steps whose draft position i was accepted). For a chain, position i is accepted only when every
earlier one was, so `per_pos[i] / drafts` is the share of steps accepting more than i tokens: eyas's
`per_position_acceptance`. tau = 1 + accepted / drafts: the tokens each verification forward commits,
eyas's pooled definition (decode/report.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from eyas.errors import EyasError

PREFIX = "vllm:spec_decode_"
Snapshot = dict[str, float | list[float]]  # metric name -> a counter's value or a vector's values


@dataclass(frozen=True)
class SpecCounters:
    drafts: int
    draft_tokens: int
    accepted: int
    per_position: tuple[int, ...]

    @classmethod
    def read(cls, snapshot: Snapshot, positions: int) -> SpecCounters:
        """Return the counters of `snapshot` (zero where vLLM has not counted yet); `positions` is the draft length."""
        def counter(name: str) -> int:
            value = snapshot.get(PREFIX + name, 0)
            if isinstance(value, list):
                raise EyasError(f"vLLM metric {PREFIX + name}: expected a counter, got a vector")
            return int(value)

        vector = snapshot.get(PREFIX + "num_accepted_tokens_per_pos", [])
        if not isinstance(vector, list):
            raise EyasError(f"vLLM metric {PREFIX}num_accepted_tokens_per_pos: expected a vector")
        per_position = [int(v) for v in vector] + [0] * max(0, positions - len(vector))
        return cls(counter("num_drafts"), counter("num_draft_tokens"), counter("num_accepted_tokens"),
                   tuple(per_position[:positions]))

    def minus(self, earlier: SpecCounters) -> SpecCounters:
        """Return what was counted since `earlier` (a snapshot of the same engine)."""
        return SpecCounters(self.drafts - earlier.drafts, self.draft_tokens - earlier.draft_tokens,
                            self.accepted - earlier.accepted,
                            tuple(a - b for a, b in zip(self.per_position, earlier.per_position, strict=True)))

    @property
    def tau(self) -> float:
        """Tokens committed per verification step (accepted + the target's own one); 0 when nothing was drafted."""
        return 1 + self.accepted / self.drafts if self.drafts else 0.0

    @property
    def acceptance(self) -> list[float]:
        """Share of verification steps whose draft position i was accepted, per position."""
        return [count / self.drafts if self.drafts else 0.0 for count in self.per_position]
