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


preflight_app = typer.Typer(help="Check before any weights load: eyas's engine API contract (alone), or a whole stage.")
app.add_typer(preflight_app, name="preflight")


@preflight_app.callback(invoke_without_command=True)
def preflight_engines(context: typer.Context) -> None:
    """Audit eyas's engine-facing modules against the installed engines, vLLM's backend too when vLLM is
    installed (exit 1 on problems)."""
    if context.invoked_subcommand is not None:
        return
    from eyas.audit.contract import engine_api_problems
    from eyas.reports import print_preflight
    from eyas.target.vllm.contract import installed_vllm, vllm_problems

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


def _extract_flags(target: Optional[Path], data: Optional[Path], out: Optional[Path], layers: Optional[str],
                   layer_convention: Optional[str], storage_dtype: Optional[str], dtype: Optional[str],
                   device: Optional[str], backend: Optional[str] = None,
                   tensor_parallel_size: Optional[int] = None) -> dict[str, object]:
    parsed_layers = None
    if layers is not None:
        try:
            parsed_layers = [int(part) for part in layers.split(",") if part.strip()]
        except ValueError:
            raise EyasError(f"--layers {layers!r}: expected comma-separated integers, e.g. 2,16,29") from None
    return {"target": target, "data": data, "out": out, "layers": parsed_layers, "layer_convention": layer_convention,
            "storage_dtype": storage_dtype, "dtype": dtype, "device": device, "backend": backend,
            "tensor_parallel_size": tensor_parallel_size}


TargetOption = Annotated[Optional[Path], typer.Option(help="Local Hugging Face model dir.")]
DatasetOption = Annotated[Optional[Path], typer.Option(help="Dataset dir written by `eyas prepare`.")]
StoreOutOption = Annotated[Optional[Path], typer.Option(help="Feature store dir to write.")]
LayersOption = Annotated[Optional[str], typer.Option(help="Aux layer ids, e.g. 2,16,29 (needs --layer-convention).")]
ConventionOption = Annotated[Optional[str], typer.Option(help="input (EAGLE/vLLM: input of layer k) or output (SGLang).")]
StorageOption = Annotated[Optional[str], typer.Option(help="bf16 (default), fp8 (e4m3, per-token scales) or fp32.")]
DtypeOption = Annotated[Optional[str], typer.Option(help="Dtype the target runs in: auto (default: bfloat16 where the device computes it natively, else float32), bfloat16, float16, float32.")]
DeviceOption = Annotated[Optional[str], typer.Option(help="cpu, cuda, cuda:N or auto (spread over GPUs).")]
BackendOption = Annotated[Optional[str], typer.Option(help="hf (transformers, default) or vllm (CUDA; docs/extract.md).")]
TensorParallelOption = Annotated[Optional[int], typer.Option(help="vllm backend: GPUs to shard the target over.")]


@app.command()
def extract(
    target: TargetOption = None, data: DatasetOption = None, out: StoreOutOption = None, layers: LayersOption = None,
    layer_convention: ConventionOption = None, storage_dtype: StorageOption = None, dtype: DtypeOption = None,
    device: DeviceOption = None, backend: BackendOption = None, tensor_parallel_size: TensorParallelOption = None,
    token_budget: Annotated[Optional[int], typer.Option(help="Padded tokens per forward batch.")] = None,
    overwrite: Annotated[Optional[bool], typer.Option("--overwrite", help="Replace a different store in --out.")] = None,
    no_preflight: Annotated[bool, typer.Option("--no-preflight", help="Skip the weightless preflight.")] = False,
    config: ConfigOption = None,
    overrides: Overrides = None,
) -> None:
    """Run the target over a prepared dataset and store the EAGLE-3 features (resumable, torchrun-aware)."""
    from eyas.config import ExtractConfig, load_stage_config
    from eyas.features.extract import run_extract
    from eyas.reports import print_extract_summary

    flags = _extract_flags(target, data, out, layers, layer_convention, storage_dtype, dtype, device, backend,
                           tensor_parallel_size)
    flags.update({"token_budget": token_budget, "overwrite": overwrite, "preflight": False if no_preflight else None})
    stage_config = load_stage_config(ExtractConfig, "extract", config, flags, overrides)
    manifest, reused = run_extract(stage_config)
    print_extract_summary(stage_config.out, manifest, reused)


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
    from eyas.target.vllm.contract import VLLM_PATHS, contract_uses, vllm_problems

    if contract:
        for path in VLLM_PATHS:
            print_vllm_contract(path, contract_uses(path))
    problems, facts = vllm_problems(against)
    print_preflight(facts, problems)
    if problems:
        raise typer.Exit(1)


