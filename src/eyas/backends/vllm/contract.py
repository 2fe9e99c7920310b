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

    def covers(self, version: str) -> bool:
        release = Version(version).release
        return Version(self.since).release <= release and (self.until is None or release < Version(self.until).release)

    @property
    def span(self) -> str:
        return f">={self.since}" + (f",<{self.until}" if self.until else "")

    def files(self) -> list[Path]:
        return [HERE / module for module in self.modules]


VLLM_PATHS = (
    VllmPath("worker extension", "0.11.0", "0.22.0", ("engine.py", "hooked.py", "worker.py"), ("0.11.0", "0.21.0"),
             "eyas.backends.vllm.hooked:HookedExtractor",
             "LLM(worker_extension_cls=...) + collective_rpc; eager, one prompt per forward, hooks sum hidden + residual"),
    VllmPath("hidden-states connector", "0.22.0", None, ("engine.py", "connector.py"), ("0.22.0", "0.34.0"),
             "eyas.backends.vllm.connector:ConnectorExtractor",
             "speculative method extract_hidden_states + ExampleHiddenStatesConnector; files read with its "
             "load_hidden_states (asynchronous writes from 0.22)"),
)


def installed_vllm() -> str | None:
    """Return the installed vLLM's version (from its metadata: vLLM is not imported), or None."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def path_for(version: str) -> VllmPath | None:
    """Return the path that runs on vLLM `version`, or None outside every supported range."""
    return next((path for path in VLLM_PATHS if path.covers(version)), None)


def supported_ranges() -> str:
    return ", ".join(f"{p.span} ({p.name})" for p in VLLM_PATHS)


def release_path(version: str | None) -> VllmPath:
    """Return the path vLLM `version` runs (None: not installed); refuses a missing vLLM or an unsupported release."""
    if version is None:
        raise CannotRun(f"vLLM is not installed (pip install vllm; supported: {supported_ranges()})")
    path = path_for(version)
    if path is None:
        raise CannotRun(f"vLLM {version} is outside the supported releases: {supported_ranges()}")
    return path


def _spec_version(against: str) -> str:
    """Return the release of an `--against` SPEC; refuses one that names no vLLM release."""
    match = re.fullmatch(r"(?:sdist:)?vllm==(\S+)", against)
    if match is None:
        raise EyasError(f"--against {against}: expected vllm==VERSION or sdist:vllm==VERSION")
    return match[1]


def contract_uses(path: VllmPath) -> list[Usage]:
    """Return every use of vLLM in `path`'s modules, in file and line order (read from source, nothing imported)."""
    usages, _, _ = read_usages(path.files(), {"vllm"})
    return sorted((u for u in usages if u.kind != "untyped_call"), key=lambda u: (u.path, u.line, u.col))


def vllm_problems(against: str | None = None) -> tuple[list[str], dict[str, str]]:
    """Return one line per problem of the vLLM backend against the installed vLLM (or SPEC `against`), and facts.

    A missing vLLM, a release outside the supported ranges and every audit error of the path that
    release runs are problems; refuses an `against` that names no vLLM release. Nothing is imported
    from vLLM.
    """
    from eyas.audit.checks import ERROR
    from eyas.audit.run import run_audit

    version = installed_vllm() if against is None else _spec_version(against)
    try:
        path = release_path(version)
    except EyasError as error:
        return [str(error)], {}
    started = time.perf_counter()
    result = run_audit(path.files(), against or "vllm")
    problems = [f"vLLM API: {f.path}:{f.line}: {f.message}" for f in result.findings if f.severity == ERROR]
    facts = {"vLLM path": f"{path.name} ({path.span})",
             f"vLLM API ({result.summary['against']})": f"{result.summary['errors']} error(s) in {len(path.modules)} "
                                                         f"files, {time.perf_counter() - started:.1f}s"}
    return problems, facts
