"""Every output directory knows whose it is: a stage never claims, overwrites or deletes another stage's
output, a trained draft or a model, with or without `--overwrite`; an `--out` inside an input (or holding
one) is refused before anything is written; an `--out` that cannot be made and a device eyas cannot use are
one line each, with the exit code docs/cli.md gives (probe reliability-2026-12, F1, F2, F6, F11, F15, F19)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eyas.files import sha256_tree

EYAS = str(Path(sys.executable).parent / "eyas")


@pytest.fixture(scope="module")
def outputs(learned: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Copies of the learned pair's dataset, store and training run (a test may try to overwrite them), and a
    vLLM export of its draft (what `eyas import` reads)."""
    from eyas.config import ExportConfig
    from eyas.export.writer import run_export

    root = tmp_path_factory.mktemp("outputs")
    for name, source in (("dataset", learned["store"].parent / "dataset"), ("store", learned["store"]),
                         ("run", learned["run"])):
        shutil.copytree(source, root / name)
    run_export(ExportConfig(draft=root / "run" / "final", format="vllm", out=root / "export"))
    return {**{name: root / name for name in ("dataset", "store", "run", "export")}, "target": learned["target"],
            "conversations": learned["store"].parent / "conversations.jsonl"}


def one_line_error(result, code: int, *phrases: str) -> None:  # noqa: ANN001 - conftest's CliResult
    assert result.code == code, result
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("eyas: error: "), result.err
    assert all(phrase in lines[0] for phrase in phrases), lines[0]


@pytest.mark.parametrize("overwrite", [(), ("--overwrite",)], ids=["plain", "overwrite"])
def test_export_and_import_never_replace_a_trained_draft(outputs: dict[str, Path], run_cli, overwrite) -> None:
    """F1: `final/` and `best/` hold config.json and model.safetensors, the names an export writes."""
    run = outputs["run"]
    before = {part: sha256_tree(run / part) for part in ("final", "best")}
    in_place = run_cli("export", "--draft", run / "final", "--format", "vllm", "--dtype", "bfloat16",
                       "--out", run / "final", *overwrite)
    one_line_error(in_place, 2, f"{run / 'final'}: is the input --draft itself")
    into_best = run_cli("export", "--draft", run / "final", "--format", "vllm", "--out", run / "best", *overwrite)
    one_line_error(into_best, 2, f"{run / 'best'}: holds model files (config.json, model.safetensors)",
                   "never replaces it, with or without --overwrite")
    imported = run_cli("import", outputs["export"], "--out", run / "best", *overwrite)
    one_line_error(imported, 2, "holds model files", "`eyas import` never replaces it")
    assert {part: sha256_tree(run / part) for part in ("final", "best")} == before


@pytest.mark.parametrize("overwrite", [(), ("--overwrite",)], ids=["plain", "overwrite"])
def test_another_stages_output_is_refused_by_its_name(outputs: dict[str, Path], run_cli, overwrite) -> None:
    """F2: the refusal names the stage that wrote the directory, and `--overwrite` does not make it ours."""
    target, dataset, store, run = (outputs[name] for name in ("target", "dataset", "store", "run"))
    before = {path: sha256_tree(path) for path in (dataset, store, run, outputs["export"])}
    cases = [
        (("prepare", "--target", target, "--data", outputs["conversations"], "--out", store), store, "extract"),
        (("extract", "--target", target, "--data", dataset, "--out", run), run, "train"),
        (("train", "--features", store, "--data", dataset, "--out", outputs["export"]), outputs["export"], "export"),
        (("extract", "--target", target, "--data", dataset, "--out", outputs["export"]), outputs["export"], "export"),
        (("eval", "--target", target, "--draft", run / "final", "--prompts", outputs["conversations"],
          "--out", store), store, "extract"),
    ]
    for args, out, owner in cases:
        one_line_error(run_cli(*args, *overwrite), 2, f"{out}: holds the output of `eyas {owner}`",
                       f"`eyas {args[0]}` never replaces it")
    assert {path: sha256_tree(path) for path in before} == before