@preflight_app.command("extract")
def preflight_extract_command(
    target: TargetOption = None, data: DatasetOption = None, out: StoreOutOption = None, layers: LayersOption = None,
    layer_convention: ConventionOption = None, storage_dtype: StorageOption = None, dtype: DtypeOption = None,
    device: DeviceOption = None, backend: BackendOption = None, tensor_parallel_size: TensorParallelOption = None,
    config: ConfigOption = None, overrides: Overrides = None,
) -> None:
    """Check an extraction without loading weights: meta-device capture dry run, files, disk (exit 1 on problems)."""
    from eyas.config import ExtractConfig, load_stage_config
    from eyas.features.preflight import preflight_extract
    from eyas.reports import print_preflight

    flags = _extract_flags(target, data, out, layers, layer_convention, storage_dtype, dtype, device, backend,
                           tensor_parallel_size)
    plan = preflight_extract(load_stage_config(ExtractConfig, "extract", config, flags, overrides))
    print_preflight(plan.facts, plan.problems)
    if plan.problems:
        raise typer.Exit(1)


@app.command()
def train(
    target: Annotated[Optional[Path], typer.Option(help="Target model dir or GGUF (offline default: the store's).")] = None,
    features: Annotated[Optional[Path], typer.Option(help="Feature store from `eyas extract` (offline).")] = None,
    data: Annotated[Optional[Path], typer.Option(help="Dataset from `eyas prepare` (online; offline: its vocab).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Run dir: checkpoints, metrics.jsonl, final/.")] = None,
    init: Annotated[Optional[Path], typer.Option(help="Warm start from this eyas draft dir (keeps its d2t/t2d).")] = None,
    draft_vocab_size: Annotated[Optional[int], typer.Option(help="Draft vocab size (default: the dataset's).")] = None,
    num_layers: Annotated[Optional[int], typer.Option(help="Draft decoder layers (default 1).")] = None,
    ttt_steps: Annotated[Optional[int], typer.Option(help="Training-time-test unroll length (default 7).")] = None,
    max_steps: Annotated[Optional[int], typer.Option(help="Optimizer steps (default: --epochs passes).")] = None,
    epochs: Annotated[Optional[int], typer.Option(help="Passes over the training split (default 1).")] = None,
    lr: Annotated[Optional[float], typer.Option(help="Peak learning rate (default 1e-4).")] = None,
    grad_accum: Annotated[Optional[int], typer.Option(help="Micro-batches per optimizer step and rank.")] = None,
    token_budget: Annotated[Optional[int], typer.Option(help="Padded tokens per micro-batch.")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed: init, data order, held-out split.")] = None,
    layers: LayersOption = None, layer_convention: ConventionOption = None, device: DeviceOption = None,
    resume: Annotated[Optional[bool], typer.Option("--resume", help="Require a checkpoint in --out to continue.")] = None,
    overwrite: Annotated[Optional[bool], typer.Option("--overwrite", help="Replace another run in --out.")] = None,
    fsdp: Annotated[Optional[bool], typer.Option("--fsdp", help="Under torchrun: shard the draft (FSDP2).")] = None,
    no_preflight: Annotated[bool, typer.Option("--no-preflight", help="Online: skip the engine API preflight.")] = False,
    config: ConfigOption = None,
    overrides: Overrides = None,
) -> None:
    """Train an EAGLE-3 draft from a feature store (offline) or with the target in the loop (online)."""
    from eyas.config import TrainConfig, load_stage_config
    from eyas.reports import print_train_summary
    from eyas.train.loop import run_train

    flags = _extract_flags(target, data, out, layers, layer_convention, None, None, device)
    flags.update({"features": features, "init": init, "draft_vocab_size": draft_vocab_size, "num_layers": num_layers,
                  "ttt_steps": ttt_steps, "max_steps": max_steps, "epochs": epochs, "lr": lr, "grad_accum": grad_accum,
                  "token_budget": token_budget, "seed": seed, "resume": resume, "overwrite": overwrite,
                  "fsdp": fsdp, "preflight": False if no_preflight else None})
    result = run_train(load_stage_config(TrainConfig, "train", config, flags, overrides))
    print_train_summary(result)


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
def regenerate(
    target: TargetOption = None,
    prompts: Annotated[Optional[Path], typer.Option(help="JSONL of prompts, or a dataset dir (its prompts-*.jsonl).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Directory for conversations.jsonl.")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(help="Answer length at most (default 512).")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="Sampling temperature (default 0.7; 0: greedy).")] = None,
    token_budget: Annotated[Optional[int], typer.Option(help="Tokens per batch, prompts + answers.")] = None,
    limit: Annotated[Optional[int], typer.Option(help="Only the first N prompts.")] = None,
    skip_invalid: Annotated[Optional[bool], typer.Option("--skip-invalid", help="List bad records instead of stopping.")] = None,
    device: DeviceOption = None,
    overwrite: Annotated[Optional[bool], typer.Option("--overwrite", help="Replace another output in --out.")] = None,
    config: ConfigOption = None,
    overrides: Overrides = None,
) -> None:
    """Have the target answer prompts (on-policy data), writing conversations for `eyas prepare`."""
    from eyas.config import RegenerateConfig, load_stage_config
    from eyas.data.regenerate import run_regenerate

    flags = {"target": target, "prompts": prompts, "out": out, "max_new_tokens": max_new_tokens, "temperature": temperature,
             "token_budget": token_budget, "limit": limit, "skip_invalid": skip_invalid, "device": device,
             "overwrite": overwrite}
    result = run_regenerate(load_stage_config(RegenerateConfig, "regenerate", config, flags, overrides))
    print(f"eyas regenerate -> {result.out / 'conversations.jsonl'}: {result.prompts} prompts answered"
          + (" (already done; reused)" if result.reused else f", {result.new_tokens:,} new tokens")
          + (f"; {result.rejected} bad record(s) listed in rejected.jsonl" if result.rejected else ""))


