"""Plots of a training run's `metrics.jsonl`: loss, per-TTT-step accuracy and implied acceptance."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eyas.errors import EyasError
from eyas.files import write_atomic

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

METRICS_FILE = "metrics.jsonl"
SPLITS = ("train", "eval")
REQUIRED = ("split", "step", "loss")
DPI = 120
_STEP_KEY = re.compile(r"^(?:loss|acc|cond_acc)_(\d+)$")

Records = dict[str, list[dict[str, Any]]]


def plot_run(run_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """Write `loss.png`, `accuracy.png` and `acceptance.png` for an `eyas train` run.

    Reads `run_dir/metrics.jsonl` and writes the PNGs (atomically) into `out_dir`, by default
    `run_dir/plots/`. Returns their paths in that order.

    Refuses, with an `EyasError` naming the file (and line): a missing metrics.jsonl, a line
    that is not a JSON object, a line without `split`, `step` or `loss` (or with a non-integer
    `step`), and a file with no train or eval lines. A killed run can leave a truncated last
    line with no trailing newline: only that line is skipped; a malformed line anywhere else is
    an error. When a resumed run logged a step twice, its last line wins.
    """
    run_dir = Path(run_dir)
    out_dir = Path(out_dir) if out_dir is not None else run_dir / "plots"
    records = read_metrics(run_dir / METRICS_FILE, run_dir)
    k = _ttt_steps(records)
    figures = {
        "loss.png": _loss_figure(records, k),
        "accuracy.png": _accuracy_figure(records, k),
        "acceptance.png": _acceptance_figure(records),
    }
    paths = []
    for name, fig in figures.items():
        path = out_dir / name
        write_atomic(path, lambda tmp, fig=fig: fig.savefig(tmp, format="png", dpi=DPI))
        paths.append(path)
    return paths


def read_metrics(path: Path, run_dir: Path | None = None) -> Records:
    """Return the train and eval lines of a metrics.jsonl, each split sorted by step.

    Lines of other splits are ignored. Refuses what `plot_run` refuses (see there).
    """
    if not path.is_file():
        raise EyasError(f"{path}: not found; is {run_dir or path.parent} an `eyas train` run directory?")
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    # After a final newline, split() leaves "" last; anything else there is a partial line.
    partial_last = len(lines) - 1 if lines[-1].strip() else None
    by_step: dict[str, dict[int, dict[str, Any]]] = {split: {} for split in SPLITS}
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if lineno - 1 == partial_last:
                continue  # a killed run's truncated last line
            raise EyasError(f"{path}:{lineno}: malformed JSON: {err.msg} (column {err.colno})") from None
        if not isinstance(record, dict):
            raise EyasError(f"{path}:{lineno}: malformed JSON: expected an object, got {type(record).__name__}")
        for field in REQUIRED:
            if field not in record:
                raise EyasError(f"{path}:{lineno}: {field}: missing")
        if not isinstance(record["step"], int) or isinstance(record["step"], bool):
            raise EyasError(f"{path}:{lineno}: step: expected an integer, got {record['step']!r}")
        if record["split"] in by_step:
            by_step[record["split"]][record["step"]] = record
    if not any(by_step.values()):
        raise EyasError(f"{path}: no metrics yet")
    return {split: [steps[s] for s in sorted(steps)] for split, steps in by_step.items()}


def trained_figures(run_dir: Path) -> tuple[int, float | None]:
    """Return the training tokens an `eyas train` run saw (its last train line's cumulative `tokens`) and the
    implied tau of its last eval line (None without one). Refuses what `read_metrics` refuses."""
    records = read_metrics(run_dir / METRICS_FILE, run_dir)
    return int(records["train"][-1]["tokens"]), records["eval"][-1]["implied_tau"] if records["eval"] else None


def _ttt_steps(records: Records) -> int:
    """Return k, the number of TTT steps, from the largest `loss_j` / `acc_j` / `cond_acc_j` key."""
    indices = [int(m.group(1)) for rows in records.values() for row in rows for key in row if (m := _STEP_KEY.match(key))]
    return max(indices) + 1 if indices else 0


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """Return the (step, value) pairs of the rows that have a numeric `key`."""
    steps, values = [], []
    for row in rows:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            steps.append(row["step"])
            values.append(float(value))
    return steps, values


def _new_figure(panels: int = 1) -> tuple[Figure, list[Axes]]:
    """Return an Agg-backed figure (no pyplot, no global backend change) and its axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5 * panels), layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(panels, 1, i + 1) for i in range(panels)]
    return fig, axes


def _finish(ax: Axes, title: str, ylabel: str) -> None:
    """Label an axes; show its legend, or a note when nothing was plotted."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", ncol=2)
    else:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="gray")


def _loss_figure(records: Records, k: int) -> Figure:
    """Weighted train/eval loss, with each TTT step's train loss as a thin line."""
    fig, (ax,) = _new_figure()
    ax.plot(*_series(records["train"], "loss"), color="black", linewidth=2, label="train loss")
    if records["eval"]:
        ax.plot(*_series(records["eval"], "loss"), color="tab:red", linewidth=2, marker="o", label="eval loss")
    for j in range(k):
        steps, values = _series(records["train"], f"loss_{j}")
        if steps:
            ax.plot(steps, values, color=f"C{j % 10}", linewidth=0.8, alpha=0.7, label=f"train loss_{j}")
    _finish(ax, "Loss (weighted objective; thin: per TTT step)", "loss")
    return fig


def _accuracy_figure(records: Records, k: int) -> Figure:
    """acc_j (top) and cond_acc_j (bottom) per TTT step j: train solid, eval dashed."""
    fig, axes = _new_figure(panels=2)
    for ax, prefix, title in (
        (axes[0], "acc", "Top-1 accuracy per TTT step"),
        (axes[1], "cond_acc", "Conditional accuracy per TTT step (given every earlier step correct)"),
    ):
        for j in range(k):
            for split, style in (("train", {"linestyle": "-"}), ("eval", {"linestyle": "--", "marker": "o"})):
                steps, values = _series(records[split], f"{prefix}_{j}")
                if steps:
                    ax.plot(steps, values, color=f"C{j % 10}", label=f"{split} {prefix}_{j}", **style)
        _finish(ax, title, "accuracy")
    return fig


def _acceptance_figure(records: Records) -> Figure:
    """implied_tau (1 + sum_j prod_{i<=j} cond_acc_i) for train and eval."""
    fig, (ax,) = _new_figure()
    for split, style in (("train", {"color": "black"}), ("eval", {"color": "tab:red", "marker": "o"})):
        steps, values = _series(records[split], "implied_tau")
        if steps:
            ax.plot(steps, values, linewidth=1.5, label=f"{split} implied τ", **style)
    _finish(ax, "Implied acceptance length (teacher-forced estimate)", "implied τ (tokens per draft)")
    return fig
