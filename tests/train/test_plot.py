"""`plot_run`: three PNGs from a synthetic metrics.jsonl, and one-line errors for bad input; `trained_figures`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from eyas.errors import EyasError
from eyas.train.plot import plot_run, trained_figures

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
NAMES = ["loss.png", "accuracy.png", "acceptance.png"]
K = 3


def metric_line(split: str, step: int, k: int = K) -> dict:
    """One metrics.jsonl record with plausible, step-dependent values."""
    progress = step / 20
    cond = [min(0.95, 0.3 + 0.5 * progress - 0.1 * j) for j in range(k)]
    acc, prod = [], 1.0
    for c in cond:
        prod *= c
        acc.append(prod)
    tau, prod = 1.0, 1.0
    for c in cond:
        prod *= c
        tau += prod
    line = {"split": split, "step": step, "loss": 3.0 - 2.0 * progress, "implied_tau": tau}
    for j in range(k):
        line[f"loss_{j}"] = 3.0 - 1.5 * progress + 0.3 * j
        line[f"acc_{j}"] = acc[j]
        line[f"cond_acc_{j}"] = cond[j]
    if split == "train":
        line.update(lr=1e-4 * min(1.0, step / 5), tokens=512 * step, tokens_per_s=1000.0 + step, epoch=step // 10)
    else:
        line["loss"] += 0.1
    return line


def write_run(run_dir: Path, train: int = 20, eval_every: int = 5, tail: str = "") -> Path:
    """Write a run dir whose metrics.jsonl has `train` train lines and an eval line every `eval_every` steps."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for step in range(1, train + 1):
        lines.append(metric_line("train", step))
        if eval_every and step % eval_every == 0:
            lines.append(metric_line("eval", step))
    text = "".join(json.dumps(line) + "\n" for line in lines) + tail
    (run_dir / "metrics.jsonl").write_text(text)
    return run_dir


def check_pngs(paths: list[Path], out_dir: Path) -> None:
    assert paths == [out_dir / name for name in NAMES]
    for path in paths:
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC), path
        assert len(data) > 5_000, (path, len(data))
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(NAMES)  # no temporary files left


def test_writes_three_pngs_into_run_plots(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run")  # 20 train lines, 4 eval lines
    check_pngs(plot_run(run_dir), run_dir / "plots")


def test_custom_out_dir(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run")
    out_dir = tmp_path / "elsewhere" / "figs"
    check_pngs(plot_run(run_dir, out_dir), out_dir)
    assert not (run_dir / "plots").exists()


def test_train_lines_only(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", eval_every=0)
    check_pngs(plot_run(run_dir), run_dir / "plots")


def test_truncated_last_line_is_skipped(tmp_path: Path) -> None:
    partial = json.dumps(metric_line("train", 21))[:40]  # a killed run: no trailing newline
    run_dir = write_run(tmp_path / "run", tail=partial)
    check_pngs(plot_run(run_dir), run_dir / "plots")


def test_missing_metrics_file(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    message = f"{path}: not found; is {tmp_path} an `eyas train` run directory?"
    with pytest.raises(EyasError, match=re.escape(message)):
        plot_run(tmp_path)


def test_malformed_line_in_the_middle(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", train=3, eval_every=0)
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[1] = lines[1][:30] + "\n"  # truncated, but followed by a newline and more lines
    path.write_text("".join(lines))
    with pytest.raises(EyasError, match=re.escape(f"{path}:2: malformed JSON: ")):
        plot_run(run_dir)


def test_malformed_last_line_with_newline_is_an_error(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", train=3, eval_every=0, tail="{not json\n")
    path = run_dir / "metrics.jsonl"
    with pytest.raises(EyasError, match=re.escape(f"{path}:4: malformed JSON: ")):
        plot_run(run_dir)


def test_non_object_line(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", train=2, eval_every=0, tail="[1, 2]\n")
    path = run_dir / "metrics.jsonl"
    with pytest.raises(EyasError, match=re.escape(f"{path}:3: malformed JSON: expected an object")):
        plot_run(run_dir)


@pytest.mark.parametrize("field", ["step", "split", "loss"])
def test_missing_required_field(tmp_path: Path, field: str) -> None:
    run_dir = write_run(tmp_path / "run", train=4, eval_every=0)
    path = run_dir / "metrics.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    del lines[2][field]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(EyasError, match=re.escape(f"{path}:3: {field}: missing")):
        plot_run(run_dir)


def test_non_integer_step(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", train=2, eval_every=0, tail='{"split": "train", "step": "3", "loss": 1.0}\n')
    path = run_dir / "metrics.jsonl"
    with pytest.raises(EyasError, match=re.escape(f"{path}:3: step: expected an integer, got '3'")):
        plot_run(run_dir)


@pytest.mark.parametrize(
    "text",
    ["", "\n", json.dumps({"split": "test", "step": 1, "loss": 1.0}) + "\n", '{"split": "train", "st'],
    ids=["empty", "blank", "other-split", "only-a-partial-line"],
)
def test_no_metrics_yet(tmp_path: Path, text: str) -> None:
    (tmp_path / "metrics.jsonl").write_text(text)
    with pytest.raises(EyasError, match=re.escape(f"{tmp_path / 'metrics.jsonl'}: no metrics yet")):
        plot_run(tmp_path)


def test_errors_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"split": "train",\n{"step": 1}\n')
    with pytest.raises(EyasError) as info:
        plot_run(tmp_path)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(f"{tmp_path / 'metrics.jsonl'}:1: malformed JSON: ")


def test_trained_figures_are_the_last_lines_of_each_split(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", train=20, eval_every=5)
    assert trained_figures(run) == (512 * 20, metric_line("eval", 20)["implied_tau"])
    no_eval = write_run(tmp_path / "no-eval", train=7, eval_every=0)
    assert trained_figures(no_eval) == (512 * 7, None)