@app.command("eval")
def eval_(
    target: Annotated[Optional[Path], typer.Option(help="Target model dir or GGUF the draft was trained for.")] = None,
    draft: Annotated[Optional[Path], typer.Option(help="Draft dir (`eyas train`'s final/ or best/).")] = None,
    prompts: Annotated[Optional[Path], typer.Option(help='JSONL of {"prompt": ...}, {"messages": [...]} or {"text": ...}.')] = None,
    out: Annotated[Optional[Path], typer.Option(help="Report dir: report.json, acceptance.png, results.jsonl.")] = None,
    chain: Annotated[Optional[int], typer.Option(help="Draft a chain of K tokens.")] = None,
    tree: Annotated[Optional[str], typer.Option(help="Dynamic tree DEPTH,TOPK,TOTAL (default 5,4,16).")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="0 (default): greedy, lossless.")] = None,
    top_p: Annotated[Optional[float], typer.Option(help="Nucleus sampling mass.")] = None,
    top_k: Annotated[Optional[int], typer.Option(help="Sample among the k most likely tokens.")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(help="New tokens per prompt (default 128).")] = None,
    limit: Annotated[Optional[int], typer.Option(help="Only the first N prompts.")] = None,
    prompt_lookup: Annotated[Optional[int], typer.Option(help="Also time transformers' prompt lookup with N tokens.")] = None,
    device: DeviceOption = None,
    overwrite: Annotated[Optional[bool], typer.Option("--overwrite", help="Replace another report in --out.")] = None,
    config: ConfigOption = None,
    overrides: Overrides = None,
) -> None:
    """Decode prompts with the target alone and speculatively with a draft: tau, acceptance, speedup."""
    from eyas.config import EvalConfig, load_stage_config
    from eyas.decode.evaluate import run_eval
    from eyas.reports import print_eval_report

    flags = {"target": target, "draft": draft, "prompts": prompts, "out": out, "chain": chain, "tree": tree,
             "temperature": temperature, "top_p": top_p, "top_k": top_k, "max_new_tokens": max_new_tokens,
             "limit": limit, "prompt_lookup": prompt_lookup, "device": device, "overwrite": overwrite}
    eval_config = load_stage_config(EvalConfig, "eval", config, flags, overrides)
    print_eval_report(eval_config.out, run_eval(eval_config))


