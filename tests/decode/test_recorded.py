"""The recorded target (eyas.decode.recorded) answers verification forwards as the model would on every row a
greedy verdict reads: rows of candidates on the continuation predict its next token and carry its features;
rows off it (a wrong token, or a right token under a wrong ancestor) predict nothing and carry zeros.
It refuses what it cannot answer: a first token off the continuation, a row past its end, other layers,
sampling."""

from __future__ import annotations

import pytest
import torch

from eyas.decode.decoder import Decoder
from eyas.decode.recorded import Continuation
from eyas.decode.sampling import Sampling
from eyas.decode.tree import DraftTree

VOCAB = 20
PROMPT = [1, 2, 3]
TOKENS = [7, 8, 9, 10, 11]  # the continuation: positions 3..7
SEQUENCE = PROMPT + TOKENS


def _continuation() -> Continuation:
    aux = torch.arange(len(SEQUENCE), dtype=torch.float32)[:, None].repeat(1, 4) + 1  # [T, 4]: row t holds t + 1
    return Continuation(PROMPT, TOKENS, 3, aux, [0, 1], VOCAB)


def _predicted(logits: torch.Tensor) -> list[int | None]:
    """Return the one-hot token of each row, None for a row that predicts nothing."""
    return [int(row.argmax()) if bool(row.any()) else None for row in logits]


def test_the_prefill_predicts_the_first_token_with_every_feature() -> None:
    runner = _continuation().runner([0, 1])
    step = runner.forward(torch.tensor(PROMPT), torch.arange(3), last_only=True)
    assert _predicted(step.logits) == [7] and step.logits.shape == (1, VOCAB)
    assert step.aux is not None and step.aux[:, 0].tolist() == [1.0, 2.0, 3.0]


def test_a_chain_is_answered_up_to_its_first_wrong_token() -> None:
    runner = _continuation().runner([0, 1])
    runner.forward(torch.tensor(PROMPT[:-1]), torch.arange(2))
    step = runner.forward(torch.tensor([3, 7, 8, 4, 10]), torch.arange(2, 7))  # root, right, right, wrong, right
    assert _predicted(step.logits) == [7, 8, 9, None, None]  # after a wrong token nothing is known
    assert step.aux is not None and step.aux[:, 0].tolist() == [3.0, 4.0, 5.0, 0.0, 0.0]


def test_a_tree_is_answered_along_the_continuation_only() -> None:
    """Root 3 at position 2; nodes: 7 (right), 5 (wrong sibling), 8 under 7 (right), 8 under 5 (right token,
    wrong parent)."""
    tree = DraftTree(torch.tensor([7, 5, 8, 8]), torch.tensor([-1, -1, 0, 1]), torch.tensor([1, 1, 2, 2]),
                     -torch.tensor([1.0, 1.0, 2.0, 2.0], dtype=torch.float64))
    visible = torch.zeros(5, 5, dtype=torch.bool)
    visible[:, 0] = True
    visible[1:, 1:] = tree.ancestor_mask()
    runner = _continuation().runner(None)
    runner.forward(torch.tensor(PROMPT[:-1]), torch.arange(2))
    step = runner.forward(torch.cat([torch.tensor([3]), tree.tokens]), torch.cat([torch.tensor([2]), 2 + tree.depths]),
                          visible)
    assert _predicted(step.logits) == [7, 8, None, 9, None] and step.aux is None


def test_what_it_cannot_answer_is_refused() -> None:
    runner = _continuation().runner([0, 1])
    with pytest.raises(ValueError, match="token 4 at position 0 is not the recorded one"):
        runner.forward(torch.tensor([4, 2]), torch.arange(2))
    runner.forward(torch.tensor(PROMPT), torch.arange(3))
    with pytest.raises(ValueError, match="it ends at position 7"):
        runner.forward(torch.tensor([10, 11]), torch.tensor([6, 7]))
    with pytest.raises(ValueError, match=r"layers \[0, 1\] were recorded, not \[2\]"):
        _continuation().runner([2])
    with pytest.raises(ValueError, match="greedy decoding only"):
        Decoder(_continuation(), None, None, Sampling(temperature=1.0), set())


def test_the_target_alone_replays_the_continuation() -> None:
    """The round loop with nothing proposed, against the recording: the continuation itself, cut at the budget."""
    generated = Decoder(_continuation(), None, None, Sampling(), set()).generate(PROMPT, 3)
    assert generated.tokens == TOKENS[:3] and generated.accepted == [0, 0]
    assert Decoder(_continuation(), None, None, Sampling(), {8}).generate(PROMPT, 3).tokens == [7, 8]
