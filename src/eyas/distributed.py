"""Processes started by `torchrun`: rank/world from the environment, and the few collectives eyas uses."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Ranks:
    rank: int
    world: int
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def current_ranks() -> Ranks:
    """Return this process's rank, world size and local rank (0, 1, 0 outside torchrun)."""
    return Ranks(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
                 int(os.environ.get("LOCAL_RANK", "0")))


def init_distributed(ranks: Ranks, device: str) -> None:
    """Join the process group (NCCL for CUDA devices, gloo otherwise) once, when under torchrun."""
    if ranks.distributed and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if device.startswith("cuda") else "gloo")


def rank_device(ranks: Ranks, device: str) -> str:
    """Return the device of this rank: one GPU per rank by LOCAL_RANK when `device` is plain `cuda`."""
    return f"cuda:{ranks.local_rank}" if ranks.distributed and device == "cuda" else device


def barrier(ranks: Ranks) -> None:
    if ranks.distributed:
        torch.distributed.barrier()


def all_reduce_sum(tensor: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """Sum `tensor` over ranks in place (a no-op in a single process); return it."""
    if ranks.distributed:
        torch.distributed.all_reduce(tensor)
    return tensor


def all_reduce_gradients(parameters: list[torch.nn.Parameter], ranks: Ranks) -> None:
    """Sum the gradients of `parameters` over ranks with one flattened all-reduce.

    A parameter without a gradient on this rank (no micro-batch in a short last step) counts as zero.
    """
    if not ranks.distributed:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
    flat = torch.cat([g.reshape(-1) for g in grads])
    torch.distributed.all_reduce(flat)
    offset = 0
    for param, grad in zip(parameters, grads):
        param.grad = flat[offset:offset + grad.numel()].view_as(grad)
        offset += grad.numel()
