"""`eyas eval --engine vllm`: the draft served by vLLM beside eyas's own decoder, on the same prompt ids.

The draft is exported in vLLM's format into a temporary directory and served with vLLM's offline
`LLM` API three times, each engine on every prompt as token ids (no second rendering, so both
engines decode exactly the same ids) and with the same sampling: the target alone, the target with
the EAGLE-3 draft (a chain of K), and the target with vLLM's `ngram` proposer (prompt lookup, K
tokens, n-grams of 1..4). tau and per-position acceptance come from vLLM's own counters
(backends/vllm/metrics.py), taken around the timed pass, after a short warm-up pass per engine.
Token rates are new tokens over the wall time of the whole batch (vLLM batches the prompts
continuously, so its rates are not comparable to eyas's one-prompt-at-a-time rates; its speedups are).
Every engine builds the target with `config.model_impl`; before anything loads, the class that gives
must implement EAGLE-3's auxiliary hidden states (eyas.backends.vllm.startup.vllm_target_problem).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from eyas.backends.vllm.contract import installed_vllm, not_installed
from eyas.backends.vllm.metrics import SpecCounters
from eyas.backends.vllm.startup import vllm_target_problem
from eyas.config import EvalConfig, ExportConfig
from eyas.errors import CannotRun, EyasError
from eyas.export.writer import run_export
from eyas.draft.config import read_draft_config

if TYPE_CHECKING:
    from eyas.backends.vllm.serve import VllmEngine

NGRAM_LOOKUP_MAX = 4
WARMUP_TOKENS = 8


class EngineFigures(BaseModel):
    """One vLLM engine's pass over the prompts."""

    tokens_per_s: float
    new_tokens: int
    seconds: float
    speedup: float = Field(description="tokens/s over the target alone's, same run")
    tau: float | None = Field(None, description="1 + accepted / drafts, from vLLM's counters (None: not speculative)")
    per_position_acceptance: list[float] | None = None
    drafts: int | None = Field(None, description="verification steps that carried a draft")
    same_as_target_alone: int | None = Field(None, description="prompts whose tokens equal the target alone's")


class VllmFigures(BaseModel):
    """vLLM's figures for the draft, beside eyas's own in `report.json`."""

    vllm: str = Field(description="the vLLM build that served (distribution and version)")
    chain: int
    dtype: str
    prompts: int
    target_alone: EngineFigures
    eagle3: EngineFigures
    ngram: EngineFigures
    ngram_lookup_max: int = NGRAM_LOOKUP_MAX
    tau_ratio_vllm_to_eyas: float | None = Field(None, description="vLLM's tau over eyas's decoder's, same prompts")


def serving_problems(config: EvalConfig) -> list[str]:
    """Return why `config` cannot be served by vLLM here (no vLLM, not a chain, a target whose vLLM class under
    `config.model_impl` lacks EAGLE-3's auxiliary hidden states); empty when it can. Refuses (raises, one line) a
    target vLLM refuses outright (its config validation)."""
    problems = []
    if installed_vllm() is None:
        problems.append(not_installed("--engine vllm", "run .venv-vllm/bin/eyas eval ..."))
    if config.chain is None:
        problems.append("--engine vllm: vLLM serves an EAGLE-3 chain; give --chain K (not a tree or the auto shape)")
    if problems:
        return problems
    problem = vllm_target_problem(config.target, config.model_impl, config.trust_remote_code)
    return [f"--engine vllm: {problem}"] if problem else []


def _pass(engine: VllmEngine, prompts: list[list[int]], config: EvalConfig, stop: set[int], chain: int,
          baseline: EngineFigures | None, baseline_tokens: list[list[int]] | None
          ) -> tuple[EngineFigures, list[list[int]]]:
    """Return one engine's figures over `prompts` (after a warm-up) and its completions' tokens."""
    seeds = [config.seed + index for index in range(len(prompts))]
    engine.generate(prompts[:1], WARMUP_TOKENS, config.temperature, config.top_p, config.top_k, stop, seeds[:1])
    before = SpecCounters.read(engine.snapshot(), chain)
    completions, seconds = engine.timed(prompts, config.max_new_tokens, config.temperature, config.top_p, config.top_k,
                                        stop, seeds)
    counted = SpecCounters.read(engine.snapshot(), chain).minus(before)
    tokens = [c.token_ids for c in completions]
    new_tokens = sum(len(t) for t in tokens)
    rate = new_tokens / seconds if seconds > 0 else 0.0
    speculative = counted.drafts > 0
    return EngineFigures(
        tokens_per_s=rate, new_tokens=new_tokens, seconds=seconds,
        speedup=rate / baseline.tokens_per_s if baseline and baseline.tokens_per_s else 1.0,
        tau=counted.tau if speculative else None, per_position_acceptance=counted.acceptance if speculative else None,
        drafts=counted.drafts if speculative else None,
        same_as_target_alone=sum(a == b for a, b in zip(tokens, baseline_tokens)) if baseline_tokens else None,
    ), tokens


