"""A recorded target: the target's greedy continuation of a prompt and its features, answering the round
loop's verification forwards without the model.

Under greedy decoding the committed text is the target's greedy continuation whatever is proposed, and a
proposal is judged only on the rows of candidates that lie on it (the verifier follows the target's
argmax from the root, eyas.decode.verify). A candidate lies on the continuation when its token is the
continuation's at its position and every earlier token it sees (its ancestors; for a causal forward, every
earlier token) lies on it too; its row then predicts the continuation's next token (a one-hot row of
logits) and carries the recorded features at its position. Other rows predict nothing and carry zero
features: no greedy verdict reads them, and the cache keeps only accepted rows. So the round loop run
against a recorded target accepts exactly what it would against the model (eyas.decode.replay), up to
float differences between the one batched forward that recorded the features and the decoder's
incremental ones, at the cost of the proposer's work alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eyas.decode.runners import TargetStep


@dataclass(frozen=True)
class Continuation:
    """A prompt, the target's greedy continuation `tokens` (no stop), the generation budget it was recorded
    for, `aux [len(prompt) + len(tokens), A*H]` the target's features of every token at `aux_layer_ids`, and
    the target's vocabulary size."""

    prompt: list[int]
    tokens: list[int]
    max_new_tokens: int
    aux: torch.Tensor
    aux_layer_ids: list[int]
    vocab_size: int

    def runner(self, aux_layer_ids: list[int] | None) -> RecordedRunner:
        """Return a runner answering from this continuation, with the features of `aux_layer_ids` (None: none).
        Refuses (ValueError) layers other than the recorded ones."""
        if aux_layer_ids is not None and list(aux_layer_ids) != list(self.aux_layer_ids):
            raise ValueError(f"recorded continuation: features of layers {self.aux_layer_ids} were recorded, "
                             f"not {aux_layer_ids}")
        return RecordedRunner(self, aux_layer_ids is not None)


class RecordedRunner:
    """Answers verification forwards from a `Continuation` (module docstring); it keeps no cache."""

    def __init__(self, continuation: Continuation, with_features: bool) -> None:
        self.sequence = continuation.prompt + continuation.tokens
        self.aux = continuation.aux if with_features else None
        self.vocab_size = continuation.vocab_size
        self.device = torch.device("cpu")

    def _on_continuation(self, tokens: list[int], positions: list[int], visible: torch.Tensor | None) -> list[bool]:
        """Return, per new token, whether it and every earlier new token it sees lie on the continuation."""
        on: list[bool] = []
        all_before = True  # causal: every earlier new token is seen
        for row, (token, position) in enumerate(zip(tokens, positions)):
            here = position < len(self.sequence) and self.sequence[position] == token
            if visible is None:
                here = here and all_before
                all_before = here
            else:
                here = here and all(on[seen] for seen in visible[row, :row].nonzero().flatten().tolist())
            on.append(here)
        return on

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor | None = None,
                last_only: bool = False) -> TargetStep:
        """Return one-hot logits `[n, V]` (the last row only with `last_only`) and features `[n, A*H]` of the new
        tokens. Refuses (ValueError) a first token off the continuation, and a row past its end."""
        listed, at = tokens.tolist(), positions.tolist()
        on = self._on_continuation(listed, at, visible)
        if not on[0]:
            raise ValueError(f"recorded continuation: token {listed[0]} at position {at[0]} is not the recorded one")
        if any(here and position + 1 >= len(self.sequence) for here, position in zip(on, at)):
            raise ValueError(f"recorded continuation: it ends at position {len(self.sequence) - 1}")
        rows = range(len(listed) - 1, len(listed)) if last_only else range(len(listed))
        logits = torch.zeros(len(rows), self.vocab_size)  # [n or 1, V]
        for out, row in enumerate(rows):
            if on[row]:
                logits[out, self.sequence[at[row] + 1]] = 1.0
        aux = None
        if self.aux is not None:
            aux = torch.zeros(len(listed), self.aux.shape[-1], dtype=self.aux.dtype)  # [n, A*H]
            kept = [row for row in range(len(listed)) if on[row]]
            aux[kept] = self.aux[[at[row] for row in kept]]
        return TargetStep(logits, aux)

    def keep(self, new_count: int, kept: list[int]) -> None:
        """Nothing to trim: every answer comes from the recording."""
