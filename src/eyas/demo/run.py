"""The whole job on the embedded target, one command: prompts -> regenerate -> prepare -> extract ->
train -> eval -> export, each stage from its section of one YAML file (docs/demo.md).

Every stage reuses what a previous run finished (each has its own run key and resume), so a second
`make demo` re-prints the report in seconds. The report (report.json, acceptance.png; the tree
evaluation's in tree/ when the demo asks for one), the training curves (training/*.png) and the
vLLM export of the draft are gathered in `OUT/report/`, with `stages.json` (this run's seconds per
stage, the CPU capability and torch threads). Where this Python has vLLM (`make setup-vllm`; `make demo`
then runs in `.venv-vllm`), the demo regenerates through vLLM and the evaluation also serves the draft
in vLLM (vLLM's tau, acceptance and speedups, and its ngram proposer's, beside eyas's), all under
`OUT-vllm/`, so a run without vLLM and one with it never claim each other's directories.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import TypeVar

from eyas.config import (
    DemoConfig, EvalConfig, ExportConfig, ExtractConfig, PrepareConfig, RegenerateConfig, StageConfig, TrainConfig,
    load_stage_config,
)
from eyas.errors import CannotRun, EyasError
from eyas.files import write_json_atomic
from eyas.precision import machine_record
from eyas.stage import Stage


def run_demo(config_file: Path) -> Path:
    """Run (or finish, or reuse) the demo of `config_file`; return its report directory."""
    from eyas.data.prepare import run_prepare
    from eyas.data.regenerate import run_regenerate
    from eyas.decode.evaluate import run_eval
    from eyas.demo.prompts import write_prompt_files
    from eyas.export.writer import run_export
    from eyas.features.extract import run_extract
    from eyas.reports import print_eval_report
    from eyas.train.loop import run_train
    from eyas.train.plot import plot_run

    demo = load_stage_config(DemoConfig, "demo", config_file)
    engine = _vllm_engine(demo)
    root = demo.out.with_name(demo.out.name + "-vllm") if engine else demo.out
    report = root / "report"
    timings: dict[str, float] = {}

    def timed(name: str, work):  # noqa: ANN001, ANN202 - a stage call
        started = time.perf_counter()
        print(f"eyas demo: {name} ...", file=sys.stderr)
        result = work()
        timings[name] = time.perf_counter() - started
        return result

    eval_config = rerooted(load_stage_config(EvalConfig, "eval", config_file), demo.out, root)  # once: chain and tree share it
    tree_config = _tree_evaluation(demo, eval_config)
    regenerate, prepare, extract, train, export = (rerooted(load_stage_config(section, name, config_file), demo.out, root)
                                                   for section, name in _SECTIONS)  # each section once
    if engine:
        regenerate = regenerate.model_copy(update={"backend": "vllm"})
        eval_config = eval_config.model_copy(update={"engine": "vllm"})
    inside = {config.out.name for config in (regenerate, prepare, extract, train, export, eval_config, tree_config)
              if config is not None and config.out.parent == root}
    Stage("demo", "an eyas demo", ("prompts", "report"), nested=tuple(sorted(inside))).claim(
        demo.model_copy(update={"out": root}), {})
    timed("prompts", lambda: write_prompt_files(root / "prompts", demo.train_prompts, demo.seed))
    timed("regenerate", lambda: run_regenerate(regenerate))
    timed("prepare", lambda: run_prepare(prepare))
    timed("extract", lambda: run_extract(extract))
    timed("train", lambda: run_train(train))
    result = timed("eval", lambda: run_eval(eval_config))
    evaluations = [(report, eval_config, result)]
    if tree_config is not None:
        evaluations.append((report / "tree", tree_config, timed("eval (tree)", lambda: run_eval(tree_config))))
    timed("export", lambda: run_export(export))
    for directory, config, _ in evaluations:
        directory.mkdir(parents=True, exist_ok=True)
        for name in ("report.json", "acceptance.png"):
            shutil.copy2(config.out / name, directory / name)
    shutil.copytree(export.out, report / f"draft-{export.format}", dirs_exist_ok=True)
    plot_run(train.out, report / "training")
    for directory, _, evaluation in evaluations:
        print_eval_report(directory, evaluation)
    machine = machine_record()
    write_json_atomic(report / "stages.json", {"seconds": timings, **machine})
    print(f"stage seconds (this run; CPU {machine['cpu_capability']}, {machine['torch_threads']} torch threads): "
          + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()), file=sys.stderr)
    return report


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


def _tree_evaluation(demo: DemoConfig, eval_config: EvalConfig) -> EvalConfig | None:
    """Return the eval section redone with `demo.tree` into `OUT-tree` (None without a tree); refuses a malformed tree."""
    from eyas.decode.evaluate import decoding_shape

    if demo.tree is None:
        return None
    tree_config = eval_config.model_copy(update={
        "shape": None, "chain": None, "tree": demo.tree, "prompt_lookup": 0, "engine": "eyas",
        "out": eval_config.out.with_name(eval_config.out.name + "-tree")})
    decoding_shape(tree_config)
    return tree_config


def main(argv: list[str] | None = None) -> None:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1:
        print("usage: python -m eyas.demo CONFIG.yaml", file=sys.stderr)
        sys.exit(2)
    try:
        run_demo(Path(args[0]))
    except EyasError as error:
        print(f"eyas: error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