def serve_in_vllm(config: EvalConfig, prompts: list[list[int]], stop: set[int], eyas_tau: float | None) -> VllmFigures:
    """Return vLLM's figures for `config.draft` on `prompts` (token ids) with stop ids `stop`.

    Refuses (CannotRun) where vLLM is missing or the decoding is not a chain; the draft is exported
    (`eyas export --format vllm`) into a temporary directory that is removed afterwards.
    """
    problems = serving_problems(config)
    if problems:
        raise CannotRun("; ".join(problems))
    from eyas.backends.vllm.serve import VllmEngine, eagle3_method, ngram_method

    arguments = _engine_arguments(config, prompts)
    chain = config.chain
    assert chain is not None
    with _exported(config) as draft:
        with VllmEngine(**arguments) as engine:
            alone, alone_tokens = _pass(engine, prompts, config, stop, chain, None, None)
        with VllmEngine(**arguments, speculative=eagle3_method(draft, chain, _family(config))) as engine:
            eagle3, _ = _pass(engine, prompts, config, stop, chain, alone, alone_tokens)
    with VllmEngine(**arguments, speculative=ngram_method(chain, NGRAM_LOOKUP_MAX)) as engine:
        ngram, _ = _pass(engine, prompts, config, stop, chain, alone, alone_tokens)
    _check_drafted(config, eagle3)
    installed = installed_vllm()
    assert installed is not None
    return VllmFigures(vllm=installed.describe(), chain=chain, dtype=config.dtype, prompts=len(prompts),
                       target_alone=alone, eagle3=eagle3, ngram=ngram,
                       tau_ratio_vllm_to_eyas=eagle3.tau / eyas_tau if eyas_tau else None)


def served_draft_tau(config: EvalConfig, prompt_sets: dict[str, list[list[int]]], stop: set[int]) -> dict[str, EngineFigures]:
    """Return vLLM's EAGLE-3 figures (tau, per-position acceptance; `speedup` is not measured: 1.0) for
    `config.draft` on each named set of prompt ids, served by one engine: the acceptance side of
    `serve_in_vllm` alone, for drafts compared with each other (bench/quality.py). Refuses as it does."""
    problems = serving_problems(config)
    if problems:
        raise CannotRun("; ".join(problems))
    from eyas.backends.vllm.serve import VllmEngine, eagle3_method

    chain = config.chain
    assert chain is not None
    arguments = _engine_arguments(config, [row for rows in prompt_sets.values() for row in rows])
    figures = {}
    with _exported(config) as draft, \
            VllmEngine(**arguments, speculative=eagle3_method(draft, chain, _family(config))) as engine:
        for name, prompts in prompt_sets.items():
            figures[name], _ = _pass(engine, prompts, config, stop, chain, None, None)
            _check_drafted(config, figures[name])
    return figures


def _engine_arguments(config: EvalConfig, prompts: list[list[int]]) -> dict[str, object]:
    """Return VllmEngine's arguments for `config` and the longest of `prompts` plus its new tokens and a draft."""
    installed = installed_vllm()
    assert installed is not None and config.chain is not None
    longest = max(len(p) for p in prompts) + config.max_new_tokens
    return {"target": config.target, "dtype": config.dtype, "device": installed.device,
            "max_model_len": longest + config.chain + 1, "trust_remote_code": config.trust_remote_code, "seed": config.seed,
            "model_impl": config.model_impl}


@contextmanager
def _exported(config: EvalConfig) -> Iterator[Path]:
    """Yield `config.draft` exported in vLLM's format into a temporary directory, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="eyas-vllm-draft-") as exported:
        draft = Path(exported) / "draft"
        run_export(ExportConfig(draft=config.draft, format="vllm", out=draft, target=config.target,
                                trust_remote_code=config.trust_remote_code))
        yield draft


def _family(config: EvalConfig) -> str:
    """Return the family of `config.draft` (vLLM serves each by its own method)."""
    return read_draft_config(config.draft).family


def _check_drafted(config: EvalConfig, figures: EngineFigures) -> None:
    """Refuse an EAGLE-3 pass in which vLLM counted no drafts."""
    if figures.tau is None:
        raise EyasError(f"{config.draft}: vLLM ran the EAGLE-3 draft but counted no drafts (is speculative decoding on?)")
