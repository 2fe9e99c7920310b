"""Human-readable summaries printed at the end of each stage (rich tables on stdout)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:  # keeps torch out of `eyas prepare`'s imports
    from eyas.data.dataset import DatasetManifest
    from eyas.decode.divergence import Divergence, DivergenceSummary
    from eyas.decode.report import EvalReport
    from eyas.features.store import StoreManifest
    from eyas.audit.usage import Usage
    from eyas.backends.vllm.contract import VllmPath
    from eyas.train.loop import TrainResult

console = Console()


def print_prepare_summary(out: Path, manifest: DatasetManifest, reused: bool) -> None:
    """Print what `eyas prepare` wrote (or found already finished) in `out`."""
    counts = manifest.counts
    table = Table(title=f"eyas prepare -> {out}" + (" (already prepared; reused)" if reused else ""), show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    for label, key in (("records read", "records"), ("samples written", "rows"), ("prompts kept for regenerate", "prompts"),
                       ("tokens", "tokens"), ("loss-masked tokens", "loss_tokens"), ("truncated", "truncated"),
                       ("dropped (no loss tokens left)", "dropped_no_loss"), ("skipped (invalid)", "skipped")):
        table.add_row(label, f"{counts.get(key, 0):,}")
    if unrendered := counts.get("reasoning_not_rendered", 0):
        table.add_row("reasoning not rendered by the chat template (records; not trained on)", f"{unrendered:,}")
    for reason, count in manifest.skipped.items():
        table.add_row(f"  skipped: {reason}", f"{count:,}")
    if manifest.vocab is not None:
        table.add_row(f"draft vocab ({manifest.vocab.size:,} tokens) coverage", f"{manifest.vocab.coverage:.2%}")
    console.print(table)
    files = [s.data_file for s in manifest.shards if s.data_file] + [s.prompts_file for s in manifest.shards if s.prompts_file]
    extra = ["manifest.json", manifest.token_counts_file, "config.yaml"] + ([manifest.vocab.file] if manifest.vocab else [])
    console.print(f"wrote {len(files)} shard file(s) and {', '.join(extra)} in {out}")
    for example in manifest.skipped_examples[:5]:
        console.print(f"  skipped {example}", highlight=False, soft_wrap=True)


def print_extract_summary(out: Path, manifest: StoreManifest, reused: bool) -> None:
    """Print what `eyas extract` wrote (or found already finished) in `out`."""
    table = Table(title=f"eyas extract -> {out}" + (" (already extracted; reused)" if reused else ""), show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("samples", f"{manifest.samples:,}")
    table.add_row("tokens", f"{manifest.tokens:,}")
    table.add_row("shards", f"{len(manifest.shards):,}")
    table.add_row("bytes written", f"{manifest.bytes / 2**20:,.1f} MiB")
    table.add_row("bytes/token", f"{manifest.bytes_per_token:,.1f} ({manifest.storage_dtype})")
    table.add_row("aux layers (input of layer k)", str(manifest.layer_ids))
    console.print(table)


def print_preflight(facts: dict[str, str], problems: list[str]) -> None:
    """Print a preflight report: what was checked, then every problem (or ok)."""
    for key, value in facts.items():
        console.print(f"[bold]{key}[/bold]: {value}", highlight=False, soft_wrap=True)
    for problem in problems:
        console.print(f"[red]problem[/red]: {problem}", highlight=False, soft_wrap=True)
    console.print("[green]preflight ok[/green]" if not problems else f"[red]{len(problems)} problem(s)[/red]")


def print_vllm_contract(path: VllmPath, uses: list[Usage]) -> None:
    """Print one vLLM path's contract: its release range and every vLLM name, call shape and attribute it uses."""
    table = Table(title=f"vLLM {path.span}: {path.name} ({', '.join(path.modules)})")
    for column in ("use", "vLLM name", "call / attribute", "where"):
        table.add_column(column, overflow="fold")
    called = {(u.target, u.member, u.path, u.line) for u in uses if u.kind == "member_call"}
    for use in uses:
        if use.kind == "member" and (use.target, use.member, use.path, use.line) in called:
            continue
        shape = ""
        if use.call is not None:
            shape = f"({use.call.positional} positional{''.join(', ' + k + '=' for k in use.call.keywords)}" \
                    f"{', **' if use.call.double_star else ''})"
        member = f".{use.member}" if use.member else ""
        table.add_row(use.kind, use.target + member, shape, f"{Path(use.path).name}:{use.line}")
    console.print(table)


def print_train_summary(result: TrainResult) -> None:
    """Print the last training window's and the held-out metrics of a run, per TTT step."""
    title = f"eyas train -> {result.run_dir} ({result.steps} steps" + (", already trained; reused)" if result.reused else ")")
    table = Table(title=title)
    table.add_column("metric", style="bold")
    table.add_column("train (last window)", justify="right")
    table.add_column("held-out", justify="right")
    keys = [k for k in result.final if k.startswith(("acc_", "cond_acc_"))]
    for key in ["loss", *sorted(keys, key=lambda k: (k.startswith("cond"), int(k.rsplit("_", 1)[1]))), "implied_tau"]:
        held = f"{result.eval[key]:.4f}" if result.eval and key in result.eval else "-"
        table.add_row(key, f"{result.final.get(key, float('nan')):.4f}", held)
    console.print(table)
    console.print(f"draft: {result.run_dir / 'final'}  best (by implied tau): {result.run_dir / 'best'}  "
                  f"curves: eyas plot {result.run_dir}")