@app.command()
def export(
    draft: Annotated[Optional[Path], typer.Option(help="eyas draft dir (`eyas train`'s final/ or best/).")] = None,
    format: Annotated[Optional[str], typer.Option(help="vllm, sglang or speculators.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Directory for config.json + model.safetensors.")] = None,
    target: Annotated[Optional[Path], typer.Option(help="The target (for --with-embedding, speculators verifier).")] = None,
    with_embedding: Annotated[Optional[bool], typer.Option("--with-embedding", help="Also write the target's embedding.")] = None,
    dtype: Annotated[Optional[str], typer.Option(help="bfloat16, float16 or float32 (default: as saved).")] = None,
    overwrite: Annotated[Optional[bool], typer.Option("--overwrite", help="Replace another export in --out.")] = None,
    config: ConfigOption = None,
    overrides: Overrides = None,
) -> None:
    """Write a draft in the checkpoint format vLLM, SGLang or speculators loads (layer ids converted)."""
    from eyas.config import ExportConfig, load_stage_config
    from eyas.export.writer import run_export

    flags = {"draft": draft, "format": format, "out": out, "target": target, "with_embedding": with_embedding,
             "dtype": dtype, "overwrite": overwrite}
    print(f"eyas export -> {run_export(load_stage_config(ExportConfig, 'export', config, flags, overrides))}")


@app.command("import")
def import_(
    path: Annotated[Path, typer.Argument(help="Published draft dir (EAGLE-3 HF format, SpecForge, ModelOpt, speculators).")],
    out: Annotated[Path, typer.Option(help="eyas draft dir to write.")],
    target: Annotated[Optional[Path], typer.Option(help="Target: default layer ids, fingerprint, size checks.")] = None,
    layer_convention: Annotated[Optional[str], typer.Option(help="input (vLLM-made) or output (SGLang/SpecForge/ModelOpt-made).")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace what is in --out.")] = False,
) -> None:
    """Read a published EAGLE-3 draft into eyas's draft format, to evaluate or fine-tune it."""
    from eyas.export.importer import import_draft

    if layer_convention not in (None, "input", "output"):
        raise EyasError(f"--layer-convention: {layer_convention!r}: expected input or output")
    imported = import_draft(path, out, target, layer_convention, overwrite)  # type: ignore[arg-type]
    print(f"eyas import -> {out} (aux layers {imported.aux_layer_ids}, input convention; "
          f"{imported.num_hidden_layers} layer(s), draft vocab {imported.draft_vocab_size})")


@app.command("check-draft")
def check_draft_(
    path: Annotated[Path, typer.Argument(help="Draft dir as an engine will load it.")],
    target: Annotated[Path, typer.Option(help="The target the engine will serve.")],
    engine: Annotated[str, typer.Option(help="vllm or sglang.")],
) -> None:
    """Check a draft against its target for an engine before starting a server; report every problem."""
    from eyas.export.check import check_draft
    from eyas.reports import print_draft_check

    if engine not in ("vllm", "sglang"):
        raise EyasError(f"--engine: {engine!r}: expected vllm or sglang")
    problems = check_draft(path, target, engine)  # type: ignore[arg-type]
    print_draft_check(path, engine, problems)
    if problems:
        raise typer.Exit(1)


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
