"""Serving through vLLM's offline `LLM` API: the target alone, with an EAGLE-3 draft, or with vLLM's n-gram
(prompt lookup) proposer. Prompts go in as token ids, so vLLM runs exactly the ids eyas's decoder runs;
completions come back as token ids, with vLLM's own speculative-decoding counters (metrics.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from vllm.v1.metrics.reader import Counter, Vector

from eyas.backends.vllm.engine import base_arguments, shutdown, start
from eyas.backends.vllm.metrics import Snapshot
from eyas.backends.vllm.startup import ModelImpl


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]  # the new tokens, the stop token included when generation stopped on one


def eagle3_method(draft: Path, tokens: int, family: str = "eagle3") -> dict[str, object]:
    """Return vLLM's `speculative_config` for a draft directory (an `eyas export --format vllm` output) of `family`:
    EAGLE-3; P-EAGLE, which vLLM drafts in one forward only when told (else it runs it as EAGLE-3); DFlash."""
    if family == "dflash":
        return {"method": "dflash", "model": str(draft), "num_speculative_tokens": tokens}
    return {"method": "eagle3", "model": str(draft), "num_speculative_tokens": tokens,
            **({"parallel_drafting": True} if family == "peagle" else {})}


def ngram_method(tokens: int, lookup_max: int) -> dict[str, object]:
    """Return vLLM's `speculative_config` for prompt-lookup drafting of `tokens`, matching n-grams of 1..`lookup_max`."""
    return {"method": "ngram", "num_speculative_tokens": tokens, "prompt_lookup_min": 1, "prompt_lookup_max": lookup_max}


class VllmEngine:
    """One vLLM engine over a local model directory, optionally speculative; `with` closes it. An engine that does
    not start is refused in one line (`engine.start`)."""

    def __init__(self, target: Path, dtype: str, device: str, max_model_len: int, trust_remote_code: bool = False,
                 speculative: dict[str, object] | None = None, seed: int = 0, model_impl: ModelImpl = "auto") -> None:
        draft = (speculative or {}).get("model")
        subject = f"{target} with the EAGLE-3 draft {draft}" if draft else target
        self.llm: LLM = start(subject, {**base_arguments(target, dtype, device, max_model_len, trust_remote_code, seed,
                                                   model_impl),
                                  "speculative_config": speculative, "disable_log_stats": False})

    def generate(self, rows: list[list[int]], max_new_tokens: int, temperature: float, top_p: float, top_k: int,
                 stop_ids: set[int], seeds: list[int]) -> list[Completion]:
        """Return the completion of each token-id row, in the order of `rows` (`seeds[i]` seeds row i's sampling;
        temperature 0 is greedy). vLLM batches the rows continuously."""
        params = [SamplingParams(max_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                 seed=seed, stop_token_ids=sorted(stop_ids)) for seed in seeds]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(row)) for row in rows], params, use_tqdm=False)
        return [Completion(list(output.outputs[0].token_ids)) for output in outputs]

    def timed(self, rows: list[list[int]], max_new_tokens: int, temperature: float, top_p: float, top_k: int,
              stop_ids: set[int], seeds: list[int]) -> tuple[list[Completion], float]:
        """Return `generate`'s completions and its wall seconds."""
        started = time.perf_counter()
        completions = self.generate(rows, max_new_tokens, temperature, top_p, top_k, stop_ids, seeds)
        return completions, time.perf_counter() - started

    def snapshot(self) -> Snapshot:
        """Return vLLM's counters and vectors now (name -> value or values)."""
        snapshot: Snapshot = {}
        for metric in self.llm.get_metrics():
            if isinstance(metric, Counter):
                snapshot[metric.name] = float(metric.value)
            elif isinstance(metric, Vector):
                snapshot[metric.name] = [float(v) for v in metric.values]
        return snapshot

    def close(self) -> None:
        """Stop the engine's processes and free its memory."""
        shutdown(self.llm)

    def __enter__(self) -> VllmEngine:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
