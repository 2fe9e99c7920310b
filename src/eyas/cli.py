"""The `eyas` command: parse flags, load the stage config, call the stage, report.

Kept thin and light: stage modules (and torch/transformers) are imported only inside the
command that needs them, so `eyas --help` stays fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from eyas import __version__
from eyas.errors import EyasError

app = typer.Typer(
    name="eyas",
    help="Train EAGLE-3 draft models for speculative decoding, and check engine APIs before the expensive step.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

ConfigOption = Annotated[Optional[Path], typer.Option("--config", "-c", help="YAML file with stage sections.")]
Overrides = Annotated[Optional[list[str]], typer.Argument(help="Dotted overrides, e.g. prepare.max_length=4096.")]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"eyas {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    """eyas: EAGLE-3 draft training and engine-API preflight."""


@app.command()
def prepare(
    target: Annotated[Optional[Path], typer.Option(help="Local Hugging Face model dir (tokenizer + chat template).")] = None,
    data: Annotated[Optional[list[Path]], typer.Option(help="JSON/JSONL file, dir of them, or HF datasets dir; repeatable.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Dataset directory to write.")] = None,
    draft_vocab_size: Annotated[Optional[int], typer.Option(help="Also write vocab.safetensors with this many draft tokens.")] = None,
    max_length: Annotated[Optional[int], typer.Option(help="Truncate samples to this many tokens.")] = None,
    last_turn_only: Annotated[Optional[bool], typer.Option("--last-turn-only/--all-turns", help="Loss on the last assistant turn only.")] = None,
    skip_invalid: Annotated[Optional[bool], typer.Option("--skip-invalid/--strict", help="Skip and count bad records instead of stopping.")] = None,
    overwrite: Annotated[Optional[bool], typer.Option("--overwrite", help="Replace a different dataset already in --out.")] = None,
    config: ConfigOption = None,
    overrides: Overrides = None,
) -> None:
    """Tokenize conversations with the target's chat template into a loss-masked Parquet dataset."""
    from eyas.config import PrepareConfig, load_stage_config
    from eyas.data.prepare import run_prepare
    from eyas.reports import print_prepare_summary

    flags = {"target": target, "data": data, "out": out, "draft_vocab_size": draft_vocab_size, "max_length": max_length,
             "last_turn_only": last_turn_only, "skip_invalid": skip_invalid, "overwrite": overwrite}
    stage_config = load_stage_config(PrepareConfig, "prepare", config, flags, overrides)
    manifest, reused = run_prepare(stage_config)
    print_prepare_summary(stage_config.out, manifest, reused)


def main() -> None:
    """Entry point: run the app; user errors print one line on stderr and exit 2."""
    try:
        app()
    except EyasError as error:
        print(f"eyas: error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
    except KeyboardInterrupt:
        print("eyas: interrupted; rerun the same command to resume", file=sys.stderr)
        sys.exit(130)
