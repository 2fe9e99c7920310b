"""The TTT loss and its metrics: soft cross-entropy against the restricted teacher, per step.

Step j at anchor t is scored against the teacher at position `t+1+j`. A position counts
(`valid`) when `t+1+j` is in the same document and in the loss mask. Loss per position is the
forward KL up to a constant: `-sum_i p_i log q_i`, with `p` the target's distribution restricted
to the draft vocabulary and renormalised, `q` the draft's. Positions whose teacher argmax is
outside the draft vocabulary are left out of the loss with `out_of_vocab="mask"` (the default,
as the EAGLE-3 reference trainer: no draft token can match there) or kept with "keep"; either
way they count as misses in the accuracies, so the metrics never flatter the draft.

Everything is accumulated as sums (`StepSums`), so micro-batches and ranks add up exactly;
the training objective is `sum_j 0.8**j * loss_sum_j / loss_tokens`, with `loss_tokens` the
number of loss-mask tokens of the whole (global) batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from eyas.draft.ttt import shift_left
from eyas.models.argmax import CHUNK_ELEMENTS, TargetArgmax

OutOfVocab = Literal["mask", "keep"]
STEP_DECAY = 0.8


@dataclass
class Teacher:
    """`logits [B, T, N]` float32, the target's logits over the draft vocabulary, and `argmax [B, T]`,
    the target's argmax over its full vocabulary (target ids, `eyas.models.argmax`)."""

    logits: torch.Tensor
    argmax: torch.Tensor


class TeacherHead(nn.Module):
    """The target's final norm and LM head, applied to stored pre-norm last hidden states."""

    def __init__(self, final_norm: nn.Module, lm_head_weight: torch.Tensor, draft_token_ids: torch.Tensor,
                 softcap: float | None = None, chunk_elements: int = CHUNK_ELEMENTS) -> None:
        super().__init__()
        self.final_norm = final_norm.requires_grad_(False)
        self.register_buffer("draft_weight", lm_head_weight.detach()[draft_token_ids], persistent=False)  # [N, H]
        self.softcap = softcap
        self.target_argmax = TargetArgmax(final_norm, lm_head_weight, chunk_elements)

    @property
    def chunk_rows(self) -> int:
        return self.target_argmax.chunk_rows

    @torch.no_grad()
    def forward(self, last: torch.Tensor, argmax: torch.Tensor | None = None) -> Teacher:
        """Return the teacher of `last [B, T, H]`: its draft-vocabulary logits, and `argmax [B, T]` as given (a
        store's, computed once) or, without one, recomputed over the full vocabulary (`TargetArgmax`, the
        costly part for a large vocabulary: training always passes one)."""
        normed = self.final_norm(last.to(self.draft_weight.dtype))  # [B, T, H]
        logits = (normed @ self.draft_weight.T).float()  # [B, T, N]
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return Teacher(logits, self.target_argmax(last) if argmax is None else argmax.to(logits.device))


@dataclass
class StepSums:
    """Per-step sums `[k]` (float64) that metrics are ratios of; add them across micro-batches and ranks."""

    tokens: torch.Tensor
    loss_tokens: torch.Tensor
    loss: torch.Tensor
    correct: torch.Tensor
    cond_tokens: torch.Tensor
    cond_correct: torch.Tensor

    @classmethod
    def zeros(cls, steps: int) -> StepSums:
        return cls(*(torch.zeros(steps, dtype=torch.float64) for _ in range(6)))

    def stacked(self) -> torch.Tensor:
        """Return `[6, k]`, for one all-reduce."""
        return torch.stack([self.tokens, self.loss_tokens, self.loss, self.correct, self.cond_tokens, self.cond_correct])

    @classmethod
    def from_stacked(cls, stacked: torch.Tensor) -> StepSums:
        return cls(*stacked.unbind(0))

    def __add__(self, other: StepSums) -> StepSums:
        return StepSums.from_stacked(self.stacked() + other.stacked())


def step_validity(doc_ids: torch.Tensor, loss_mask: torch.Tensor, step: int) -> torch.Tensor:
    """Return `[B, T]` bool: anchor t of `step` is scored (position t+1+step in t's document and loss-masked)."""
    shift = 1 + step
    same_doc = shift_left(doc_ids, shift, fill=-2) == doc_ids
    return same_doc & (doc_ids >= 0) & shift_left(loss_mask, shift, fill=False)


