"""Training batches: the held-out split, length-grouped packed rows, and collation.

An epoch's plan depends only on sample lengths, the seed and the epoch number, so a resumed or
distributed run recomputes exactly the same micro-batches. Samples are shuffled, cut into
windows, sorted by length within each window and packed first-fit-decreasing into rows of up to
`row_tokens` tokens (a longer sample gets a row of its own); consecutive rows form a micro-batch
while `rows x longest row <= token_budget`. Micro-batches are shuffled; optimizer step s takes
`grad_accum x world` of them in order, and micro-batch m of a step goes to rank `m % world`.
The last step of an epoch may be smaller: no sample is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from eyas.data.budget import group_under_budget

Row = list[int]
MicroBatch = list[Row]
WINDOW = 1024


def split_indices(count: int, eval_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Return `(train, eval)` sample indices, sorted; eval holds `round(count * eval_fraction)`
    samples (at least one when the fraction is positive and there are two samples or more)."""
    order = np.random.default_rng(seed).permutation(count)
    held = 0 if eval_fraction <= 0 or count < 2 else min(count - 1, max(1, round(count * eval_fraction)))
    return np.sort(order[held:]), np.sort(order[:held])


def _pack(indices: list[int], lengths: np.ndarray, row_tokens: int) -> list[Row]:
    """Return rows of `indices`, first-fit decreasing by length, each within `row_tokens` unless a
    single sample is longer."""
    rows: list[Row] = []
    room: list[int] = []
    for index in sorted(indices, key=lambda i: (-int(lengths[i]), i)):
        length = int(lengths[index])
        slot = next((r for r, free in enumerate(room) if free >= length), None)
        if slot is None:
            rows.append([index])
            room.append(row_tokens - length)
        else:
            rows[slot].append(index)
            room[slot] -= length
    return rows


def _group(rows: list[Row], lengths: np.ndarray, token_budget: int) -> list[MicroBatch]:
    """Return consecutive rows grouped under the token budget (rows padded to the longest)."""
    sizes = [int(sum(lengths[i] for i in row)) for row in rows]
    return [[rows[i] for i in group] for group in group_under_budget(sizes, token_budget)]


def plan_epoch(indices: np.ndarray, lengths: np.ndarray, seed: int, epoch: int, row_tokens: int,
               token_budget: int, shuffle: bool = True) -> list[MicroBatch]:
    """Return the micro-batches of one epoch over `indices` (every index exactly once)."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(indices) if shuffle else np.asarray(indices)
    batches: list[MicroBatch] = []
    for start in range(0, len(order), WINDOW):
        window = [int(i) for i in order[start:start + WINDOW]]
        batches += _group(_pack(window, lengths, row_tokens), lengths, token_budget)
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def steps_in(micro_batches: int, per_step: int) -> int:
    """Return the optimizer steps of an epoch of `micro_batches` (the last one may be smaller)."""
    return -(-micro_batches // per_step)


@dataclass
class PackedBatch:
    """Rows of packed samples, right-padded to the longest row `L`.

    `input_ids [B, L]`, `loss_mask [B, L]` bool, `doc_ids [B, L]` (-1 for padding),
    `position_ids [B, L]` (restarting at 0 per sample), `aux [B, L, A*H]`, `last [B, L, H]`, and
    `argmax [B, L]` (the target's full-vocabulary argmax, target ids; 0 for padding).
    """

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    doc_ids: torch.Tensor
    position_ids: torch.Tensor
    aux: torch.Tensor
    last: torch.Tensor
    argmax: torch.Tensor

    def to(self, device: torch.device | str) -> PackedBatch:
        return PackedBatch(*(t.to(device, non_blocking=True) for t in vars(self).values()))

    @property
    def tokens(self) -> int:
        return int((self.doc_ids >= 0).sum())


def collate(rows: list[list[dict[str, torch.Tensor]]]) -> PackedBatch:
    """Return the packed batch of `rows`, each a list of samples (`input_ids`, `loss_mask`, `aux`, `last`,
    `argmax`)."""
    widths = [sum(len(s["input_ids"]) for s in row) for row in rows]
    B, L = len(rows), max(widths)
    first = rows[0][0]
    batch = PackedBatch(
        input_ids=torch.zeros(B, L, dtype=torch.long), loss_mask=torch.zeros(B, L, dtype=torch.bool),
        doc_ids=torch.full((B, L), -1, dtype=torch.long), position_ids=torch.zeros(B, L, dtype=torch.long),
        aux=torch.zeros(B, L, first["aux"].shape[-1], dtype=first["aux"].dtype),
        last=torch.zeros(B, L, first["last"].shape[-1], dtype=first["last"].dtype),
        argmax=torch.zeros(B, L, dtype=torch.long),
    )
    for b, row in enumerate(rows):
        start = 0
        for doc, sample in enumerate(row):
            stop = start + len(sample["input_ids"])
            batch.input_ids[b, start:stop] = sample["input_ids"].long()
            batch.loss_mask[b, start:stop] = sample["loss_mask"].bool()
            batch.doc_ids[b, start:stop] = doc
            batch.position_ids[b, start:stop] = torch.arange(stop - start)
            batch.aux[b, start:stop] = sample["aux"]
            batch.last[b, start:stop] = sample["last"]
            batch.argmax[b, start:stop] = sample["argmax"]
            start = stop
    return batch
