"""Audit reports: JSON, SARIF 2.1.0 (code-scanning UIs) and text grouped by file."""

from __future__ import annotations

import json
from itertools import groupby
from typing import Any

from eyas.audit.checks import Finding

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def as_json(findings: list[Finding], summary: dict[str, Any]) -> str:
    return json.dumps({"findings": [f.as_dict() for f in findings], "summary": summary}, indent=2)


def as_sarif(findings: list[Finding], summary: dict[str, Any], tool_version: str) -> str:
    rules = sorted({f.kind for f in findings})
    results = [{
        "ruleId": f.kind, "level": "error" if f.severity == "error" else "warning",
        "message": {"text": f.message + (f" (fix: {f.fix})" if f.fix else "")},
        "locations": [{"physicalLocation": {"artifactLocation": {"uri": f.path},
                                            "region": {"startLine": f.line, "startColumn": f.col}}}],
        "properties": {"symbol": f.symbol, "baseline_signature": f.baseline_signature,
                       "target_signature": f.target_signature},
    } for f in findings]
    run = {"tool": {"driver": {"name": "eyas audit", "version": tool_version, "informationUri": "https://pypi.org/project/eyas/",
                               "rules": [{"id": rule, "shortDescription": {"text": rule.replace("-", " ")}} for rule in rules]}},
           "results": results, "properties": summary}
    return json.dumps({"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}, indent=2)


def as_text(findings: list[Finding], summary: dict[str, Any]) -> str:
    lines = []
    for path, group in groupby(sorted(findings, key=lambda f: (f.path, f.line, f.col)), key=lambda f: f.path):
        lines.append(path)
        for f in group:
            lines.append(f"  {f.line}:{f.col} {f.severity} [{f.kind}] {f.message}")
            if f.baseline_signature or f.target_signature:
                lines.append(f"      baseline: {f.baseline_signature or '-'}")
                lines.append(f"      target:   {f.target_signature or '-'}")
            if f.fix:
                lines.append(f"      fix: {f.fix}")
    lines.append(f"{summary['errors']} error(s), {summary['warnings']} warning(s) in {summary['files']} file(s), "
                 f"{summary['seconds']:.2f} s (against {summary['against']}"
                 + (f", baseline {summary['baseline']})" if summary.get("baseline") else ")"))
    return "\n".join(lines)
