"""The whole job on the embedded target, one command: prompts -> regenerate -> prepare -> extract ->
train -> eval -> export, each stage from its section of one YAML file (docs/demo.md).

Every stage reuses what a previous run finished (each has its own run key and resume), so a second
`make demo` re-prints the report in seconds. The evaluation runs on two held-out sets: the eval
section's prompts (HumanEval) and the held-out chat set (`prompts/chat-prompts.jsonl`) with the same
settings; with the auto shape, also the draft alone (`--lookup 0`) on the chat set; with `demo.chain`,
a fixed chain on both sets; with `demo.tree`, a tree on the first. The reports (report.json,
acceptance.png: the eval section's at the top, the others in chat/, chat-draft/, chain/, chat-chain/,
tree/; each with its speedups as medians of per-prompt ratios, whether its timing can be trusted, and every
greedy divergence from the target alone explained as a near-tie or flagged as a bug: docs/eval.md),
`goals.json` (the figures against the demo's goals, docs/demo.md), the training curves
(training/*.png) and the vLLM export of the draft are gathered in `OUT/report/`, with `stages.json`
(this run's seconds per stage, every run's summed, the CPU capability and torch threads). Where this Python has vLLM
(`make setup-vllm`; `make demo` then runs in `.venv-vllm`), the demo regenerates through vLLM and every
chain evaluation also serves the draft in vLLM (vLLM's tau, acceptance and speedups, and its ngram
proposer's, beside eyas's), all under `OUT-vllm/`, so a run without vLLM and one with it never claim
each other's directories.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TypeVar

from eyas.config import (
    DemoConfig, EvalConfig, ExportConfig, ExtractConfig, PrepareConfig, RegenerateConfig, StageConfig, TrainConfig,
    load_stage_config,
)
from eyas.errors import CannotRun, EyasError
from eyas.demo.goals import demo_goals, print_goals
from eyas.demo.prompts import CHAT_PROMPTS
from eyas.demo.timing import STAGE_SECONDS, StageClock
from eyas.files import write_json_atomic
from eyas.precision import machine_record
from eyas.stage import Stage


DATA_STAGES = ("prompts", "regenerate", "prepare", "extract", "train")
CONTINUATION_DIRS = "continue-*"  # continuation.py's, one per continuation


def run_demo(config_file: Path, until: str | None = None) -> Path:
    """Run (or finish, or reuse) the demo of `config_file`, or only its stages up to `until` (one of
    `DATA_STAGES`); return its report directory (written only by a whole run)."""
    from eyas.data.prepare import run_prepare
    from eyas.data.regenerate import run_regenerate
    from eyas.decode.evaluate import run_eval
    from eyas.demo.prompts import write_prompt_files
    from eyas.export.writer import run_export
    from eyas.features.extract import run_extract
    from eyas.reports import print_eval_report
    from eyas.train.loop import run_train
    from eyas.train.plot import plot_run

    demo, root, eval_config = demo_root(config_file)
    report = root / "report"
    evaluations = _evaluations(demo, eval_config, root / "prompts" / CHAT_PROMPTS, root != demo.out)
    sections = stage_sections(config_file, demo, root)
    regenerate, prepare, extract, train, export = (sections[name] for _, name in _SECTIONS)
    inside = {config.out.name for config in (regenerate, prepare, extract, train, export, *evaluations.values())
              if config.out.parent == root}
    Stage("demo", "an eyas demo", ("prompts", "report", STAGE_SECONDS), nested=(*sorted(inside), CONTINUATION_DIRS)).claim(
        demo.model_copy(update={"out": root}), {})
    clock = StageClock(root / STAGE_SECONDS)
    timed = clock.timed
    stages = (("prompts", lambda: write_prompt_files(root / "prompts", demo.train_prompts, demo.seed, demo.general_share)),
              ("regenerate", lambda: run_regenerate(regenerate)), ("prepare", lambda: run_prepare(prepare)),
              ("extract", lambda: run_extract(extract)), ("train", lambda: run_train(train)))
    for name, work in stages:
        timed(name, work)
        if name == until:
            return report
    results = {label: timed(f"eval ({label})" if label else "eval", lambda config=config: run_eval(config))
               for label, config in evaluations.items()}
    timed("export", lambda: run_export(export))
    for label, config in evaluations.items():
        (report / label).mkdir(parents=True, exist_ok=True)
        for name in ("report.json", "acceptance.png"):
            shutil.copy2(config.out / name, report / label / name)
    shutil.copytree(export.out, report / f"draft-{export.format}", dirs_exist_ok=True)
    plot_run(train.out, report / "training")
    for label, evaluation in results.items():
        print_eval_report(report / label, evaluation)
    goals = demo_goals(results)
    write_json_atomic(report / "goals.json", goals)
    print_goals(goals)
    machine = machine_record()
    write_json_atomic(report / "stages.json", {"seconds": clock.this_run, "seconds_all_runs": clock.all_runs, **machine})
    print(f"stage seconds (this run; CPU {machine['cpu_capability']}, {machine['torch_threads']} torch threads): "
          + ", ".join(f"{k} {v:.0f}" for k, v in clock.this_run.items()), file=sys.stderr)
    return report


def demo_root(config_file: Path) -> tuple[DemoConfig, Path, EvalConfig]:
    """Return the demo section of `config_file`, the run's root (`OUT`, or `OUT-vllm` where vLLM runs) and
    the eval section moved under it. Refuses `vllm: on` without vLLM."""
    demo = load_stage_config(DemoConfig, "demo", config_file)
    root = demo.out.with_name(demo.out.name + "-vllm") if _vllm_engine(demo) else demo.out
    return demo, root, rerooted(load_stage_config(EvalConfig, "eval", config_file), demo.out, root)


def stage_sections(config_file: Path, demo: DemoConfig, root: Path) -> dict[str, StageConfig]:
    """Return the demo's stage sections by name, each read once and moved under `root`, regenerate through
    vLLM where the demo runs it."""
    sections: dict[str, StageConfig] = {name: rerooted(load_stage_config(section, name, config_file), demo.out, root)
                                        for section, name in _SECTIONS}
    if root != demo.out:
        sections["regenerate"] = sections["regenerate"].model_copy(update={"backend": "vllm"})
    return sections


def _vllm_engine(demo: DemoConfig) -> bool:
    """Return True when the demo runs vLLM (regenerate and served evaluation); refuses `vllm: on` without vLLM."""
    from eyas.backends.vllm.contract import installed_vllm, not_installed

    if demo.vllm == "off":
        return False
    if installed_vllm() is None:
        if demo.vllm == "on":
            raise CannotRun(not_installed("demo.vllm: on", "make demo runs in .venv-vllm"))
        return False
    return True


Config = TypeVar("Config", bound=StageConfig)


def rerooted(config: Config, old: Path, new: Path) -> Config:
    """Return `config` with every path field under `old` (a path or a list of paths) moved under `new`."""
    if old == new:
        return config

    def moved(value: object) -> object:
        if isinstance(value, Path) and value.is_relative_to(old):
            return new / value.relative_to(old)
        if isinstance(value, list):
            return [moved(item) for item in value]
        return value

    return config.model_copy(update={name: moved(getattr(config, name)) for name in type(config).model_fields})


_SECTIONS = ((RegenerateConfig, "regenerate"), (PrepareConfig, "prepare"), (ExtractConfig, "extract"),
             (TrainConfig, "train"), (ExportConfig, "export"))


def _evaluations(demo: DemoConfig, eval_config: EvalConfig, chat_prompts: Path, engine: bool) -> dict[str, EvalConfig]:
    """Return the demo's evaluation passes by report subdirectory ("": the eval section itself), each
    into its own `OUT-<label>` (module docstring); vLLM serves every chain pass where it is installed.
    Refuses a malformed shape before anything runs."""
    from eyas.decode.evaluate import decoding_shape

    def variant(label: str, **update: object) -> EvalConfig:
        return eval_config.model_copy(update={**update, "out": eval_config.out.with_name(f"{eval_config.out.name}-{label}")})

    passes = {"": eval_config, "chat": variant("chat", prompts=chat_prompts)}
    auto = eval_config.chain is None and eval_config.tree is None
    if auto and eval_config.lookup:
        passes["chat-draft"] = variant("chat-draft", prompts=chat_prompts, lookup=0)
    if demo.chain is not None:
        fixed = {"shape": None, "chain": demo.chain, "tree": None}
        passes["chain"] = variant("chain", **fixed)
        passes["chat-chain"] = variant("chat-chain", prompts=chat_prompts, **fixed)
    if demo.tree is not None:
        passes["tree"] = variant("tree", shape=None, chain=None, tree=demo.tree, prompt_lookup=0)
    for label, config in passes.items():
        passes[label] = config.model_copy(update={"engine": "vllm" if engine and config.chain is not None else "eyas"})
        decoding_shape(passes[label])
    return passes


def main(argv: list[str] | None = None) -> None:
    import argparse

    from eyas.demo.continuation import run_continuation

    parser = argparse.ArgumentParser(prog="python -m eyas.demo", description="the whole job on the embedded target "
                                     "(docs/demo.md)")
    parser.add_argument("config", type=Path, help="the demo YAML (examples/demo/SIZE.yaml)")
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--until", choices=DATA_STAGES, help="stop after this stage")
    choice.add_argument("--continue", dest="minutes", type=float, metavar="MINUTES",
                        help="run the next continuation of a trained demo, sized for MINUTES (docs/demo.md)")
    args = parser.parse_args(argv)
    try:
        if args.minutes is not None:
            run_continuation(args.config, args.minutes)
        else:
            run_demo(args.config, args.until)
    except EyasError as error:
        print(f"eyas: error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
