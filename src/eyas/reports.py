"""Human-readable summaries printed at the end of each stage (rich tables on stdout)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from eyas.data.dataset import DatasetManifest

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