def print_eval_report(out: Path, report: EvalReport) -> None:
    """Print the evaluation's figures: tau, acceptance per position, token rates and speedups."""
    table = Table(title=f"eyas eval -> {out / 'report.json'} ({report.prompts} prompts, {report.decoding})",
                  show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("tau (pooled, accepted + 1 per target forward)", f"{report.tau:.2f}")
    shares = list(report.per_position_acceptance)
    while report.auto is not None and shares and shares[-1] == 0:  # auto: depths no round reached
        shares.pop()
    for i, share in enumerate(shares, 1):
        table.add_row(f"  accepted at draft position {i}", f"{share:.1%}")
    if report.auto is not None:
        chosen = report.auto
        rounds = sum(chosen.draft_length_counts.values())
        table.add_row("  plain rounds (nothing drafted)", f"{chosen.plain_rounds:,} / {rounds:,}")
        table.add_row("  draft lengths (length: rounds)",
                      ", ".join(f"{k}: {n}" for k, n in chosen.draft_length_counts.items()))
        table.add_row("  lookup lengths (length: rounds)",
                      ", ".join(f"{k}: {n}" for k, n in chosen.lookup_length_counts.items()))
        table.add_row("  accepted from lookup alone",
                      f"{chosen.accepted_from_lookup:,} / {chosen.accepted_tokens:,}")
    table.add_row("target forwards: speculative / target alone", f"{report.target_forwards:,} / "
                  f"{report.baseline_target_forwards:,}")
    table.add_row("tokens/s speculative", f"{report.tokens_per_s:.1f}")
    table.add_row("tokens/s target alone", f"{report.baseline_tokens_per_s:.1f}")
    table.add_row("speedup (median of per-prompt ratios)", report.paired.describe())
    lookup = report.prompt_lookup
    if lookup is not None:
        table.add_row(f"tokens/s prompt lookup ({lookup.num_tokens} tokens, transformers)", f"{lookup.tokens_per_s:.1f}")
        table.add_row("  prompt lookup over the target alone", lookup.paired.describe())
        table.add_row("  speculative over prompt lookup", lookup.vs_lookup.describe())
    if report.timing.reliable:
        table.add_row("timing", "reliable: stalls isolated (if any), the target alone's pace steady")
    else:
        table.add_row("[bold red]timing UNRELIABLE[/bold red]", "; ".join(report.timing.unreliable_because))
    if report.divergences is not None:
        _divergence_rows(table, report.divergences)
    if report.vllm is not None:
        served = report.vllm
        table.add_section()
        table.add_row(f"served by {served.vllm} ({served.dtype}, same prompt ids, batched)", "")
        table.add_row("  tau (vLLM's counters)", f"{served.eagle3.tau:.2f}" + (
            f" ({served.tau_ratio_vllm_to_eyas:.2f}x eyas's)" if served.tau_ratio_vllm_to_eyas else ""))
        for i, share in enumerate(served.eagle3.per_position_acceptance or [], 1):
            table.add_row(f"    accepted at draft position {i}", f"{share:.1%}")
        table.add_row("  tokens/s target alone", f"{served.target_alone.tokens_per_s:.1f}")
        table.add_row(f"  tokens/s EAGLE-3 chain {served.chain}",
                      f"{served.eagle3.tokens_per_s:.1f} ({served.eagle3.speedup:.2f}x)")
        table.add_row(f"  tokens/s ngram ({served.chain} tokens, n-grams <= {served.ngram_lookup_max})",
                      f"{served.ngram.tokens_per_s:.1f} ({served.ngram.speedup:.2f}x)")
        if report.sampling["temperature"] == 0:
            table.add_row("  EAGLE-3 outputs identical to vLLM's target alone",
                          f"{served.eagle3.same_as_target_alone}/{served.prompts}")
    console.print(table)


def _divergence_rows(table: Table, summary: DivergenceSummary) -> None:
    """Add the greedy outputs' comparison with the target alone to `table`: identical, near-ties, bugs."""
    def listed(entries: list[Divergence]) -> str:
        return "; ".join(f"prompt {d.prompt} at token {d.position} (margins {d.margin_alone:.4g} + "
                         f"{d.margin_speculative:.4g} {'<=' if d.margin_alone + d.margin_speculative <= d.bound else '>'} "
                         f"bound {d.bound:.4g}" + ("" if d.verified_top1 else "; the verification's own argmax not committed")
                         + ")" for d in entries)

    table.add_row("outputs identical to the target alone", f"{summary.identical}/{summary.prompts}")
    table.add_row("  near-tie divergences (rounding)",
                  f"{len(summary.near_ties)}" + (f": {listed(summary.near_ties)}" if summary.near_ties else ""))
    if summary.unexplained:
        table.add_row("  [bold red]UNEXPLAINED divergences[/bold red]",
                      f"[bold red]{len(summary.unexplained)}: not rounding, a decoder bug: "
                      f"{listed(summary.unexplained)}[/bold red]")
    else:
        table.add_row("  unexplained divergences", "0")
    if summary.unexamined:
        table.add_row("  differing outputs decoded before divergences were recorded", f"{summary.unexamined}")


def print_draft_check(path: Path, engine: str, problems: list[str]) -> None:
    """Print the result of `eyas check-draft`: every problem on a line of its own, or that there is none."""
    if not problems:
        console.print(f"eyas check-draft {path} ({engine}): no problems found", soft_wrap=True)
        return
    console.print(f"eyas check-draft {path} ({engine}): {len(problems)} problem(s)", soft_wrap=True, style="bold")
    for number, problem in enumerate(problems, 1):
        console.print(f"  {number}. {problem}", soft_wrap=True, markup=False, highlight=False)
