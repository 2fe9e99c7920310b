"""vLLM < 0.22 (CUDA build): the worker extension (`LLM(worker_extension_cls=...)`) that records hidden states.

vLLM mixes this class into each GPU worker; `collective_rpc("eyas_capture_start" | "eyas_capture_take")`
calls its methods in every worker process. Method names carry an `eyas_` prefix because vLLM
refuses an extension whose names clash with the worker's. Hooks need eager execution (compiled
graphs and CUDA graphs skip Python hooks), which hooked.py asks for. With tensor parallelism
the hidden states are whole and equal on every rank, so rank 0 alone writes them. The work is
residual.py's, shared with the CPU runner's extension (cpu_worker.py); this class only reaches
the model through the runner the contract audits.
"""

from __future__ import annotations

from pathlib import Path

from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from eyas.backends.vllm.residual import capture_decoder, spool_records


class HiddenStateCapture:
    """Worker mix-in: hooks on the model's decoder stack; records written as safetensors by rank 0."""

    rank: int  # set by vLLM's worker
    model_runner: GPUModelRunner  # set by vLLM's worker

    def eyas_capture_start(self, layer_ids: list[int]) -> int:
        """Hook the decoder layers of `layer_ids` (input convention, N = the final norm's input); return the layer count."""
        runner: GPUModelRunner = self.model_runner
        self.eyas_capture = capture_decoder(runner.get_model(), layer_ids)  # get_model: unwrapped of CUDA-graph wrappers
        return len(self.eyas_capture.model.layers)

    def eyas_capture_take(self, spool: str, first: int) -> list[str]:
        """Write the forwards recorded since the last call to `spool` (rank 0); return their paths, oldest first."""
        return spool_records(self.eyas_capture, self.rank, Path(spool), first)