def test_a_finished_output_that_lost_its_run_record_is_nobodys(outputs: dict[str, Path], run_cli,
                                                              tmp_path: Path) -> None:
    """A feature store copied without its run.json: its manifest names another run, so nothing claims it."""
    store = tmp_path / "store"
    shutil.copytree(outputs["store"], store)
    (store / "run.json").unlink()
    before = sha256_tree(store)
    result = run_cli("prepare", "--target", outputs["target"], "--data", outputs["conversations"],
                     "--out", store, "--overwrite")
    one_line_error(result, 2, "a finished eyas output whose run.json is gone")
    assert sha256_tree(store) == before


def test_an_out_inside_an_input_or_holding_one_is_refused_before_writing(outputs: dict[str, Path], run_cli,
                                                                        tmp_path: Path) -> None:
    """F6: prepare's own files inside its --data directory would become the next run's inputs."""
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(outputs["conversations"], data / "chat.jsonl")
    for overwrite in ((), ("--overwrite",)):
        result = run_cli("prepare", "--target", outputs["target"], "--data", data, "--out", data / "out", *overwrite)
        one_line_error(result, 2, f"{data / 'out'}: inside the input {data} (--data)")
    assert sorted(p.name for p in data.iterdir()) == ["chat.jsonl"]
    run = outputs["run"]
    before = sha256_tree(run)
    result = run_cli("train", "--features", outputs["store"], "--data", outputs["dataset"], "--init", run / "final",
                     "--out", run, "--overwrite")
    one_line_error(result, 2, f"{run}: holds the input {run / 'final'} (--init)")
    assert sha256_tree(run) == before


def _without_root_privileges() -> list[str]:
    """The command prefix that drops root's power to write anywhere (empty for another user)."""
    if os.geteuid() != 0:
        return []
    assert shutil.which("setpriv"), "setpriv (util-linux) drops root's file permissions bypass for this test"
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]


def test_an_out_that_cannot_be_made_is_one_line(outputs: dict[str, Path], tmp_path: Path) -> None:
    """F11: an --out whose parent is not writable."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    command = [*_without_root_privileges(), EYAS, "train", "--features", str(outputs["store"]), "--data",
               str(outputs["dataset"]), "--out", str(locked / "run"), "--max-steps", "1", "--device", "cpu"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result
    assert result.stderr.strip() == (f"eyas: error: {locked / 'run'}: cannot make the output directory "
                                     "(Permission denied); use another --out")


@pytest.mark.parametrize("verb", ["train", "extract", "eval"])
@pytest.mark.parametrize("device", ["gpu", "tpu", "mps", "cuda:x"])
def test_a_device_eyas_does_not_run_on_is_bad_usage(outputs: dict[str, Path], run_cli, tmp_path: Path, verb: str,
                                                    device: str) -> None:
    """F15: the usual typo `--device gpu` (and devices eyas never runs on) is exit 2, naming the field."""
    args = {"train": ("--features", outputs["store"], "--data", outputs["dataset"]),
            "extract": ("--target", outputs["target"], "--data", outputs["dataset"]),
            "eval": ("--target", outputs["target"], "--draft", outputs["run"] / "final", "--prompts",
                     outputs["conversations"])}[verb]
    result = run_cli(verb, *args, "--out", tmp_path / "out", "--device", device)
    one_line_error(result, 2, f"{verb}.device: {device!r}: not a device eyas runs on")
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for CUDA on a machine without it")
@pytest.mark.parametrize("verb", ["train", "extract"])
def test_cuda_on_a_machine_without_it_is_exit_3_for_every_stage(outputs: dict[str, Path], run_cli, tmp_path: Path,
                                                               verb: str) -> None:
    """F19: train said 3, extract 1 (a preflight finding) for the same missing CUDA."""
    args = {"train": ("--features", outputs["store"], "--data", outputs["dataset"]),
            "extract": ("--target", outputs["target"], "--data", outputs["dataset"])}[verb]
    result = run_cli(verb, *args, "--out", tmp_path / "out", "--device", "cuda")
    one_line_error(result, 3, "--device: cuda asked for, but torch sees no CUDA device")
