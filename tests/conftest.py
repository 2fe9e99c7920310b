"""Shared fixtures: tiny offline targets (built once per session) and an in-process CLI runner."""

from __future__ import annotations

import importlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch

from eyas.backends.vllm.contract import installed_vllm
from eyas.testing.learned import build_learned_pair
from eyas.testing.tiny import STYLES, build_tiny_target

# The real-engine tests need vLLM, which lives in its own venv (`make test-vllm` runs them there); the main
# venv does not collect them, and `make test-vllm` fails (no tests collected) where vLLM is not installed.
# Asked of the package metadata: with this directory on sys.path, a folder named like the package would
# pass for it (`importlib.util.find_spec`), which is also why the folder is not called `vllm`.
collect_ignore = [] if installed_vllm() else ["with_vllm"]


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


@pytest.fixture(scope="session")
def learned_peagle(learned: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A P-EAGLE draft (with EAGLE-3.1's fc_norm) trained on the learned pair's store as its EAGLE-3 draft was;
    the directory of the draft."""
    from eyas.testing.learned import train_draft

    return train_draft(learned["store"], tmp_path_factory.mktemp("peagle") / "run", family="peagle",
                       fc_norm=True) / "final"


@pytest.fixture(scope="session")
def learned_dflash(learned: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-layer DFlash draft (block of 4) trained on the learned pair's store as its EAGLE-3 draft was; the
    directory of the draft."""
    from eyas.testing.learned import train_draft

    return train_draft(learned["store"], tmp_path_factory.mktemp("dflash") / "run", family="dflash") / "final"


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., CliResult]:
    """Run `eyas ARGS...` in-process through the real entry point, as a fresh process would (nothing
    announced yet: the dtype choice is said once per process); return exit code, stdout, stderr."""
    from eyas import precision
    from eyas.cli import main

    def run(*args: str | Path) -> CliResult:
        monkeypatch.setattr(sys, "argv", ["eyas", *map(str, args)])
        monkeypatch.setattr(precision, "_said", set())
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


def importable_tree(root: Path, files: dict[str, str], packages: tuple[str, ...]) -> Iterator[Path]:
    """Yield `root` with `files` written under it and importable (on `sys.path`); afterwards unimport
    `packages` and take `root` off the path. For module-scoped fixtures of packages built by a test."""
    write_tree(root, files)
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    yield root
    sys.path.remove(str(root))
    for name in [n for n in sys.modules if n.split(".")[0] in packages]:
        del sys.modules[name]


def prove_by_running(source: str, binding: int) -> None:
    """Execute each line of `source` in one namespace: the first `binding` lines must run, every later
    line must raise TypeError or AttributeError (the live truth an audit's findings are held to)."""
    namespace: dict[str, object] = {}
    lines = source.splitlines()
    for line in lines[:binding]:
        exec(line, namespace)
    for line in lines[binding:]:
        with pytest.raises((TypeError, AttributeError)):
            exec(line, namespace)


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


@pytest.fixture(scope="session")
def example_store(weighted_target, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A float32 feature store of the example dataset (200-token draft vocab) for the tiny llama target."""
    from eyas.config import ExtractConfig, PrepareConfig
    from eyas.data.prepare import run_prepare
    from eyas.features.extract import run_extract

    root = tmp_path_factory.mktemp("example-store")
    target = weighted_target("llama")
    examples = Path(__file__).resolve().parents[1] / "examples" / "data"
    run_prepare(PrepareConfig(target=target, data=[examples], out=root / "ds", draft_vocab_size=200))
    run_extract(ExtractConfig(target=target, data=root / "ds", out=root / "store", dtype="float32",
                              storage_dtype="fp32", device="cpu"))
    return root / "store"


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


@dataclass
class Finished:
    code: int
    err: str
    seconds: float  # from the moment the command could handle SIGTERM to its exit
    marked: list[float | None]  # from that moment to each marker's appearance


def sigterm_handled(pid: int) -> bool:
    """Return whether process `pid` catches SIGTERM (eyas's entry point has installed its handler)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught, 16) >> (signal.SIGTERM - 1) & 1)


def run_sigterm_after(command: list[str], delay: float | None, env: dict[str, str] | None = None,
                      markers: tuple[Path, ...] = (), timeout: float = 300) -> Finished:
    """Run `command`; `delay` seconds after it installed its SIGTERM handler send it SIGTERM (never,
    when None); return its exit code, stderr, the seconds it ran from that handler on and when each
    of `markers` appeared.

    Fails when the command exits before it ever catches SIGTERM. (Once eyas's `main` has returned, the
    interpreter exits with SIGTERM's default action again: killed, no message, the work complete.)
    """
    with tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, text=True, env=env)
        deadline = time.monotonic() + timeout
        while not sigterm_handled(process.pid):
            assert process.poll() is None, f"exited before it caught SIGTERM: {err.seek(0) or err.read()!r}"
            assert time.monotonic() < deadline, f"{command[:2]} did not install a SIGTERM handler within {timeout}s"
            time.sleep(0.005)
        started, marked = time.monotonic(), [None for _ in markers]
        while process.poll() is None:
            now = time.monotonic() - started
            marked = [seen if seen is not None or not path.exists() else now for seen, path in zip(marked, markers)]
            if delay is not None and now >= delay:
                process.send_signal(signal.SIGTERM)
                break
            assert time.monotonic() < deadline, f"{command[:2]} still runs after {timeout}s"
            time.sleep(0.005)
        process.wait(timeout=timeout)
        seconds = time.monotonic() - started
        err.seek(0)
        return Finished(process.returncode, err.read(), seconds, marked)


@dataclass
class DiskFullRuns:
    failed: CliResult  # the command on the small disk
    left: Path  # a copy of what it left in the output directory
    rerun: CliResult  # the same command once the disk has room again
    result: Path  # a copy of the output directory after the rerun


_SMALL_DISK_SCRIPT = """
set -u
out=$1 size=$2 copies=$3
shift 3
mount -t tmpfs -o "size=${size}k" eyas-small-disk "$out" || exit 97
"$@" >"$copies/failed.out" 2>"$copies/failed.err"; echo $? >"$copies/failed.rc"
cp -a "$out/." "$copies/left/" || exit 96
mount -o remount,size=100m "$out" || exit 98
"$@" >"$copies/rerun.out" 2>"$copies/rerun.err"; echo $? >"$copies/rerun.rc"
cp -a "$out/." "$copies/result/" || exit 96
"""


def on_full_disk_then_rerun(command: list[str], out: Path, size_kib: int, copies: Path,
                            env: dict[str, str] | None = None, timeout: float = 600) -> DiskFullRuns:
    """Run `command` writing to the empty directory `out` on a real `size_kib` KiB tmpfs (it runs out
    of space), then again once the tmpfs has grown to 100 MiB; return both outcomes and copies of `out`
    after each (the tmpfs lives in a private mount namespace: `unshare -rm`, or `unshare -m` as root).

    Fails (never skips) when no small filesystem can be mounted here.
    """
    out.mkdir(parents=True, exist_ok=True)
    for name in ("left", "result"):
        (copies / name).mkdir(parents=True)
    if shutil.which("unshare") is None:
        pytest.fail("cannot mount a small tmpfs to fill up: `unshare` (util-linux) is not installed")
    problems = []
    for launcher in (["unshare", "-rm"], ["unshare", "-m"]):
        done = subprocess.run([*launcher, "bash", "-c", _SMALL_DISK_SCRIPT, "small-disk", str(out), str(size_kib),
                               str(copies), *command], capture_output=True, text=True, env=env, timeout=timeout)
        assert done.returncode != 96, f"copying {out} out of the small disk failed: {done.stderr[-2000:]}"
        if done.returncode == 0:
            def outcome(run: str) -> CliResult:
                return CliResult(int((copies / f"{run}.rc").read_text()), (copies / f"{run}.out").read_text(),
                                 (copies / f"{run}.err").read_text())

            return DiskFullRuns(outcome("failed"), copies / "left", outcome("rerun"), copies / "result")
        problems.append(f"{' '.join(launcher)}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    pytest.fail("cannot mount a small tmpfs to fill up (needs `unshare -rm` (user+mount namespaces) or root): "
                + " | ".join(problems))


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Return every file under `root` (relative path -> bytes), an output directory's lock file left out."""
    from eyas.files import LOCK_FILE

    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != LOCK_FILE}


def temporary_files(root: Path) -> list[Path]:
    """Return what a writer's temporary files and directories (`.NAME.tmp-PID`) left under `root`."""
    return sorted(root.rglob(".*.tmp-*"))


def poison_sample(store: Path, shard: str, position: int, name: str, value: float = float("nan")) -> int:
    """Rewrite `store/shard` with `value` (NaN, or a huge finite number: a whole token row then) in the
    `name` features (aux or last) of its `position`-th sample and record the new checksum in the
    manifest, so that value is the store's only fault; return that sample's id."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from eyas.files import sha256_file

    path = store / shard
    with safe_open(str(path), framework="pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        metadata = handle.metadata()
    row = int(tensors["offsets"][position]) + 1
    if math.isnan(value):
        tensors[name][row, 3] = value
    else:
        tensors[name][row] = value
    save_file(tensors, str(path), metadata=metadata)
    manifest = json.loads((store / "manifest.json").read_text())
    entry = next(info for info in manifest["shards"] if info["file"] == shard)
    assert entry["bytes"] == path.stat().st_size
    entry["sha256"] = sha256_file(path)
    (store / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    assert bool(torch.isnan(tensors[name]).any()) == math.isnan(value)
    return int(tensors["sample_ids"][position])


def terminate_then_rerun(command: list[str], delay: float, complete: Path, env: dict[str, str] | None = None
                         ) -> float | None:
    """SIGTERM `command` `delay` seconds after it installed its handler; when that stopped it, rerun it
    to the end and return None; else return when `complete`, the file it writes last, appeared.

    Asserts the exact outcome: exit 143 with the one line and no temporary file left beside
    `complete`; or, when it had finished, exit 0 (or SIGTERM's default action during interpreter
    exit, after eyas's `main` returned) with `complete` written.
    """
    stopped = run_sigterm_after(command, delay, env, markers=(complete,))
    if stopped.code != 143:
        assert stopped.code in (0, -signal.SIGTERM) and stopped.err == "" and complete.is_file(), stopped
        return stopped.marked[0]
    assert stopped.err == "eyas: terminated (SIGTERM); rerun the same command to resume\n"
    assert temporary_files(complete.parent) == []  # finally-blocks ran
    rerun = subprocess.run(command, capture_output=True, text=True, env=env)
    assert rerun.returncode == 0, rerun.stderr
    return None


def sigterm_at_random_points(command: Callable[[Path], list[str]], root: Path, complete: str, reference: Finished,
                             seed: int, same: Callable[[Path], None], env: dict[str, str] | None = None) -> None:
    """SIGTERM `command(out)` at a seeded random point of its run, and at one after it claimed its
    output; rerun each and check its output with `same`. `reference.marked` holds when an
    uninterrupted run claimed its output and wrote `complete` (its last file). A run that finished
    before the signal (faster than the reference) is checked too and tried again at a point drawn
    within its own span, up to 4 times."""
    draw = random.Random(seed)
    claimed, finished = reference.marked
    assert claimed is not None and finished is not None, reference
    for window, first in (("anywhere", 0.0), ("writing", claimed / finished)):
        for attempt in range(4):
            out = root / f"{window}-{attempt}"
            done_at = terminate_then_rerun(command(out), finished * draw.uniform(first, 1.0), out / complete, env)
            same(out)
            if done_at is None:
                break
            finished = done_at
        else:
            pytest.fail(f"SIGTERM {window}: every run finished before the signal")
