"""Continuing a finished demo with more data, one continuation per call:
`python -m eyas.demo CONFIG --continue MINUTES` (`make demo-continue`).

Continuation k (1, 2, ...) lives in `OUT/continue-k/` and runs the demo's data and training path again
on new prompts, starting from the draft before it:

- **sized by measured throughput**: it takes as many new training prompts as MINUTES buys at the seconds
  per prompt its predecessor spent in regenerate, prepare, extract and train (the demo's
  `stage-seconds.json` for the first, the previous continuation's after; every run of each summed, so
  a reused or resumed stage does not pass for a fast one);
- its prompts are the next ones of the demo's draw (`training_prompts` with a larger count, less every
  prompt used before): none is trained on twice, none is a held-out one;
- regenerate (through vLLM where the demo runs it, the faster backend here: docs/benchmarks.md),
  prepare without a draft vocabulary (the draft keeps its own mapping), extract, and train with the
  demo's train section from the previous draft (`train.init`: the demo's `train/final`, then the previous
  continuation's), its learning-rate schedule restarted;
- scored by held-out greedy chain tau (`demo.chain`, else 4) replayed on the eval section's first `limit`
  prompts x `max_new_tokens` of both held-out sets (eyas.decode.replay: equal to eyas's decoder round
  for round), the previous draft scored on the same continuations as the baseline; one record is
  appended to `OUT/report/continuations.jsonl`.

The plan (`plan.json`: the sizing and the prompts) is fixed when a continuation starts, so an interrupted
one resumes with the same prompts whatever MINUTES the next call gives; a recorded one is never rerun.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from eyas.config import DemoConfig, EvalConfig, ExtractConfig, PrepareConfig, RegenerateConfig, TrainConfig
from eyas.errors import EyasError
from eyas.demo.timing import STAGE_SECONDS, StageClock, read_stage_seconds
from eyas.files import write_json_atomic, write_text_atomic

RECORDS = "continuations.jsonl"  # in OUT/report
PLAN = "plan.json"
PROMPTS = "prompts.jsonl"
SIZED_STAGES = ("regenerate", "prepare", "extract", "train")
DEFAULT_CHAIN = 4


def continuation_dir(root: Path, number: int) -> Path:
    """Return the directory of continuation `number` (1-based) of the demo under `root`."""
    return root / f"continue-{number}"


def read_records(root: Path) -> list[dict[str, Any]]:
    """Return the recorded continuations of the demo under `root`, in order (empty when there is none)."""
    path = root / "report" / RECORDS
    return _read_jsonl(path) if path.is_file() else []


def seconds_per_prompt(directory: Path, prompts: int) -> float:
    """Return the seconds per training prompt that regenerate, prepare, extract and train took in `directory`
    (the demo's root or a continuation's), every run summed; refuses a directory with none recorded."""
    seconds = read_stage_seconds(directory / STAGE_SECONDS)
    total = sum(seconds.get(stage, 0.0) for stage in SIZED_STAGES)
    if total <= 0:
        raise EyasError(f"{directory / STAGE_SECONDS}: no stage seconds recorded; run the demo (or the previous "
                        "continuation) to its training first")
    return total / prompts


def next_prompts(seed: int, general_share: float | None, used: set[str], count: int) -> list[dict[str, str]]:
    """Return the next `count` training prompts of the demo's draw that are not in `used`; refuses (from
    `training_prompts`) when the draw runs out."""
    from eyas.demo.prompts import training_prompts

    drawn = len(used) + count
    while True:
        try:
            draw = training_prompts(drawn, seed, general_share)
        except EyasError as error:
            raise EyasError(f"--continue: the demo's draw (seed {seed}, general_share {general_share}) has no "
                            f"{count} new training prompts left: {error}; give fewer minutes") from error
        fresh = [p for p in draw if p["prompt"] not in used]
        if len(fresh) >= count:
            return fresh[:count]
        drawn += count - len(fresh)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _plan(demo: DemoConfig, root: Path, number: int, minutes: float) -> dict[str, Any]:
    """Return continuation `number`'s plan, made (sized, prompts drawn and written) on its first call."""
    directory = continuation_dir(root, number)
    if (directory / PLAN).is_file():
        plan = json.loads((directory / PLAN).read_text(encoding="utf-8"))
        if plan["minutes"] != minutes:
            print(f"eyas demo: continuation {number} resumes its plan of {plan['minutes']} minutes "
                  f"({plan['prompts']} prompts)", file=sys.stderr)
        return plan
    if number == 1:
        previous, previous_prompts = root, demo.train_prompts
    else:
        previous = continuation_dir(root, number - 1)
        previous_prompts = json.loads((previous / PLAN).read_text(encoding="utf-8"))["prompts"]
    rate = seconds_per_prompt(previous, previous_prompts)
    count = max(1, int(minutes * 60 / rate))
    used = {p["prompt"] for p in _read_jsonl(root / "prompts" / "train-prompts.jsonl")}
    for earlier in range(1, number):
        used |= {p["prompt"] for p in _read_jsonl(continuation_dir(root, earlier) / PROMPTS)}
    prompts = next_prompts(demo.seed, demo.general_share, used, count)
    directory.mkdir(parents=True, exist_ok=True)
    write_text_atomic(directory / PROMPTS, "".join(json.dumps(p) + "\n" for p in prompts))
    plan = {"continuation": number, "minutes": minutes, "prompts": count, "seconds_per_prompt": round(rate, 3),
            "measured_in": str(previous)}
    write_json_atomic(directory / PLAN, plan)
    return plan


