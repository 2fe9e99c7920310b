"""Where training samples come from: the feature store (offline) or the target itself (online).

Both hand the trainer the same per-sample tensors (`input_ids`, `loss_mask`, `aux`, `last`), so
the draft, the loss and the batching are one code path for both modes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from eyas.data.dataset import DatasetReader
from eyas.features.extract import sample_features
from eyas.features.store import StoreManifest, open_store
from eyas.models.capture import FeatureCapture

Sample = dict[str, torch.Tensor]


class SampleSource(Protocol):
    def lengths(self) -> np.ndarray:
        """Return the token count of every sample `[S]`."""
        ...

    def samples(self, indices: list[int]) -> dict[int, Sample]:
        """Return the tensors of the samples `indices`, keyed by index."""
        ...


class StoreSource:
    """Samples of a finished feature store, read through memory-mapped shards (features in float32)."""

    def __init__(self, store_dir: Path, manifest: StoreManifest) -> None:
        """Open every shard; refuses what `open_store` refuses but the checksums, which `resolve_train` compares
        once per run before the run is claimed."""
        self.shards = open_store(store_dir, manifest, checksums=False)
        counts = np.array([len(shard) for shard in self.shards])
        self._shard_of = np.repeat(np.arange(len(self.shards)), counts)  # [S] shard of each sample
        self._first = np.concatenate([[0], counts.cumsum()[:-1]])  # [shards] first sample of each shard
        self._lengths = np.concatenate([np.diff(shard.offsets.numpy()) for shard in self.shards])  # [S]

    def lengths(self) -> np.ndarray:
        return self._lengths

    def samples(self, indices: list[int]) -> dict[int, Sample]:
        out = {}
        for index in indices:
            shard = int(self._shard_of[index])
            out[index] = self.shards[shard].sample(index - int(self._first[shard]))
        return out


class OnlineSource:
    """Samples of a prepared dataset with features computed by the target as they are needed."""

    def __init__(self, reader: DatasetReader, capture: FeatureCapture, token_budget: int, device: str) -> None:
        self.reader, self.capture, self.token_budget, self.device = reader, capture, token_budget, device

    def lengths(self) -> np.ndarray:
        return self.reader.lengths()

    def samples(self, indices: list[int]) -> dict[int, Sample]:
        out = {}
        for _, features in sample_features(self.capture, self.reader, indices, self.token_budget, self.device):
            out[features.sample_id] = {"input_ids": features.input_ids, "loss_mask": features.loss_mask,
                                       "aux": features.aux.float(), "last": features.last.float()}
        return out
