"""What both vLLM paths share: the engine settings that keep every prompt one whole forward, and
prefill-only requests (one sampled token, never fed back)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from vllm.outputs import RequestOutput


def engine_arguments(target: Path, dtype: str, tensor_parallel_size: int, longest: int,
                     trust_remote_code: bool) -> dict[str, Any]:
    """Return `LLM(...)` keywords for extraction: no prefix caching (a cached prefix is never computed),
    no chunked prefill (a prompt is never split across forwards), room for the longest sample."""
    max_model_len = longest + 1  # the one sampled token
    return {
        "model": str(target), "dtype": dtype, "tensor_parallel_size": tensor_parallel_size,
        "max_model_len": max_model_len, "max_num_batched_tokens": max_model_len,
        "enable_prefix_caching": False, "enable_chunked_prefill": False,
        "trust_remote_code": trust_remote_code, "seed": 0,
    }


def prefill(llm: LLM, rows: list[np.ndarray]) -> list[RequestOutput]:
    """Run every token row through `llm` as one prompt each (one greedy token sampled); return the
    request outputs in the order of `rows`."""
    prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in ids]) for ids in rows]
    return llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
