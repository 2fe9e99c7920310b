"""Shared fixtures: tiny offline targets (built once per session) and an in-process CLI runner."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch

from eyas.testing.learned import build_learned_pair
from eyas.testing.tiny import STYLES, build_tiny_target


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op torch thread for the test (tiny tensors: two threads on two busy cores run several times slower)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny target dir per chat style, plus "notemplate" (a tokenizer without a chat template)."""
    root = tmp_path_factory.mktemp("targets")
    targets = {style: build_tiny_target(root / style, style) for style in STYLES}
    targets["notemplate"] = build_tiny_target(root / "notemplate", "chatml", with_template=False)
    return targets


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Return the p-value of observed `counts [V]` against `probs [V]` (Pearson's chi-square).

    Cells of expected count below 5 are merged, smallest first, until each has at least 5; a
    count in a cell of probability 0 gives 0 (impossible under the hypothesis).
    """
    import torch

    counts, probs = counts.double(), probs.double()
    expected = probs / probs.sum() * counts.sum()
    if bool((counts[expected == 0] > 0).any()):
        return 0.0
    cells: list[tuple[float, float]] = []  # (expected, observed)
    pool_e = pool_o = 0.0
    for i in expected.argsort().tolist():
        if float(expected[i]) == 0:
            continue
        pool_e, pool_o = pool_e + float(expected[i]), pool_o + float(counts[i])
        if pool_e >= 5:
            cells.append((pool_e, pool_o))
            pool_e = pool_o = 0.0
    if pool_e > 0:  # a remainder below 5 joins the last (largest) cell
        if not cells:
            return 1.0
        last_e, last_o = cells.pop()
        cells.append((last_e + pool_e, last_o + pool_o))
    df = len(cells) - 1
    if df < 1:
        return 1.0
    chi2 = sum((o - e) ** 2 / e for e, o in cells)
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(chi2 / 2, dtype=torch.float64)))


@pytest.fixture(scope="session")
def learned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`target`, `store` and `run` (`run/final` is the draft) of `eyas.testing.learned.build_learned_pair`."""
    return build_learned_pair(tmp_path_factory.mktemp("learned"))


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., CliResult]:
    """Run `eyas ARGS...` in-process through the real entry point; return exit code, stdout, stderr."""
    from eyas.cli import main

    def run(*args: str | Path) -> CliResult:
        monkeypatch.setattr(sys, "argv", ["eyas", *map(str, args)])
        capsys.readouterr()
        try:
            main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write `files` (relative path -> text) under `root`; return `root`."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def write_jsonl(path: Path, records: Iterable[object]) -> Path:
    """Write one JSON value per line (strings are written verbatim, for malformed lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def chat(*turns: tuple[str, str]) -> dict[str, list[dict[str, str]]]:
    """Return an OpenAI-format record from (role, content) pairs."""
    return {"messages": [{"role": role, "content": content} for role, content in turns]}


@pytest.fixture(scope="session")
def weighted_target(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Return a builder of tiny fp32 targets with random weights, one per architecture, cached for the session."""
    root = tmp_path_factory.mktemp("weighted")
    built: dict[str, Path] = {}

    def build(architecture: str = "llama") -> Path:
        if architecture not in built:
            built[architecture] = build_tiny_target(root / architecture, "chatml", architecture=architecture,
                                                    with_weights=True)
        return built[architecture]

    return build


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], Path]:
    """Return a builder of the example dataset (examples/data) prepared for a target, cached per target."""
    from eyas.config import PrepareConfig
    from eyas.data.prepare import run_prepare

    root = tmp_path_factory.mktemp("prepared")
    built: dict[Path, Path] = {}
    examples = Path(__file__).resolve().parents[1] / "examples" / "data"

    def build(target: Path) -> Path:
        if target not in built:
            out = root / f"{target.parent.name}-{target.name}"
            run_prepare(PrepareConfig(target=target, data=[examples], out=out))
            built[target] = out
        return built[target]

    return build


def kill_9_when(command: list[str], marker: Path, env: dict[str, str] | None = None, timeout: float = 180) -> None:
    """Start `command`, SIGKILL it as soon as `marker` exists, and wait for it to die.

    Fails when the command finishes before the marker appears (nothing was interrupted).
    """
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + timeout
    while not marker.exists():
        assert process.poll() is None, f"finished before it could be killed: {process.stderr.read()!r}"
        assert time.monotonic() < deadline, f"{marker} did not appear within {timeout}s"
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