def _stage_configs(directory: Path, regenerate: RegenerateConfig, prepare: PrepareConfig, extract: ExtractConfig,
                   train: TrainConfig, init: Path) -> tuple[RegenerateConfig, PrepareConfig, ExtractConfig, TrainConfig]:
    """Return the demo's regenerate, prepare, extract and train sections moved to `directory`'s data, with
    the draft's own vocabulary and `init` as the warm start."""
    from eyas.data.regenerate import CONVERSATIONS

    return (regenerate.model_copy(update={"prompts": directory / PROMPTS, "out": directory / "regenerated"}),
            prepare.model_copy(update={"data": [directory / "regenerated" / CONVERSATIONS], "out": directory / "dataset",
                                       "draft_vocab_size": None}),
            extract.model_copy(update={"data": directory / "dataset", "out": directory / "features"}),
            train.model_copy(update={"features": directory / "features", "out": directory / "train", "init": init,
                                     "init_layer": None, "overwrite": False}))


def _held_out_taus(evaluation: EvalConfig, chat_prompts: Path, drafts: dict[str, Path], chain: int) -> dict[str, Any]:
    """Return, per draft name, the pooled replayed chain tau on both held-out sets (the target's
    continuations computed once, in the eval section's dtype)."""
    import torch

    from eyas.data.prompts import eos_ids
    from eyas.decode.prompts import read_prompts
    from eyas.decode.replay import greedy_continuations, pooled_chain_tau
    from eyas.draft.model import load_draft
    from eyas.models.load import DTYPES, load_target, resolve_device
    from eyas.models.tokenizer import load_tokenizer
    from eyas.precision import choose_dtype

    device = resolve_device(evaluation.device)
    dtype = DTYPES[choose_dtype(evaluation.dtype, device).dtype]
    tokenizer = load_tokenizer(evaluation.target, evaluation.trust_remote_code)
    parts = load_target(evaluation.target, dtype, device, evaluation.trust_remote_code)
    eos = eos_ids(parts.model, tokenizer)
    loaded = {name: load_draft(path, parts.embed.weight.detach()).to(dtype).eval() for name, path in drafts.items()}
    aux_ids = next(iter(loaded.values())).config.aux_layer_ids
    figures: dict[str, Any] = {name: {} for name in drafts}
    for set_name, path in (("humaneval", evaluation.prompts), ("chat", chat_prompts)):
        with torch.inference_mode():
            continuations = greedy_continuations(parts, read_prompts(path, tokenizer, evaluation.limit),
                                                 evaluation.max_new_tokens, aux_ids)
            for name, draft in loaded.items():
                figures[name][set_name] = pooled_chain_tau(draft, continuations, chain, eos)
    return figures


def run_continuation(config_file: Path, minutes: float) -> dict[str, Any]:
    """Run (or resume) the demo's next continuation, sized for `minutes`; return its record.

    Refuses a demo whose training has not finished and `minutes` that are not positive.
    """
    from eyas.data.prepare import run_prepare
    from eyas.data.regenerate import run_regenerate
    from eyas.demo.prompts import CHAT_PROMPTS
    from eyas.demo.run import demo_root, stage_sections
    from eyas.features.extract import run_extract
    from eyas.precision import machine_record
    from eyas.train.loop import run_train
    from eyas.train.plot import trained_figures

    if minutes <= 0:
        raise EyasError(f"--continue: {minutes}: minutes must be positive")
    demo, root, evaluation = demo_root(config_file)
    sections = stage_sections(config_file, demo, root)
    regenerate, prepare, extract, train = (sections[name] for name in SIZED_STAGES)
    if not (train.out / "final").is_dir():
        raise EyasError(f"{train.out / 'final'}: the demo's draft is not trained yet; run `python -m eyas.demo "
                        f"{config_file} --until train` first")
    records = read_records(root)
    number = len(records) + 1
    directory = continuation_dir(root, number)
    init = train.out / "final" if number == 1 else continuation_dir(root, number - 1) / "train" / "final"
    plan = _plan(demo, root, number, minutes)
    configs = _stage_configs(directory, regenerate, prepare, extract, train, init)  # type: ignore[arg-type]
    clock = StageClock(directory / STAGE_SECONDS, f"eyas demo: continuation {number}")
    for name, run, config in zip(SIZED_STAGES, (run_regenerate, run_prepare, run_extract, run_train), configs):
        clock.timed(name, lambda run=run, config=config: run(config))
    final = directory / "train" / "final"
    chain = demo.chain or DEFAULT_CHAIN
    taus = clock.timed("held-out tau", lambda: _held_out_taus(
        evaluation, root / "prompts" / CHAT_PROMPTS, {"previous": init, "draft": final}, chain))
    tokens = trained_figures(directory / "train")[0]
    before = records[-1]["training_tokens_all"] if records else trained_figures(train.out)[0]
    record = {**plan, "training_tokens": tokens, "training_tokens_all": before + tokens, "chain": chain,
              "held_out_prompts": evaluation.limit, "max_new_tokens": evaluation.max_new_tokens,
              "tau": taus["draft"], "tau_previous_draft": taus["previous"],
              "seconds": {name: round(s, 1) for name, s in clock.all_runs.items()}, **machine_record()}
    report = root / "report"
    report.mkdir(parents=True, exist_ok=True)
    write_text_atomic(report / RECORDS, "".join(json.dumps(r) + "\n" for r in [*records, record]))
    print(f"eyas demo: continuation {number}: {plan['prompts']} new prompts ({minutes:g} min at "
          f"{plan['seconds_per_prompt']:.1f} s/prompt), {tokens:,} training tokens ({before + tokens:,} in all); "
          f"chain-{chain} tau HumanEval {taus['previous']['humaneval']['tau']:.3f} -> {taus['draft']['humaneval']['tau']:.3f}, "
          f"chat {taus['previous']['chat']['tau']:.3f} -> {taus['draft']['chat']['tau']:.3f}", file=sys.stderr)
    return record
