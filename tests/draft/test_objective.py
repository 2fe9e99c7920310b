"""The TTT objective on hand-checkable cases: which anchors count, the accuracies (through d2t),
the conditional accuracies and the acceptance length they imply, the soft cross-entropy against
the restricted teacher, and the teacher head (draft-vocabulary logits, full-vocabulary argmax)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from eyas.draft.objective import (
    StepScorer,
    StepSums,
    Teacher,
    TeacherHead,
    loss_token_count,
    metrics_of,
    step_validity,
    weighted_objective,
)

pytestmark = pytest.mark.usefixtures("one_thread")

# Target vocabulary of 6 ids, draft vocabulary = target ids [1, 3, 4] (sorted): d2t[i] = id_i - i.
DRAFT_IDS = [1, 3, 4]
D2T = torch.tensor([1, 2, 2])
T2D = torch.tensor([False, True, False, True, True, False])
TO_DRAFT = {1: 0, 3: 1, 4: 2}


def bools(*rows: str) -> torch.Tensor:
    return torch.tensor([[c == "1" for c in row] for row in rows])


def test_step_validity_shifts_by_one_plus_step_within_documents_and_the_loss_mask() -> None:
    doc_ids = torch.tensor([[0, 0, 0, 0, 1, 1, 1, -1, -1]])
    loss_mask = bools("110111111")  # t=2 not in the loss mask; padding (t=7, 8) marked on purpose
    # anchor t counts when t+1+step is in t's document (never padding) and in the loss mask
    assert torch.equal(step_validity(doc_ids, loss_mask, 0), bools("101011000"))
    assert torch.equal(step_validity(doc_ids, loss_mask, 1), bools("010010000"))
    assert torch.equal(step_validity(doc_ids, loss_mask, 2), bools("100000000"))
    assert torch.equal(step_validity(doc_ids, loss_mask, 3), bools("000000000"))
    assert torch.equal(step_validity(doc_ids, loss_mask, 20), bools("000000000"))  # past the row
    assert loss_token_count(doc_ids, loss_mask) == 4
    # padding is never valid, even padding followed by padding with the loss mask set
    assert not step_validity(torch.full((1, 5), -1), torch.ones(1, 5, dtype=torch.bool), 0).any()


def one_hot_logits(draft_ids: list[int], scale: float = 5.0) -> torch.Tensor:
    """Return `[1, T, 3]` logits whose argmax at t is `draft_ids[t]`."""
    return torch.nn.functional.one_hot(torch.tensor([draft_ids]), 3).float() * scale


def test_accuracy_reads_draft_ids_through_d2t_and_out_of_vocab_teachers_are_misses() -> None:
    doc_ids = torch.tensor([[0, 0, 0, 0, 0]])
    loss_mask = torch.ones(1, 5, dtype=torch.bool)
    # teacher argmax (target ids) at positions 0..4; 1 and 3 and 4 are in the draft vocabulary, 5 is not
    argmax = torch.tensor([[0, 3, 1, 5, 4]])
    teacher = Teacher(torch.randn(1, 5, 3, generator=torch.Generator().manual_seed(0)), argmax)
    # step 0: anchor t is scored against position t+1 (teacher ids 3, 1, 5, 4)
    #   t=0: draft id 1 -> target 3: right
    #   t=1: draft id 1 -> target 3 != 1: wrong (equal only when compared as raw draft ids 1 == 1 without d2t)
    #   t=2: target 5 is outside the draft vocabulary: a miss whatever the draft says
    #   t=3: draft id 2 -> target 4: right
    logits = one_hot_logits([1, 1, 0, 2, 0])
    sums = {}
    for mode in ("mask", "keep"):
        scorer = StepScorer(teacher, doc_ids, loss_mask, D2T, T2D, steps=1, out_of_vocab=mode)
        loss = scorer.score(0, logits)
        sums[mode] = (scorer.sums, loss)
        assert scorer.sums.tokens.tolist() == [4]
        assert scorer.sums.correct.tolist() == [2]
        assert metrics_of(scorer.sums, 4)["acc_0"] == 0.5
    # the per-anchor cross-entropies, by the formula
    p = torch.softmax(teacher.logits[0, 1:], dim=-1)
    ce = -(p * torch.log_softmax(logits[0, :4], dim=-1)).sum(-1)  # anchors 0..3
    (masked, masked_loss), (kept, kept_loss) = sums["mask"], sums["keep"]
    assert masked.loss_tokens.tolist() == [3]  # the out-of-vocabulary anchor t=2 is left out of the loss
    assert kept.loss_tokens.tolist() == [4]
    torch.testing.assert_close(masked_loss, ce[[0, 1, 3]].sum())
    torch.testing.assert_close(kept_loss, ce.sum())
    assert masked.loss.tolist() == pytest.approx([masked_loss.item()])
    assert metrics_of(kept, 4)["loss_0"] == pytest.approx(kept_loss.item() / 4)


def test_conditional_accuracy_counts_anchors_whose_earlier_steps_were_right_and_implied_tau() -> None:
    # one document of 6 tokens, then 2 padding; every teacher argmax in the draft vocabulary
    doc_ids = torch.tensor([[0, 0, 0, 0, 0, 0, -1, -1]])
    loss_mask = (doc_ids >= 0)
    argmax = torch.tensor([[1, 3, 4, 1, 3, 4, 0, 0]])
    teacher = Teacher(torch.zeros(1, 8, 3), argmax)
    # right[j][t]: whether anchor t of step j drafts the teacher's argmax at t+1+j (valid anchors: t <= 4-j)
    right = [[1, 1, 0, 1, 0], [1, 0, 1, 1], [1, 1, 1]]
    scorer = StepScorer(teacher, doc_ids, loss_mask, D2T, T2D, steps=3)
    for j, pattern in enumerate(right):
        ids = []
        for t in range(8):
            expected = TO_DRAFT.get(int(argmax[0, t + 1 + j])) if t + 1 + j < 8 else None
            good = t < len(pattern) and pattern[t] == 1
            ids.append(expected if good and expected is not None else ((expected or 0) + 1) % 3)
        scorer.score(j, one_hot_logits(ids))
    s = scorer.sums
    assert s.tokens.tolist() == [5, 4, 3]
    assert s.correct.tolist() == [3, 3, 3]
    # step 1: anchors right at step 0 (t=0, 1, 3) -> right at step 1: t=0, 3
    # step 2: anchors right at steps 0 and 1 (t=0) -> right at step 2: t=0
    assert s.cond_tokens.tolist() == [5, 3, 1]
    assert s.cond_correct.tolist() == [3, 2, 1]
    metrics = metrics_of(s, 5)
    assert [metrics[f"acc_{j}"] for j in range(3)] == pytest.approx([3 / 5, 3 / 4, 1.0])
    assert [metrics[f"cond_acc_{j}"] for j in range(3)] == pytest.approx([3 / 5, 2 / 3, 1.0])
    # 1 + 0.6 + 0.6*(2/3) + 0.6*(2/3)*1
    assert metrics["implied_tau"] == pytest.approx(2.4)


def test_step_sums_add_up_across_micro_batches() -> None:
    a = StepSums.from_stacked(torch.arange(12, dtype=torch.float64).view(6, 2))
    b = StepSums.zeros(2)
    b.tokens += 1
    total = a + b
    assert total.tokens.tolist() == [1.0, 2.0]
    assert torch.equal(total.stacked()[1:], a.stacked()[1:])


def test_metrics_loss_is_the_decayed_sum_per_loss_token() -> None:
    sums = StepSums.zeros(3)
    sums.loss += torch.tensor([10.0, 5.0, 2.0], dtype=torch.float64)
    sums.loss_tokens += torch.tensor([4.0, 2.0, 0.0], dtype=torch.float64)
    metrics = metrics_of(sums, loss_tokens=5)
    assert metrics["loss"] == pytest.approx((10 + 0.8 * 5 + 0.64 * 2) / 5)
    assert metrics["loss_0"] == pytest.approx(2.5)
    assert metrics["loss_1"] == pytest.approx(2.5)
    assert metrics["loss_2"] == 0.0  # no loss tokens: 0, not a division by zero
    assert metrics["implied_tau"] == 1.0  # nothing counted: no acceptance beyond the target's token
    losses = [torch.tensor(1.0), torch.tensor(2.0), torch.tensor(4.0)]
    assert weighted_objective(losses).item() == pytest.approx(1 + 0.8 * 2 + 0.64 * 4)


def test_soft_cross_entropy_is_the_hand_computation_and_minimal_at_the_teacher() -> None:
    # the teacher's full-vocabulary logits; the draft vocabulary is target ids [1, 3, 4]
    full = [0.3, 1.0, -2.0, 2.0, 0.0, 4.0]
    restricted = [full[i] for i in DRAFT_IDS]
    z = sum(math.exp(x) for x in restricted)
    p = [math.exp(x) / z for x in restricted]
    # p is the target's full distribution restricted to the draft vocabulary and renormalised
    full_p = torch.softmax(torch.tensor(full), -1)[DRAFT_IDS]
    torch.testing.assert_close(torch.tensor(p), full_p / full_p.sum())
    draft = [0.5, -1.0, 2.0]
    zq = sum(math.exp(x) for x in draft)
    expected = -sum(pi * math.log(math.exp(x) / zq) for pi, x in zip(p, draft))

    doc_ids = torch.tensor([[0, 0]])  # one valid anchor (t=0), scored against position 1
    loss_mask = torch.ones(1, 2, dtype=torch.bool)
    teacher = Teacher(torch.tensor([[[9.0, 9.0, 9.0], restricted]]), torch.tensor([[0, 3]]))

    def loss_of(draft_logits: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
        logits = torch.tensor([[draft_logits, [0.0, 0.0, 0.0]]], requires_grad=True)
        scorer = StepScorer(teacher, doc_ids, loss_mask, D2T, T2D, steps=1)
        loss = scorer.score(0, logits)
        loss.backward()
        return loss, logits.grad

    loss, _ = loss_of(draft)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # at draft logits = teacher logits it equals the teacher's entropy, with zero gradient, and is minimal
    entropy = -sum(pi * math.log(pi) for pi in p)
    at_teacher, grad = loss_of(restricted)
    assert at_teacher.item() == pytest.approx(entropy, rel=1e-6)
    assert grad.abs().max().item() < 1e-6
    shifted, _ = loss_of([x + 3.0 for x in restricted])  # a constant shift leaves the distribution unchanged
    assert shifted.item() == pytest.approx(entropy, rel=1e-6)
    generator = torch.Generator().manual_seed(0)
    for _ in range(5):
        other = (torch.tensor(restricted) + 0.5 * torch.randn(3, generator=generator)).tolist()
        assert loss_of(other)[0].item() > entropy + 1e-4


def make_teacher_case(vocab: int = 40, hidden: int = 16
                      ) -> tuple[LlamaRMSNorm, torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    norm = LlamaRMSNorm(hidden, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.2 * torch.randn(hidden, generator=generator))
    weight = torch.randn(vocab, hidden, generator=generator)  # [V, H]
    draft_ids = torch.tensor([0, 3, 4, 10, 11, 25, 39])
    last = 3 * torch.randn(2, 5, hidden, generator=generator)  # [B, T, H], pre-norm
    return norm, weight, draft_ids, last


@pytest.mark.parametrize("chunk_elements", [1 << 26, 3 * 40, 1], ids=["one-chunk", "3-rows", "1-row"])
@pytest.mark.parametrize("softcap", [None, 2.0])
def test_teacher_head_restricts_logits_and_takes_the_full_vocabulary_argmax(chunk_elements: int,
                                                                             softcap: float | None) -> None:
    norm, weight, draft_ids, last = make_teacher_case()
    head = TeacherHead(norm, weight, draft_ids, softcap=softcap, chunk_elements=chunk_elements)
    assert head.chunk_rows == max(1, chunk_elements // 40)
    teacher = head(last)
    with torch.no_grad():
        full = norm(last) @ weight.T  # [B, T, V]
    expected = full[..., draft_ids]
    if softcap:
        expected = torch.tanh(expected / softcap) * softcap
        assert (expected - full[..., draft_ids]).abs().max() > 1.0  # the cap matters in this case
    assert teacher.logits.dtype == torch.float32
    assert teacher.logits.shape == (2, 5, len(draft_ids))
    torch.testing.assert_close(teacher.logits, expected, rtol=1e-5, atol=1e-5)
    # the argmax is over the full vocabulary, in target ids, and here often outside the draft vocabulary
    assert torch.equal(teacher.argmax, full.argmax(-1))
    outside = ~torch.isin(teacher.argmax, draft_ids)
    assert outside.any() and (~outside).any()
    assert not torch.equal(teacher.argmax, draft_ids[expected.argmax(-1)])  # not the restricted argmax
