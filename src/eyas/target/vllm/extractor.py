"""Store samples of dataset rows through the installed vLLM, on the path its release runs (contract.py)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

import torch

from eyas.data.dataset import DatasetReader
from eyas.errors import EyasError
from eyas.features.store import SampleFeatures
from eyas.target.vllm.contract import VllmPath, installed_vllm, release_path
from eyas.target.vllm.layout import to_sample, vllm_layer_ids


NO_GPU = "--backend vllm: needs a CUDA GPU and none is visible (use --backend hf on CPU)"


def usable_path() -> tuple[str, VllmPath]:
    """Return the installed vLLM's version and path; refuses a missing vLLM, an unsupported release or no GPU."""
    version = installed_vllm()
    try:
        path = release_path(version)
    except EyasError as error:
        raise EyasError(f"--backend vllm: {error}") from None
    if not torch.cuda.is_available():
        raise EyasError(NO_GPU)
    return str(version), path


def engine_class(path: VllmPath) -> type:
    """Return the extractor class of `path` (importing it imports vLLM)."""
    module, _, name = path.engine.partition(":")
    return getattr(importlib.import_module(module), name)


class VllmFeatures:
    """The engine of the installed vLLM's path, started once; `samples` yields store samples of dataset rows."""

    def __init__(self, target: Path, aux_ids: list[int], num_layers: int, spool: Path, dtype: str,
                 tensor_parallel_size: int, longest: int, trust_remote_code: bool) -> None:
        self.version, self.path = usable_path()
        self.aux_ids, self.num_layers = aux_ids, num_layers
        self.requested = vllm_layer_ids(aux_ids, num_layers)
        self.engine = engine_class(self.path)(target, self.requested, spool, dtype, tensor_parallel_size, longest, trust_remote_code)

    def describe(self) -> str:
        return f"vllm {self.version} ({self.path.name})"

    def samples(self, reader: DatasetReader, indices: list[int]) -> Iterator[tuple[int, SampleFeatures]]:
        """Yield `(tokens, features)` for the dataset rows `indices`, in their order (one engine call for all)."""
        rows = [reader.row(i) for i in indices]
        results = self.engine.hidden_states([ids for ids, _ in rows])
        for index, (ids, mask), (hidden, token_ids) in zip(indices, rows, results, strict=True):
            yield len(ids), to_sample(hidden, token_ids, self.requested, self.aux_ids, self.num_layers, index, ids, mask,
                                      where=f"{reader.dir}: sample {index} (vLLM)")
