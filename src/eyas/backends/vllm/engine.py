"""What every vLLM path shares: the engine's placement (host memory for the KV cache on a CPU build), the
settings that keep every prompt one whole forward for extraction, and prefill-only requests (one sampled
token, never fed back)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from vllm.outputs import RequestOutput

from eyas.backends.vllm.startup import ModelImpl, engine_refusal

CPU_KV_CACHE_BYTES = 2 << 30  # a fixed KV cache on a CPU build: its default reserves 92 % of a NUMA node's memory
CPU_RESERVED = "VLLM_CPU_NUM_OF_RESERVED_CPU"  # vLLM keeps this many cores out of its compute threads


def base_arguments(target: Path, dtype: str, device: str, max_model_len: int, trust_remote_code: bool,
                   seed: int = 0, model_impl: ModelImpl = "auto") -> dict[str, Any]:
    """Return the `LLM(...)` keywords every eyas engine takes: the model, its implementation (`model_impl`:
    vLLM's own class, its Transformers backend, or auto), dtype, context and seed.

    On a CPU build (`device` "cpu"): a fixed KV cache size instead of a share of the machine's memory,
    eager execution (inductor's compilation of the model took minutes on 2 cores and did not pay back
    within a stage: bench/regenerate.py), and, unless the caller set it, no core reserved for vLLM's
    front end (its default keeps one of two cores out of the compute threads); the variable is set in
    this process's environment, which the engine processes inherit.
    """
    arguments: dict[str, Any] = {"model": str(target), "dtype": dtype, "max_model_len": max_model_len,
                                 "trust_remote_code": trust_remote_code, "seed": seed, "model_impl": model_impl}
    if device == "cpu":
        arguments.update(kv_cache_memory_bytes=CPU_KV_CACHE_BYTES, enforce_eager=True)
        os.environ.setdefault(CPU_RESERVED, "0")
    return arguments


def engine_arguments(target: Path, dtype: str, tensor_parallel_size: int, longest: int,
                     trust_remote_code: bool, device: str = "cuda", model_impl: ModelImpl = "auto") -> dict[str, Any]:
    """Return `LLM(...)` keywords for extraction: no prefix caching (a cached prefix is never computed),
    no chunked prefill (a prompt is never split across forwards), room for the longest sample."""
    max_model_len = longest + 1  # the one sampled token
    return {
        **base_arguments(target, dtype, device, max_model_len, trust_remote_code, model_impl=model_impl),
        "tensor_parallel_size": tensor_parallel_size, "max_num_batched_tokens": max_model_len,
        "enable_prefix_caching": False, "enable_chunked_prefill": False,
    }


def start(subject: Path | str, keywords: dict[str, Any]) -> LLM:
    """Return vLLM's `LLM(**keywords)`, started; refuses an engine that does not start in one line naming `subject`
    (the target, and its draft where there is one) and vLLM's own first message (`startup.engine_refusal`: exit 2
    for vLLM's validation of the config or settings, 3 for an engine that failed while starting)."""
    try:
        return LLM(**keywords)
    except Exception as error:  # whatever vLLM raises while starting: one line, never its traceback
        raise engine_refusal(subject, error) from error


def prefill(llm: LLM, rows: list[np.ndarray]) -> list[RequestOutput]:
    """Run every token row through `llm` as one prompt each (one greedy token sampled); return the
    request outputs in the order of `rows`."""
    prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in ids]) for ids in rows]
    return llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)


def shutdown(llm: LLM) -> None:
    """Stop `llm`'s engine processes and free their memory (vLLM's `LLM` has no public close)."""
    llm.llm_engine.engine_core.shutdown()