def loss_token_count(doc_ids: torch.Tensor, loss_mask: torch.Tensor) -> int:
    """Return the number of loss-mask tokens the step-0 loss is normalised by."""
    return int(step_validity(doc_ids, loss_mask, 0).sum())


class StepScorer:
    """Scores the steps of one unroll in order; keeps, per anchor, whether every step so far was right."""

    def __init__(self, teacher: Teacher, doc_ids: torch.Tensor, loss_mask: torch.Tensor, d2t: torch.Tensor,
                 t2d: torch.Tensor, steps: int, out_of_vocab: OutOfVocab = "mask") -> None:
        self.teacher, self.doc_ids, self.loss_mask = teacher, doc_ids, loss_mask
        self.d2t, self.t2d, self.out_of_vocab = d2t, t2d, out_of_vocab
        self.sums = StepSums.zeros(steps)
        self.prefix_right = torch.ones_like(doc_ids, dtype=torch.bool)  # [B, T]

    def score(self, step: int, logits: torch.Tensor) -> torch.Tensor:
        """Return step `step`'s summed loss (a scalar with grad) for draft `logits [B, T, N]`; record its sums."""
        shift = 1 + step
        valid = step_validity(self.doc_ids, self.loss_mask, step)  # [B, T]
        same_doc = shift_left(self.doc_ids, shift, fill=-2) == self.doc_ids
        target_logits = shift_left(self.teacher.logits, shift)  # [B, T, N]
        target_argmax = shift_left(self.teacher.argmax, shift)  # [B, T] target ids
        in_vocab = self.t2d[target_argmax]  # [B, T]
        counted = valid & in_vocab if self.out_of_vocab == "mask" else valid

        log_q = torch.log_softmax(logits.float(), dim=-1)  # [B, T, N]
        p = torch.softmax(target_logits, dim=-1)  # [B, T, N]
        cross_entropy = -(p * log_q).sum(-1)  # [B, T]
        loss = (cross_entropy * counted).sum()

        with torch.no_grad():
            draft_ids = logits.argmax(-1)  # [B, T] draft ids
            right = (draft_ids + self.d2t[draft_ids]) == target_argmax  # [B, T]
            conditioned = valid & self.prefix_right
            s = self.sums
            s.tokens[step] += valid.sum().item()
            s.loss_tokens[step] += counted.sum().item()
            s.loss[step] += loss.item()
            s.correct[step] += (right & valid).sum().item()
            s.cond_tokens[step] += conditioned.sum().item()
            s.cond_correct[step] += (right & conditioned).sum().item()
            self.prefix_right &= right & same_doc
        return loss


def weighted_objective(step_losses: list[torch.Tensor]) -> torch.Tensor:
    """Return `sum_j 0.8**j * loss_j` of per-step summed losses (normalise by the loss-token count after)."""
    return sum(STEP_DECAY**j * loss for j, loss in enumerate(step_losses))


def metrics_of(sums: StepSums, loss_tokens: float) -> dict[str, float]:
    """Return `loss` (the weighted objective per loss token), `loss_j`, `acc_j`, `cond_acc_j` and
    `implied_tau = 1 + sum_j prod_{i<=j} cond_acc_i` (the chain acceptance length these imply)."""
    steps = len(sums.tokens)
    ratio = lambda a, b: float(a / b) if b > 0 else 0.0  # noqa: E731
    out: dict[str, float] = {
        "loss": ratio(sum(STEP_DECAY**j * sums.loss[j] for j in range(steps)), loss_tokens),
    }
    tau, survive = 1.0, 1.0
    for j in range(steps):
        out[f"loss_{j}"] = ratio(sums.loss[j], sums.loss_tokens[j])
        out[f"acc_{j}"] = ratio(sums.correct[j], sums.tokens[j])
        out[f"cond_acc_{j}"] = ratio(sums.cond_correct[j], sums.cond_tokens[j])
        survive *= out[f"cond_acc_{j}"]
        tau += survive
    out["implied_tau"] = tau
    return out
