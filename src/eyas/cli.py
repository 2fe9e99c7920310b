"""The `eyas` command: parse flags, load the stage config, call the stage, report.

Kept thin and light: stage modules (and torch/transformers) are imported only inside the
command that needs them, so `eyas --help` stays fast.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Annotated, Optional

import typer

from eyas import __version__
from eyas.cli_options import config_command
from eyas.config import (
    CheckDraftConfig, EvalConfig, ExportConfig, ExtractConfig, ImportConfig, PrepareConfig, RegenerateConfig, TrainConfig,
)
from eyas.errors import EyasError

EXIT_CODES = ("Exit codes: 0 ok; 1 a check found problems (verify, audit, preflight, check-draft, a stage's own "
              "preflight); 2 bad input or usage; 3 this environment cannot run it (missing engine or package, no "
              "such device). docs/cli.md")

app = typer.Typer(
    name="eyas",
    epilog=EXIT_CODES,
    help="Train EAGLE-3 draft models for speculative decoding, and check engine APIs before the expensive step.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help wraps descriptions; rich's tables cut flag names at 80 columns
    context_settings={"help_option_names": ["-h", "--help"]},
)



def _version(value: bool) -> None:
    if value:
        typer.echo(f"eyas {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    """eyas: EAGLE-3 draft training and engine-API preflight."""


def _prepare(config: PrepareConfig) -> None:
    from eyas.data.prepare import run_prepare
    from eyas.reports import print_prepare_summary

    manifest, reused = run_prepare(config)
    print_prepare_summary(config.out, manifest, reused)


def _regenerate(config: RegenerateConfig) -> None:
    from eyas.data.regenerate import run_regenerate

    result = run_regenerate(config)
    verb = "answered" if result.mode == "chat" else "continued (raw text)"
    print(f"eyas regenerate -> {result.file}: {result.prompts} prompts {verb}"
          + (" (already done; reused)" if result.reused else f", {result.new_tokens:,} new tokens")
          + (f"; {result.rejected} bad record(s) listed in rejected.jsonl" if result.rejected else ""))


def _extract(config: ExtractConfig) -> None:
    from eyas.features.extract import run_extract
    from eyas.reports import print_extract_summary

    manifest, reused = run_extract(config)
    print_extract_summary(config.out, manifest, reused)


def _preflight_extract(config: ExtractConfig) -> None:
    from eyas.features.preflight import preflight_extract
    from eyas.reports import print_preflight

    plan = preflight_extract(config)
    print_preflight(plan.facts, plan.problems)
    if plan.problems:
        raise typer.Exit(1)


def _train(config: TrainConfig) -> None:
    from eyas.reports import print_train_summary
    from eyas.train.loop import run_train

    print_train_summary(run_train(config))


def _eval(config: EvalConfig) -> None:
    from eyas.decode.evaluate import run_eval
    from eyas.reports import print_eval_report

    print_eval_report(config.out, run_eval(config))


def _export(config: ExportConfig) -> None:
    from eyas.export.writer import run_export

    print(f"eyas export -> {run_export(config)}")


def _import(config: ImportConfig) -> None:
    from eyas.export.importer import import_draft

    imported = import_draft(config)
    print(f"eyas import -> {config.out} (aux layers {imported.aux_layer_ids}, input convention; "
          f"{imported.num_hidden_layers} layer(s), draft vocab {imported.draft_vocab_size})")


def _check_draft(config: CheckDraftConfig) -> None:
    from eyas.backends.vllm.startup import target_problems, unchecked
    from eyas.export.check import check_draft
    from eyas.reports import print_draft_check

    problems = check_draft(config.draft, config.target, config.engine, config.trust_remote_code, config.chat_template)
    if config.engine == "vllm":  # the target itself: vLLM's class for it must serve EAGLE-3 (docs/vllm.md)
        problems += target_problems(config.target, config.model_impl, config.trust_remote_code)
    print_draft_check(config.draft, config.engine, problems)
    if config.engine == "vllm" and (note := unchecked()):
        print(f"eyas: note: {note}", file=sys.stderr)
    if problems:
        raise typer.Exit(1)


_VERBS = (
    ("prepare", PrepareConfig, _prepare,
     "Tokenize conversations with the target's chat template into a loss-masked Parquet dataset."),
    ("regenerate", RegenerateConfig, _regenerate,
     "Have the target answer prompts (on-policy data), writing conversations for `eyas prepare`."),
    ("extract", ExtractConfig, _extract,
     "Run the target over a prepared dataset and store the EAGLE-3 features (resumable, torchrun-aware)."),
    ("train", TrainConfig, _train,
     "Train an EAGLE-3 draft from a feature store (offline) or with the target in the loop (online)."),
    ("eval", EvalConfig, _eval,
     "Decode prompts with the target alone and speculatively with a draft: tau, acceptance, speedup."),
    ("export", ExportConfig, _export,
     "Write a draft in the checkpoint format vLLM, SGLang or speculators loads (layer ids converted)."),
    ("import", ImportConfig, _import,
     "Read a published EAGLE-3 draft into eyas's draft format, to evaluate or fine-tune it."),
    ("check-draft", CheckDraftConfig, _check_draft,
     "Check a draft against its target for an engine before starting a server; report every problem (exit 1)."),
)
for _verb, _config_class, _work, _doc in _VERBS:
    app.command(_verb)(config_command(_config_class, _verb, _work, _doc))


preflight_app = typer.Typer(help="Check before any weights load: eyas's engine API contract (alone), or a whole stage.",
                            epilog=EXIT_CODES, rich_markup_mode=None)
app.add_typer(preflight_app, name="preflight")


@preflight_app.callback(invoke_without_command=True)
def preflight_engines(context: typer.Context) -> None:
    """Audit eyas's engine-facing modules against the installed engines, vLLM's backend too when vLLM is
    installed (exit 1 on problems)."""
    if context.invoked_subcommand is not None:
        return
    from eyas.audit.contract import engine_api_problems
    from eyas.reports import print_preflight
    from eyas.backends.vllm.contract import installed_vllm, vllm_problems

    problems, facts = engine_api_problems()
    if installed_vllm() is None:
        facts["vLLM"] = "not installed (the vllm extraction backend is unavailable)"
    else:
        vllm, vllm_facts = vllm_problems()
        problems += vllm
        facts.update(vllm_facts)
    print_preflight(facts, problems)
    if problems:
        raise typer.Exit(1)


preflight_app.command("extract")(config_command(
    ExtractConfig, "extract", _preflight_extract,
    "Check an extraction without loading weights: meta-device capture dry run, files, disk (exit 1 on problems)."))


@app.command()
def materialise(
    gguf: Annotated[Path, typer.Argument(help="The .gguf file.")],
    directory: Annotated[Path, typer.Argument(help="A new or empty directory to write.")],
    dtype: Annotated[str, typer.Option(help="dtype of the written weights: float32 (equal to the GGUF's dequantized "
                                            "weights: the same target for datasets, stores and drafts), bfloat16 or "
                                            "float16 (half the size; the same tokenization only).")] = "float32",
) -> None:
    """Write a GGUF target as a Hugging Face model directory (config, tokenizer, chat template, safetensors)
    that vLLM and transformers load; any architecture transformers reads from GGUF (docs/vllm.md)."""
    from eyas.files import read_json_object
    from eyas.models.materialise import materialise_gguf

    if dtype not in ("float32", "bfloat16", "float16"):
        raise EyasError(f"--dtype: {dtype!r}: expected float32, bfloat16 or float16")
    written = materialise_gguf(gguf, directory, dtype)  # type: ignore[arg-type]
    print(f"eyas materialise -> {written} ({', '.join(read_json_object(written / 'config.json').get('architectures', []))}, "
          f"{dtype})")


@app.command()
def verify(store: Annotated[Path, typer.Argument(help="Feature store dir.")]) -> None:
    """Recompute every checksum of a feature store, check it against its manifest and its features for NaN/Inf
    (exit 1 on any problem)."""
    from eyas.features.store import verify_store

    problems = verify_store(store)
    for problem in problems:
        print(f"eyas verify: {problem}", file=sys.stderr)
    if problems:
        raise typer.Exit(1)
    print(f"{store}: ok (every shard checksum and shape matches the manifest; every feature is finite)")


@preflight_app.command("vllm")
def preflight_vllm_command(
    against: Annotated[Optional[str], typer.Option(help="Audit against this vLLM SPEC (e.g. sdist:vllm==0.34.0) instead "
                                                        "of the installed one.")] = None,
    contract: Annotated[bool, typer.Option("--contract", help="List every vLLM name each path uses, then audit.")] = False,
) -> None:
    """Audit the vLLM extraction backend against the installed vLLM (or --against): exit 1 on problems."""
    from eyas.reports import print_preflight, print_vllm_contract
    from eyas.backends.vllm.contract import VLLM_PATHS, contract_uses, vllm_problems

    if contract:
        for path in VLLM_PATHS:
            print_vllm_contract(path, contract_uses(path))
    problems, facts = vllm_problems(against)
    print_preflight(facts, problems)
    if problems:
        raise typer.Exit(1)


@app.command()
def plot(
    run: Annotated[Path, typer.Argument(help="Run dir written by `eyas train`.")],
    out: Annotated[Optional[Path], typer.Option(help="Where the PNGs go (default RUN/plots).")] = None,
) -> None:
    """Write PNG curves of a training run: loss, per-step accuracy, implied acceptance length."""
    from eyas.train.plot import plot_run

    for path in plot_run(run, out):
        print(path)


@app.command()
def audit(
    paths: Annotated[list[Path], typer.Argument(help="Client files or directories to check.")],
    against: Annotated[str, typer.Option(help="Target: installed name, name==version, sdist:name==version (the source "
                                              "distribution, for huge wheels), wheel or source dir.")],
    baseline: Annotated[Optional[str], typer.Option(help="The version the code was written against (same forms).")] = None,
    format: Annotated[str, typer.Option(help="text, json or sarif.")] = "text",
    select: Annotated[Optional[str], typer.Option(help="Only these finding kinds, comma-separated.")] = None,
) -> None:
    """Find every use of a package's API that breaks against another version, before anything runs."""
    from eyas import __version__
    from eyas.audit.report import as_json, as_sarif, as_text
    from eyas.audit.run import run_audit

    if format not in ("text", "json", "sarif"):
        raise EyasError(f"--format: {format!r}: expected text, json or sarif")
    kinds = {k.strip() for k in select.split(",") if k.strip()} if select else None
    result = run_audit(paths, against, baseline, kinds)
    render = {"text": as_text, "json": as_json}.get(format)
    print(render(result.findings, result.summary) if render else as_sarif(result.findings, result.summary, __version__))
    if result.errors:
        raise typer.Exit(1)


