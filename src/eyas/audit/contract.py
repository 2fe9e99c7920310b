"""eyas's own engine contract: its modules that drive transformers internals, audited against the
installed transformers before any stage loads weights (`eyas preflight`, `eyas extract`, online
`eyas train`)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import eyas
from eyas.audit.checks import ERROR

ENGINE_PACKAGES = ("transformers",)
ENGINE_MODULES = ("models", "backends", "decode", "draft", "features", "train")  # subpackages of eyas that use them


def engine_modules() -> list[Path]:
    root = Path(eyas.__file__).parent
    return [root / name for name in ENGINE_MODULES]


def engine_api_problems() -> tuple[list[str], dict[str, str]]:
    """Return one line per error of eyas's engine-facing modules against the installed engines, and facts
    (what was audited, in how long). An engine that is not installed is itself a problem."""
    from eyas.audit.run import run_audit

    problems, facts = [], {}
    for package in ENGINE_PACKAGES:
        if importlib.util.find_spec(package) is None:
            problems.append(f"engine API: {package} is not installed")
            continue
        started = time.perf_counter()
        result = run_audit(engine_modules(), package)
        problems += [f"engine API: {f.path}:{f.line}: {f.message}" for f in result.findings if f.severity == ERROR]
        facts[f"engine API ({result.summary['against']})"] = (
            f"{result.summary['errors']} error(s) in eyas's {result.summary['files']} engine-facing files, "
            f"{time.perf_counter() - started:.1f}s")
    return problems, facts
