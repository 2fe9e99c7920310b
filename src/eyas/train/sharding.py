"""The draft as the trainer runs it, and its optional FSDP sharding (`--fsdp` under torchrun).

`TTTLoss` makes one micro-batch's whole TTT unroll a single module call. That is what lets FSDP2
shard the draft: its hooks gather parameters around a module's *calls*, and the unroll calls each
draft layer and the LM head k times, which FSDP2's per-call gradient reduction gets wrong (measured:
from 3 TTT steps on, some gradient contributions of earlier calls are lost). As one FSDP unit,
called once per micro-batch with inputs that need no gradient, the gradients are reduce-scattered
once, after the whole backward. What is sharded across ranks at rest is everything the draft holds:
weights (the frozen target embedding `[V, H]` too), gradients and AdamW moments; a rank holds the
full draft only while its micro-batch runs.

Every rank must make the same number of FSDP calls, so a rank whose share of a step (or of the
held-out split) is short runs zero-weight micro-batches; checkpoints hold full tensors either way,
so a run can resume with or without `--fsdp`.
"""

from __future__ import annotations

import torch
from torch import nn

from eyas.draft.dflash import DFlashDraft, Draft, block_steps
from eyas.draft.objective import StepScorer, weighted_objective
from eyas.draft.ttt import unroll
from eyas.train.batches import PackedBatch


class TTTLoss(nn.Module):
    """The draft and its unroll: `forward(batch, scorer)` returns the weighted objective of one micro-batch. A
    DFlash draft's steps are the slots of the blocks it drafts after every anchor (eyas.draft.dflash)."""

    def __init__(self, draft: Draft, steps: int, autocast: bool) -> None:
        super().__init__()
        self.draft, self.steps, self.autocast = draft, steps, autocast

    def forward(self, batch: PackedBatch, scorer: StepScorer) -> torch.Tensor:
        """Return `sum_j 0.8**j * loss_j` (summed over tokens, a scalar with grad); `scorer` records the sums."""
        device = batch.aux.device.type
        with torch.autocast(device, dtype=torch.bfloat16, enabled=self.autocast):
            steps = block_steps if isinstance(self.draft, DFlashDraft) else unroll
            logits = steps(self.draft, batch.aux, batch.input_ids, batch.position_ids, batch.doc_ids, self.steps)
            return weighted_objective([scorer.score(j, step_logits) for j, step_logits in enumerate(logits)])


def shard(module: TTTLoss, device: torch.device, world: int) -> None:
    """Make `module` one FSDP2 unit over `world` ranks (parameters become DTensors sharded on dim 0).

    Gradients are summed over ranks, not averaged: the trainer divides by the step's loss tokens.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if device.type == "cuda":
        torch.cuda.set_device(device)
    fully_shard(module, mesh=init_device_mesh(device.type, (world,)))
    module.set_gradient_divide_factor(1.0)
    module.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """Return the whole tensor of a sharded DTensor (a collective: every rank calls it), else `tensor`."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def local(tensor: torch.Tensor) -> torch.Tensor:
    """Return this rank's shard of a sharded DTensor, else `tensor`."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def like(reference: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """Return `full` laid out as `reference`: this rank's shard when `reference` is a sharded DTensor."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    full = full.to(device=reference.device, dtype=reference.dtype)
    if isinstance(reference, DTensor):
        return distribute_tensor(full.detach(), reference.device_mesh, reference.placements)
    return full


def gathered_state(draft: Draft) -> dict[str, torch.Tensor]:
    """Return the draft's saved tensors whole (a collective under FSDP: every rank calls it)."""
    return {name: full_tensor(t) for name, t in draft.trainable_state().items()}


def parameter_counts(draft: Draft) -> dict[str, int]:
    """Return `draft_parameters` (all, the frozen embedding included) and `draft_parameters_on_rank`
    (what this rank holds at rest: about 1/world of them under FSDP)."""
    params = list(draft.parameters())
    return {"draft_parameters": sum(p.numel() for p in params),
            "draft_parameters_on_rank": sum(local(p).numel() for p in params)}
