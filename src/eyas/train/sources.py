"""Where training samples come from: the feature store (offline) or the target itself (online).

Both hand the trainer the same per-sample tensors (`input_ids`, `loss_mask`, `aux`, `last`, and
`argmax`, the target's full-vocabulary argmax), so the draft, the loss and the batching are one code
path for both modes. The argmax is the store's; a store extracted before eyas stored it gets it
computed once per sample, on first use, and kept for the run; online, the target's head computes
it with the features.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from eyas.data.dataset import DatasetReader
from eyas.features.extract import sample_features
from eyas.features.store import StoreManifest, open_store
from eyas.models.argmax import TargetArgmax
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

    def __init__(self, store_dir: Path, manifest: StoreManifest, argmax: TargetArgmax | None = None) -> None:
        """Open every shard; refuses what `open_store` refuses but the checksums, which `resolve_train` compares
        once per run before the run is claimed. A store without an argmax (`manifest.teacher_argmax` None)
        gets its samples' computed by `argmax` the first time each is read, kept for the run (4 bytes a
        token); without `argmax`, its samples come without one."""
        self.shards = open_store(store_dir, manifest, checksums=False)
        counts = np.array([len(shard) for shard in self.shards])
        self._shard_of = np.repeat(np.arange(len(self.shards)), counts)  # [S] shard of each sample
        self._first = np.concatenate([[0], counts.cumsum()[:-1]])  # [shards] first sample of each shard
        self._lengths = np.concatenate([np.diff(shard.offsets.numpy()) for shard in self.shards])  # [S]
        self.argmax = argmax if manifest.teacher_argmax is None else None
        if self.argmax is not None:
            self._starts = np.concatenate([[0], self._lengths.cumsum()])  # [S+1] first token of each sample
            self._computed = np.zeros(len(self._lengths), dtype=bool)  # [S]
            self._kept = torch.empty(int(self._starts[-1]), dtype=torch.int32)  # [tokens], pages touched as filled

    def lengths(self) -> np.ndarray:
        return self._lengths

    def samples(self, indices: list[int]) -> dict[int, Sample]:
        out = {}
        for index in indices:
            shard = int(self._shard_of[index])
            out[index] = self.shards[shard].sample(index - int(self._first[shard]))
            if self.argmax is not None:
                out[index]["argmax"] = self._argmax_of(index, out[index]["last"])
        return out

    def _argmax_of(self, index: int, last: torch.Tensor) -> torch.Tensor:
        """Return sample `index`'s argmax `[T]` int32: computed from its `last [T, H]` the first time, kept after."""
        kept = self._kept[int(self._starts[index]):int(self._starts[index + 1])]  # [T], a view
        if not self._computed[index]:
            kept.copy_(self.argmax(last))  # type: ignore[misc]
            self._computed[index] = True
        return kept


class OnlineSource:
    """Samples of a prepared dataset with features computed by the target as they are needed."""

    def __init__(self, reader: DatasetReader, capture: FeatureCapture, token_budget: int, device: str,
                 argmax: TargetArgmax) -> None:
        self.reader, self.capture, self.token_budget, self.device = reader, capture, token_budget, device
        self.argmax = argmax

    def lengths(self) -> np.ndarray:
        return self.reader.lengths()

    def samples(self, indices: list[int]) -> dict[int, Sample]:
        out = {}
        for _, features in sample_features(self.capture, self.reader, indices, self.token_budget, self.device):
            last = features.last.float()  # [T, H]
            out[features.sample_id] = {"input_ids": features.input_ids, "loss_mask": features.loss_mask,
                                       "aux": features.aux.float(), "last": last, "argmax": self.argmax(last).cpu()}
        return out