for _command in (*app.registered_commands, *preflight_app.registered_commands):
    _command.epilog = EXIT_CODES  # the same exit codes in every verb's --help


class Terminated(BaseException):
    """SIGTERM arrived; raised in the main thread so that every `finally` runs (temporary files go)."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    """The SIGTERM handler: ignore further SIGTERMs while unwinding, and raise `Terminated`."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated


def main() -> None:
    """Entry point: run the app; user errors print one line on stderr and exit 2, SIGTERM stops cleanly (143).

    Ranks started by torchrun keep SIGTERM's default action: torchrun sends it to the ranks left when
    one fails, and a rank blocked in a collective cannot run a Python handler (torchrun would SIGKILL
    it 30 s later); their rerun resumes as after `kill -9`.
    """
    handler = _terminate if os.environ.get("WORLD_SIZE", "1") == "1" else signal.SIG_DFL
    previous = signal.signal(signal.SIGTERM, handler)
    if not sys.stderr.isatty():  # like eyas's own bars (eyas.progress): none in logs and captured output
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        app()
    except EyasError as error:
        print(f"eyas: error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
    except KeyboardInterrupt:
        print("eyas: interrupted; rerun the same command to resume", file=sys.stderr)
        sys.exit(130)
    except Terminated:
        print("eyas: terminated (SIGTERM); rerun the same command to resume", file=sys.stderr)
        sys.exit(128 + signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)  # in-process callers (tests) get theirs back
