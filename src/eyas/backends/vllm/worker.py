"""vLLM < 0.22: the worker extension (`LLM(worker_extension_cls=...)`) that records hidden states.

vLLM mixes this class into each GPU worker; `collective_rpc("eyas_capture_start" | "eyas_capture_take")`
calls its methods in every worker process. Method names carry an `eyas_` prefix because vLLM
refuses an extension whose names clash with the worker's. Hooks need eager execution (compiled
graphs and CUDA graphs skip Python hooks), which hooked.py asks for. With tensor parallelism
the hidden states are whole and equal on every rank, so rank 0 alone writes them.
"""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import save_file
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from eyas.backends.vllm.residual import ResidualCapture


class HiddenStateCapture:
    """Worker mix-in: hooks on the model's decoder stack; records written as safetensors by rank 0."""

    rank: int  # set by vLLM's worker
    model_runner: GPUModelRunner  # set by vLLM's worker

    def eyas_capture_start(self, layer_ids: list[int]) -> int:
        """Hook the decoder layers of `layer_ids` (input convention, N = the final norm's input); return the layer count."""
        runner: GPUModelRunner = self.model_runner
        model = runner.get_model()  # unwrapped of CUDA-graph wrappers
        self.eyas_capture = ResidualCapture(model.model, layer_ids)
        return len(model.model.layers)

    def eyas_capture_take(self, spool: str, first: int) -> list[str]:
        """Write the forwards recorded since the last call to `spool` (rank 0); return their paths, oldest first."""
        records = self.eyas_capture.take()
        if self.rank != 0:
            return []
        paths = []
        for number, record in enumerate(records, first):
            path = Path(spool) / f"forward-{number:09d}.safetensors"
            save_file(record, str(path))
            paths.append(str(path))
        return paths
