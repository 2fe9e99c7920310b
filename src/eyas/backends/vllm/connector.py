"""vLLM >= 0.22: the `extract_hidden_states` speculative method and its hidden-states KV connector.

The "draft" of that method only stores the requested layers; the connector writes them per
request to a safetensors file (`hidden_states [T, n, H]`, `token_ids [T]`) under the spool
directory and returns its path in the request's `kv_transfer_params`. From 0.22 the write is
asynchronous, so files are read with the connector's own `load_hidden_states` (it waits for the
writer's lock) and removed with `cleanup_hidden_states`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from vllm import LLM
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    cleanup_hidden_states, load_hidden_states,
)
from vllm.outputs import RequestOutput

from eyas.errors import EyasError
from eyas.backends.vllm.engine import engine_arguments, prefill, shutdown, start
from eyas.backends.vllm.startup import ModelImpl

CONNECTOR = "ExampleHiddenStatesConnector"


def _path_of(output: RequestOutput) -> str:
    params = output.kv_transfer_params or {}
    path = params.get("hidden_states_path")
    if not path:
        raise EyasError(f"vLLM request {output.request_id}: no hidden_states_path in kv_transfer_params ({params})")
    return str(path)


class ConnectorExtractor:
    """Hidden states of token rows through vLLM's hidden-states connector."""

    def __init__(self, target: Path, layer_ids: list[int], spool: Path, dtype: str, tensor_parallel_size: int,
                 longest: int, trust_remote_code: bool, model_impl: ModelImpl = "auto") -> None:
        spool.mkdir(parents=True, exist_ok=True)
        self.llm: LLM = start(target, {
            **engine_arguments(target, dtype, tensor_parallel_size, longest, trust_remote_code, model_impl=model_impl),
            "speculative_config": {
                "method": "extract_hidden_states", "num_speculative_tokens": 1,
                "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layer_ids}},
            },
            "kv_transfer_config": {
                "kv_connector": CONNECTOR, "kv_role": "kv_producer",
                "kv_connector_extra_config": {"shared_storage_path": str(spool)},
            },
        })

    def hidden_states(self, rows: list[np.ndarray]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Return `(hidden_states [T, n, H], token_ids [T])` per row, in the order of `rows`."""
        results = []
        for output in prefill(self.llm, rows):
            path = _path_of(output)
            tensors = load_hidden_states(path)
            cleanup_hidden_states(path, keep_hidden_states=False)
            results.append((tensors["hidden_states"], tensors["token_ids"]))
        return results

    def close(self) -> None:
        """Stop the engine's processes and free their memory."""
        shutdown(self.llm)
