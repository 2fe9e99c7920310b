"""`eyas audit`: client usages checked against the target version's API model (and a baseline's)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eyas.audit.apimodel import ApiModel
from eyas.audit.checks import ERROR, WARNING, Checker, Finding, package_classes
from eyas.audit.modelcache import ModuleCache
from eyas.audit.spec import cache_dir, resolve_spec
from eyas.audit.usage import called_names, read_usages
from eyas.errors import EyasError

KINDS = ("unresolved-import", "missing-attribute", "call-mismatch", "dead-override", "override-mismatch", "dead-binding",
         "bind-mismatch", "default-changed", "return-changed", "method-removed", "protocol-change", "unparsable")


@dataclass
class AuditResult:
    findings: list[Finding]
    summary: dict[str, Any]

    @property
    def errors(self) -> int:
        return self.summary["errors"]


def run_audit(paths: list[Path], against: str, baseline: str | None = None, select: set[str] | None = None) -> AuditResult:
    """Return the findings of the client files under `paths` against SPEC `against` (and `baseline`)."""
    started = time.perf_counter()
    for path in paths:
        if not path.exists():
            raise EyasError(f"{path}: no such file or directory")
    if select is not None and (unknown := select - set(KINDS)):
        raise EyasError(f"--select: unknown kind(s) {', '.join(sorted(unknown))}; kinds: {', '.join(KINDS)}")
    target_source = resolve_spec(against)
    baseline_source = resolve_spec(baseline) if baseline else None
    cache = ModuleCache(cache_dir() / "api")
    target = ApiModel(list(target_source.roots), cache)
    before = ApiModel(list(baseline_source.roots), cache) if baseline_source else None
    usages, files, unparsable, defined = read_usages(paths, set(target_source.packages))
    checker = Checker(target, before, called_names(usages))
    for usage in usages:
        if usage.kind != "untyped_call":
            checker.check(usage)
    classes = package_classes(usages, before or target)
    checker.untyped([u for u in usages if u.kind == "untyped_call" and not u.guarded], classes,
                    set(target_source.packages), defined)
    checker.new_duties(usages, classes)
    checker.unset_config_defaults(usages)
    findings = checker.findings + [Finding(str(path), line, 1, str(path), "unparsable", WARNING,
                                           f"not parsed ({message}); its uses were not checked")
                                   for path, line, message in unparsable]
    if select is not None:
        findings = [f for f in findings if f.kind in select]
    findings.sort(key=lambda f: (f.path, f.line, f.col, f.kind))
    summary = {"errors": sum(f.severity == ERROR for f in findings), "warnings": sum(f.severity == WARNING for f in findings),
               "files": files, "seconds": round(time.perf_counter() - started, 3), "against": target_source.label,
               "baseline": baseline_source.label if baseline_source else None}
    return AuditResult(findings, summary)
