"""`eyas audit` against a fixture library `fixlib` in two versions (v1 baseline, v2 target).

The library and the clients are Python source written to a temporary directory; nothing of
them is ever imported (pydantic, attrs and msgspec need not be installed). Each client module
exercises one drift kind, written against v1; its test asserts the exact findings (kind,
symbol, line, severity) and that nothing else is reported. Lines are found through marker
comments (`# <- name`) in the client source, never hard-coded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from eyas.audit.checks import Finding
from eyas.audit.run import AuditResult, run_audit
from eyas.errors import EyasError

# --------------------------------------------------------------------------------------------
# The fixture library, version 1 (baseline)
# --------------------------------------------------------------------------------------------

V1: dict[str, str] = {
    "fixlib/__init__.py": '''\
"""fixlib, version 1."""
from fixlib import util
from fixlib.api import *
from fixlib.engine import Engine, Reader
from fixlib.hierarchy import Base, Sub
from fixlib.models import Conn, Event, Job, Limits, Loose, Msg, Options, Plain, Point, Settings, Tagged

__version__ = "1.0"


def gone(x):
    """Removed in version 2."""
    return x
''',
    "fixlib/api.py": '''\
"""Module-level functions."""


def fetch(url, retries=3):
    return url


def send(data, *, compress=False):
    return data


def load(path, mode):
    return path


def ping(host, timeout=1.0):
    return True


def configure(name, *, verbose=False):
    return name


def retry(op, attempts=3):
    return op


def listing() -> list[str]:
    return []


def items() -> list[str]:
    return []


def ready() -> bool:
    return True


def stable() -> list[int]:
    return []


def run_job(job):
    return job


def run_job_async(job, *, timeout=None):
    return job
''',
    "fixlib/util.py": '''\
"""Helpers."""


def helper():
    return 1


def helper_removed():
    return 2
''',
    "fixlib/sub.py": '''\
"""A module whose `moved` goes elsewhere in version 2."""


def moved():
    return 1


def stays():
    return 2
''',
    "fixlib/old_mod.py": '''\
"""Removed in version 2."""

VALUE = 1
''',
    "fixlib/workers.py": '''\
"""Worker classes, named by dotted strings in configs."""


class OldWorker:
    pass


class ThreadWorker:
    pass
''',
    "fixlib/engine.py": '''\
"""The engine and a reader."""


class Engine:
    """Runs steps; its `on_*` hooks may be replaced per instance."""

    def __init__(self, name, *, debug=False):
        self.name = name
        self.debug = debug
        self.removed_attr = None

    def run(self, steps=1):
        return steps

    def removed_method(self):
        return None

    def shutdown_old(self):
        return None

    @property
    def legacy_flag(self):
        return False

    def stats(self) -> list[int]:
        return []

    def on_step(self, step):
        pass

    def on_tick(self, tick):
        pass

    def on_log(self, message):
        pass

    def on_flush(self, buffer):
        pass

    def on_close(self):
        pass


class Reader:
    def __init__(self, path):
        self.path = path

    def old_name(self):
        return ""

    def still_here(self):
        return ""
''',
    "fixlib/hierarchy.py": '''\
"""A base class and a subclass that inherits `method` unchanged."""


class Base:
    def method(self, x, removed_param=0):
        return x

    def other(self, y):
        return y


class Sub(Base):
    """No override in version 1."""
''',
    "fixlib/plugins.py": '''\
"""A framework class whose methods clients override."""


class Plugin:
    def on_start(self):
        pass

    def on_event(self, event):
        pass

    def on_stop(self):
        pass

    def on_pause(self, reason):
        pass

    def setup(self, config):
        pass
''',
    "fixlib/models.py": '''\
"""Classes whose __init__ is synthesized from fields."""
from dataclasses import InitVar, dataclass, field
from typing import NamedTuple

import attrs
import msgspec
import pydantic
from pydantic import BaseModel, ConfigDict


@dataclass
class Options:
    name: str
    level: int = 1


@dataclass
class Limits:
    size: int = 10
    depth: int = 2


@pydantic.dataclasses.dataclass
class Conn:
    host: str
    secret: InitVar[str | None] = None

    def __post_init__(self, secret):
        pass


@pydantic.dataclasses.dataclass
class Plain:
    host: str
    port: int = 80


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    colour: str = "red"


class Loose(BaseModel):
    name: str


class Point(NamedTuple):
    x: int
    y: int


@attrs.define
class Job:
    name: str
    priority: int = 0


class Msg(msgspec.Struct):
    body: str
    topic: str = "main"


class Event(msgspec.Struct):
    name: str


@dataclass
class Tagged:
    name: str
    label: str = "x"
''',
}

# --------------------------------------------------------------------------------------------
# The fixture library, version 2 (target)
# --------------------------------------------------------------------------------------------

V2: dict[str, str] = {
    "fixlib/__init__.py": '''\
"""fixlib, version 2: `gone` and `old_mod` removed, `sub.moved` moved to `newhome`."""
from fixlib import util
from fixlib.api import *
from fixlib.engine import Engine, Reader
from fixlib.hierarchy import Base, Sub
from fixlib.models import Conn, Event, Job, Limits, Loose, Msg, Options, Plain, Point, Settings, Tagged

__version__ = "2.0"
''',
    "fixlib/api.py": '''\
"""Module-level functions, some with changed signatures."""


def fetch(url, session, retries=3):
    return url


def send(data):
    return data


def load(path, *, mode="r"):
    return path


def ping(host, timeout=1.0):
    return True


def configure(name, **options):
    return name


def retry(op, attempts=5):
    return op


def listing() -> dict[str, str]:
    return {}


def items() -> dict[str, int]:
    return {}


def ready() -> str | None:
    return None


def stable() -> list[int]:
    return []


def run_job_async(job, loop, *, timeout=None):
    return job
''',
    "fixlib/util.py": '''\
"""Helpers."""


def helper():
    return 1


def helper_renamed():
    return 2
''',
    "fixlib/sub.py": '''\
"""`moved` now lives in fixlib.newhome."""


def stays():
    return 2
''',
    "fixlib/newhome.py": '''\
"""Where `moved` went."""


def moved():
    return 1
''',
    "fixlib/workers.py": '''\
"""Worker classes, named by dotted strings in configs."""


class ThreadWorker:
    pass


class ProcessWorker:
    pass
''',
    "fixlib/engine.py": '''\
"""The engine and a reader."""


class Engine:
    """Runs steps; its `on_*` hooks may be replaced per instance."""

    def __init__(self, name, *, debug=False):
        self.name = name
        self.debug = debug

    def run(self, steps=1):
        return steps

    def shutdown(self):
        return None

    def stats(self) -> dict[str, int]:
        return {}

    def on_log(self, message, level):
        pass

    def on_flush(self, buffer, force):
        pass

    def on_close(self):
        pass


class Reader:
    def __init__(self, path):
        self.path = path

    def new_name(self):
        return ""

    def still_here(self):
        return ""
''',
    "fixlib/hierarchy.py": '''\
"""`Base.method` lost a parameter; `Sub.method` became a (*args, **kwargs) pass-through."""


class Base:
    def method(self, x):
        return x

    def other(self, y):
        return y


class Sub(Base):
    def method(self, *args, **kwargs):
        """Logs, then forwards to Base.method."""
        return super().method(*args, **kwargs)
''',
    "fixlib/plugins.py": '''\
"""A framework class whose methods clients override."""


class Plugin:
    def on_startup(self):
        pass

    def on_event(self, event, context):
        pass

    def on_stop(self):
        pass

    def on_pause(self, reason, until):
        pass

    def setup(self, config):
        pass
''',
    "fixlib/models.py": '''\
"""Classes whose __init__ is synthesized from fields."""
from dataclasses import InitVar, dataclass, field
from typing import NamedTuple

import attrs
import msgspec
import pydantic
from pydantic import BaseModel, ConfigDict


@dataclass
class Options:
    name: str
    level: int


@dataclass
class Limits:
    size: int = 20
    depth: int = 2


@pydantic.dataclasses.dataclass
class Conn:
    host: str
    secret: InitVar[str]

    def __post_init__(self, secret):
        pass


@pydantic.dataclasses.dataclass
class Plain:
    host: str
    port: int = 80


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    color: str = "red"


class Loose(BaseModel):
    name: str


class Point(NamedTuple):
    x: int
    y: int
    z: int


@attrs.define
class Job:
    name: str
    priority: int = attrs.field(default=0, kw_only=True)


class Msg(msgspec.Struct):
    body: str
    topic: str = "main"


class Event(msgspec.Struct):
    name: str
    ts: float


@dataclass
class Tagged:
    name: str
    label: str = field(repr=False)
''',
}

# --------------------------------------------------------------------------------------------
# The client package, written against v1: one module per drift kind
# --------------------------------------------------------------------------------------------

CLIENT: dict[str, str] = {
    "__init__.py": '"""The client package."""\n',
    "sibling.py": '''\
"""A module of the client itself."""


def helper():
    return 1
''',
    "client_imports.py": '''\
"""Imports that break, next to imports that still work and the client's own relative imports."""
from fixlib import gone  # <- import-gone
from fixlib.sub import moved  # <- import-moved
import fixlib.old_mod as om  # <- import-alias
from fixlib import Engine
from fixlib.sub import stays
import fixlib.util
import fixlib.util as fu
from . import sibling
from .sibling import helper
''',
    "client_attributes.py": '''\
"""Attributes that no longer exist, reached through modules and through instances of known class."""
import fixlib
import fixlib.util


def module_chain():
    fixlib.util.helper()
    return fixlib.util.helper_removed  # <- attr-module


def from_constructor():
    e = fixlib.Engine("x")
    e.run()
    print(e.name)
    return e.removed_attr  # <- attr-instance


class Holder:
    def __init__(self):
        self.x = fixlib.Engine("x")

    def go(self):
        self.x.run(steps=2)
        self.x.removed_method()  # <- attr-self


def annotated(e: fixlib.Engine):
    e.run()
    e.shutdown_old()  # <- attr-param


def make() -> fixlib.Engine:
    return fixlib.Engine("y")


def from_local_function():
    made = make()
    made.run()
    return made.legacy_flag  # <- attr-return
''',
    "client_calls.py": '''\
"""Calls whose signatures changed, next to calls that still bind."""
import fixlib


def calls():
    fixlib.fetch("u")  # <- call-missing
    fixlib.send(b"x", compress=True)  # <- call-keyword
    fixlib.load("p", "r")  # <- call-positional
    fixlib.ping("h", timeout=2.0)
    fixlib.configure("n", verbose=True)
    fixlib.Options("n")  # <- call-dataclass
    fixlib.Conn(host="h")  # <- call-initvar
    fixlib.Settings(name="n", colour="blue")  # <- call-forbid
    fixlib.Loose(name="n", colour="blue")
    fixlib.Point(1, 2)  # <- call-namedtuple
    fixlib.Job("j", 5)  # <- call-attrs
    fixlib.Engine("e", debug=True)
''',
    "client_passthrough.py": '''\
"""A subclass method that became a (*args, **kwargs) pass-through onto a changed base method."""
from fixlib.hierarchy import Sub


def use():
    Sub().method(1, removed_param=1)  # <- passthrough
    Sub().method(1)
    Sub().other(2)
''',
    "client_overrides.py": '''\
"""A client subclass of a framework class."""
from typing import override

from fixlib.plugins import Plugin


class MyPlugin(Plugin):
    def on_start(self):  # <- dead-override
        self.setup({})

    def on_event(self, event):  # <- override-mismatch
        pass

    def on_stop(self):
        pass

    def on_pause(self, *args):
        pass

    @override
    def on_finish(self):  # <- marked-dead-override
        pass

    def helper(self):
        pass
''',
    "client_bindings.py": '''\
"""Functions bound onto hooks of a package instance."""
import types

import fixlib


def my_step(step):
    pass


def my_tick(self, tick):
    pass


def my_log(message):
    pass


def my_flush(self, buffer):
    pass


def my_close():
    pass


def my_close_method(self):
    pass


def install(engine: fixlib.Engine):
    engine.on_step = my_step  # <- bind-dead-plain
    engine.on_tick = types.MethodType(my_tick, engine)  # <- bind-dead-methodtype
    engine.on_log = my_log  # <- bind-mismatch-plain
    engine.on_flush = types.MethodType(my_flush, engine)  # <- bind-mismatch-methodtype
    engine.on_close = my_close
    engine.on_close = types.MethodType(my_close_method, engine)
''',
    "client_strings.py": '''\
"""Worker classes named by dotted strings in a config dict."""

CONFIG = {
    "worker_cls": "fixlib.workers.OldWorker",  # <- string-missing
    "fallback_cls": "fixlib.workers.ThreadWorker",
    "name": "fixlib",
}
''',
    "client_defaults.py": '''\
"""Calls that rely on defaults, some of which changed."""
import fixlib


def defaults():
    fixlib.retry("op")  # <- default-function
    fixlib.retry("op", attempts=3)
    fixlib.retry("op", 3)
    fixlib.Limits()  # <- default-field
    fixlib.Limits(size=10)
    fixlib.Limits(10, depth=1)
''',
    "client_returns.py": '''\
"""Results of package calls that are indexed, iterated or tested."""
import fixlib


def results():
    first = fixlib.listing()[0]  # <- return-index
    for item in fixlib.items():  # <- return-iterate
        print(item)
    if fixlib.ready():  # <- return-test
        pass
    total = fixlib.stable()[0]
    whole = fixlib.listing()
    engine = fixlib.Engine("e")
    top = engine.stats()[0]  # <- return-method
    return first, total, whole, top
''',
    "client_untyped.py": '''\
"""Methods called on a receiver whose type is unknown here."""
import fixlib

READER = fixlib.Reader("path")


def g(x):
    x.old_name()  # <- untyped-removed
    x.still_here()
    x.unrelated()
''',
    "client_clean.py": '''\
"""Uses that did not change: nothing is reported."""
import fixlib
from fixlib import Engine, util
from fixlib.hierarchy import Base


def clean():
    engine = Engine("e", debug=True)
    engine.run(steps=2)
    print(engine.name)
    util.helper()
    fixlib.ping("h")
    fixlib.stable()[0]
    Base().other(1)
    fixlib.Loose(name="n", anything=1)
    fixlib.Limits(size=10)
    fixlib.Plain(host="h")
''',
    "client_forward_ref.py": '''\
"""A function using the result of a local factory defined further down the module."""
import fixlib


def use_before_definition():
    made = make()
    made.run()
    return made.legacy_flag  # <- attr-forward


def make() -> fixlib.Engine:
    return fixlib.Engine("y")
''',
    "client_pydantic_positional.py": '''\
"""Pydantic dataclasses called with positional arguments (they accept them)."""
import fixlib


def positional():
    fixlib.Plain("h", 8080)
    fixlib.Conn("h")  # <- initvar-positional
''',
    "client_msgspec_positional.py": '''\
"""msgspec Structs called with positional arguments (they accept them unless kw_only=True)."""
import fixlib


def positional():
    fixlib.Msg("hi", "topic")
    fixlib.Event("e")  # <- struct-positional
''',
    "client_field_specifiers.py": '''\
"""Fields declared with attrs.field(...) / dataclasses.field(...) specifiers."""
import fixlib


def specifiers():
    fixlib.Job("j")
    fixlib.Tagged("t")  # <- field-required
''',
    "client_import_prefix.py": '''\
"""A failed import hides the uses of that name only, not of names it is a prefix of."""
import fixlib
from fixlib import run_job  # <- prefix-import


def go():
    run_job("j")
    fixlib.run_job_async("j")  # <- prefix-call
''',
    "client_guards.py": '''\
"""Compatibility code for other versions (try/except ImportError, version checks) is not checked."""
import fixlib

try:
    from fixlib import gone
except ImportError:
    gone = None

if fixlib.__version__ >= "2":
    fixlib.fetch("u", "s")
else:
    fixlib.fetch("u")


def after_the_guards():
    fixlib.load("p", "r")  # <- after-guards
''',
    "client_guard_words.py": '''\
"""An `if` whose test merely contains the letters "version" is no version check."""
import fixlib


def convert(do_conversion):
    if do_conversion:
        fixlib.send(b"x", compress=True)  # <- in-conversion
''',
    "client_returns_more.py": '''\
"""Results of package calls tested or iterated in other statement forms."""
import fixlib


def more():
    if not fixlib.ready():  # <- return-not
        pass
    while fixlib.ready():  # <- return-while
        break
    return [i for i in fixlib.items()]  # <- return-comprehension
''',
}

BROKEN = '''\
"""A client file that does not parse."""
import fixlib


def broken(:  # <- syntax
    fixlib.gone()
'''


# --------------------------------------------------------------------------------------------
# Expectations
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    """One expected finding: its kind, symbol, the marker naming its line, severity."""

    kind: str
    symbol: str
    marker: str
    severity: str = "error"
    needs_baseline: bool = False  # only reported when a baseline is given


def W(kind: str, symbol: str, marker: str) -> Expect:  # noqa: N802
    """Return an expected warning (warnings all need the baseline)."""
    return Expect(kind, symbol, marker, "warning", needs_baseline=True)


EXPECTED: dict[str, list[Expect]] = {
    "client_imports.py": [
        Expect("unresolved-import", "fixlib.gone", "import-gone"),
        Expect("unresolved-import", "fixlib.sub.moved", "import-moved"),
        Expect("unresolved-import", "fixlib.old_mod", "import-alias"),
    ],
    "client_attributes.py": [
        Expect("missing-attribute", "fixlib.util.helper_removed", "attr-module"),
        Expect("missing-attribute", "fixlib.Engine.removed_attr", "attr-instance"),
        Expect("missing-attribute", "fixlib.Engine.removed_method", "attr-self"),
        Expect("missing-attribute", "fixlib.Engine.shutdown_old", "attr-param"),
        Expect("missing-attribute", "fixlib.Engine.legacy_flag", "attr-return"),
    ],
    "client_calls.py": [
        Expect("call-mismatch", "fixlib.fetch", "call-missing"),
        Expect("call-mismatch", "fixlib.send", "call-keyword"),
        Expect("call-mismatch", "fixlib.load", "call-positional"),
        Expect("call-mismatch", "fixlib.Options", "call-dataclass"),
        Expect("call-mismatch", "fixlib.Conn", "call-initvar"),
        Expect("call-mismatch", "fixlib.Settings", "call-forbid"),
        Expect("call-mismatch", "fixlib.Point", "call-namedtuple"),
        Expect("call-mismatch", "fixlib.Job", "call-attrs"),
    ],
    "client_passthrough.py": [
        Expect("call-mismatch", "fixlib.hierarchy.Sub.method", "passthrough"),
    ],
    "client_overrides.py": [
        Expect("dead-override", "fixlib.plugins.Plugin.on_start", "dead-override", needs_baseline=True),
        Expect("override-mismatch", "fixlib.plugins.Plugin.on_event", "override-mismatch"),
        Expect("dead-override", "fixlib.plugins.Plugin.on_finish", "marked-dead-override"),
    ],
    "client_bindings.py": [
        Expect("dead-binding", "fixlib.Engine.on_step", "bind-dead-plain"),
        Expect("dead-binding", "fixlib.Engine.on_tick", "bind-dead-methodtype"),
        Expect("bind-mismatch", "fixlib.Engine.on_log", "bind-mismatch-plain"),
        Expect("bind-mismatch", "fixlib.Engine.on_flush", "bind-mismatch-methodtype"),
    ],
    "client_strings.py": [
        Expect("missing-attribute", "fixlib.workers.OldWorker", "string-missing"),
    ],
    "client_defaults.py": [
        W("default-changed", "fixlib.retry(attempts)", "default-function"),
        W("default-changed", "fixlib.Limits(size)", "default-field"),
    ],
    "client_returns.py": [
        W("return-changed", "fixlib.listing", "return-index"),
        W("return-changed", "fixlib.items", "return-iterate"),
        W("return-changed", "fixlib.ready", "return-test"),
        W("return-changed", "fixlib.Engine.stats", "return-method"),
    ],
    "client_untyped.py": [
        W("method-removed", "x.old_name", "untyped-removed"),
    ],
    "client_clean.py": [],
    "client_forward_ref.py": [
        Expect("missing-attribute", "fixlib.Engine.legacy_flag", "attr-forward"),
    ],
    "client_pydantic_positional.py": [
        Expect("call-mismatch", "fixlib.Conn", "initvar-positional"),
    ],
    "client_msgspec_positional.py": [
        Expect("call-mismatch", "fixlib.Event", "struct-positional"),
    ],
    "client_field_specifiers.py": [
        Expect("call-mismatch", "fixlib.Tagged", "field-required"),
    ],
    "client_import_prefix.py": [
        Expect("unresolved-import", "fixlib.run_job", "prefix-import"),
        Expect("call-mismatch", "fixlib.run_job_async", "prefix-call"),
    ],
    "client_guards.py": [
        Expect("call-mismatch", "fixlib.load", "after-guards"),
    ],
    "client_guard_words.py": [
        Expect("call-mismatch", "fixlib.send", "in-conversion"),
    ],
    "client_returns_more.py": [
        W("return-changed", "fixlib.ready", "return-not"),
        W("return-changed", "fixlib.ready", "return-while"),
        W("return-changed", "fixlib.items", "return-comprehension"),
    ],
}

# The modules of the main drift kinds (the others probe specific gaps, each in its own test).
DRIFT_MODULES = ["client_imports.py", "client_attributes.py", "client_calls.py", "client_passthrough.py",
                 "client_overrides.py", "client_bindings.py", "client_strings.py", "client_defaults.py",
                 "client_returns.py", "client_untyped.py", "client_clean.py"]

Row = tuple[str, str, int, str]  # (kind, symbol, line, severity)


@dataclass(frozen=True)
class Lib:
    """Where the fixture library versions and the clients were written."""

    v1: Path
    v2: Path
    client: Path
    broken: Path

    def module(self, name: str) -> Path:
        return self.client / name


def _write(root: Path, files: dict[str, str]) -> Path:
    """Write `files` (relative path -> text) under `root`; return `root`."""
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Lib:
    """Write fixlib v1 and v2, the client package and a broken client file."""
    root = tmp_path_factory.mktemp("fixlib")
    v1, v2 = _write(root / "v1", V1), _write(root / "v2", V2)
    client = _write(root / "client", CLIENT)
    broken = _write(root / "broken", {"bad.py": BROKEN}) / "bad.py"
    return Lib(v1, v2, client, broken)


def line_of(path: Path, marker: str) -> int:
    """Return the 1-based line of `path` carrying the comment `# <- marker` (exactly one)."""
    pattern = re.compile(rf"#\s*<-\s*{re.escape(marker)}\s*$")
    lines = [i for i, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(text)]
    assert len(lines) == 1, f"marker {marker!r} found on lines {lines} of {path}"
    return lines[0]


def audit(lib: Lib, module: str, baseline: bool = True, select: set[str] | None = None) -> AuditResult:
    """Audit one client module against v2 (with v1 as baseline unless told otherwise)."""
    return run_audit([lib.module(module)], against=str(lib.v2), baseline=str(lib.v1) if baseline else None,
                     select=select)


def rows(findings: list[Finding]) -> list[Row]:
    """Return the findings as sorted (kind, symbol, line, severity) rows."""
    return sorted((f.kind, f.symbol, f.line, f.severity) for f in findings)


def expected_rows(lib: Lib, module: str, baseline: bool = True) -> list[Row]:
    """Return the expected rows of `module` (without a baseline: only those that do not need one)."""
    return sorted((e.kind, e.symbol, line_of(lib.module(module), e.marker), e.severity)
                  for e in EXPECTED[module] if baseline or not e.needs_baseline)


def assert_exact(lib: Lib, module: str, result: AuditResult, baseline: bool = True) -> None:
    """The findings are exactly the expected ones, each once, all in `module`; the summary agrees."""
    got, want = rows(result.findings), expected_rows(lib, module, baseline)
    assert got == want, "\n".join(["unexpected findings:", *map(str, sorted(set(got) - set(want))),
                                   "missing findings:", *map(str, sorted(set(want) - set(got))),
                                   "all:", *(f"{f.line}: {f.kind} {f.symbol}: {f.message}" for f in result.findings)])
    assert {f.path for f in result.findings} <= {str(lib.module(module))}
    assert result.summary["errors"] == sum(r[3] == "error" for r in want)
    assert result.summary["warnings"] == sum(r[3] == "warning" for r in want)
    assert result.summary["files"] == 1


def at(lib: Lib, module: str, result: AuditResult, marker: str) -> Finding:
    """Return the one finding on the line of `marker`."""
    line = line_of(lib.module(module), marker)
    found = [f for f in result.findings if f.line == line]
    assert len(found) == 1, found
    return found[0]


def problems(finding: Finding) -> list[str]:
    """Return the binding problems listed in a call-mismatch / bind-mismatch message."""
    return finding.message.split(": ", 1)[1].split("; ")


# --------------------------------------------------------------------------------------------
# One test per client module
# --------------------------------------------------------------------------------------------


def test_unresolved_imports(lib: Lib) -> None:
    """Removed name, moved name and removed aliased module; relative imports are the client's own."""
    result = audit(lib, "client_imports.py")
    assert_exact(lib, "client_imports.py", result)
    gone = at(lib, "client_imports.py", result, "import-gone")
    assert gone.message == "fixlib.gone cannot be imported in the target version"
    assert gone.baseline_signature == "gone(x)" and gone.target_signature is None
    assert gone.col == 1
    assert result.summary["against"] == str(lib.v2) and result.summary["baseline"] == str(lib.v1)


def test_missing_attributes(lib: Lib) -> None:
    """Module chains, constructor results, self attributes, annotated parameters, local factories."""
    module = "client_attributes.py"
    result = audit(lib, module)
    assert_exact(lib, module, result)
    chain = at(lib, module, result, "attr-module")
    assert chain.fix == "did you mean fixlib.util.helper_renamed?"
    assert chain.baseline_signature == "helper_removed()"
    param = at(lib, module, result, "attr-param")
    assert param.fix == "did you mean shutdown?"
    assert param.baseline_signature == "shutdown_old(self)"
    assert param.message == "Engine has no attribute shutdown_old in the target version"
    for marker in ("attr-instance", "attr-self", "attr-return"):
        assert at(lib, module, result, marker).fix is None


def test_call_mismatches(lib: Lib) -> None:
    """Each way a call stops binding, for functions and for synthesized constructors."""
    module = "client_calls.py"
    result = audit(lib, module)
    assert_exact(lib, module, result)
    expected_problems = {
        "call-missing": ["missing required argument(s) 'session'"],
        "call-keyword": ["unexpected keyword argument 'compress'"],
        "call-positional": ["takes 1 positional argument(s), the call passes 2"],
        "call-dataclass": ["missing required argument(s) 'level'"],
        "call-initvar": ["missing required argument(s) 'secret'"],
        "call-forbid": ["unexpected keyword argument 'colour'"],
        "call-namedtuple": ["missing required argument(s) 'z'"],
        "call-attrs": ["takes 1 positional argument(s), the call passes 2"],
    }
    for marker, wanted in expected_problems.items():
        assert problems(at(lib, module, result, marker)) == wanted, marker
    signatures = {
        "call-missing": ("fetch(url, retries=3)", "fetch(url, session, retries=3)"),
        "call-keyword": ("send(data, *, compress=False)", "send(data)"),
        "call-positional": ("load(path, mode)", "load(path, *, mode='r')"),
        "call-dataclass": ("Options(name: str, level: int = 1)", "Options(name: str, level: int)"),
        "call-forbid": ("Settings(*, name: str, colour: str = 'red')", "Settings(*, name: str, color: str = 'red')"),
        "call-namedtuple": ("Point(x: int, y: int)", "Point(x: int, y: int, z: int)"),
    }
    for marker, (before, now) in signatures.items():
        finding = at(lib, module, result, marker)
        assert (finding.baseline_signature, finding.target_signature) == (before, now), marker
    assert at(lib, module, result, "call-attrs").baseline_signature == "Job(name: str, priority: int = 0)"
    assert at(lib, module, result, "call-missing").message == \
        "call of fixlib.fetch does not bind: missing required argument(s) 'session'"


def test_pass_through_override_binds_against_base(lib: Lib) -> None:
    """`Sub.method(*args, **kwargs)` forwards to `Base.method`: the call is checked against Base's signature."""
    module = "client_passthrough.py"
    result = audit(lib, module)
    assert_exact(lib, module, result)
    finding = at(lib, module, result, "passthrough")
    assert problems(finding) == ["unexpected keyword argument 'removed_param'"]
    assert finding.target_signature == "method(self, x)"
    assert finding.baseline_signature == "method(self, x, removed_param=0)"


def test_overrides(lib: Lib) -> None:
    """Dead overrides (fix names the replacement), a mismatched override, and overrides that still match."""
    module = "client_overrides.py"
    result = audit(lib, module)
    assert_exact(lib, module, result)
    dead = at(lib, module, result, "dead-override")
    assert dead.fix == "override on_startup instead?"
    assert dead.baseline_signature == "on_start(self)"
    mismatch = at(lib, module, result, "override-mismatch")
    assert problems(mismatch) == ["takes 1 positional argument(s), the call passes 2"]
    assert mismatch.baseline_signature == "on_event(self, event)"
    assert mismatch.target_signature == "on_event(self, event, context)"


def test_bindings(lib: Lib) -> None:
    """Plain and MethodType bindings onto removed hooks and hooks whose signature changed."""
    module = "client_bindings.py"
    result = audit(lib, module)
    assert_exact(lib, module, result)
    assert at(lib, module, result, "bind-dead-plain").baseline_signature == "on_step(self, step)"
    for marker in ("bind-mismatch-plain", "bind-mismatch-methodtype"):
        finding = at(lib, module, result, marker)
        assert problems(finding) == ["takes 1 positional argument(s), the call passes 2"], marker
    assert at(lib, module, result, "bind-mismatch-plain").target_signature == "on_log(self, message, level)"
    assert at(lib, module, result, "bind-mismatch-methodtype").target_signature == "on_flush(self, buffer, force)"


def test_dotted_strings(lib: Lib) -> None:
    """A config names a removed worker class: missing-attribute; an existing one: nothing."""
    module = "client_strings.py"
    result = audit(lib, module)
    assert_exact(lib, module, result)
    finding = at(lib, module, result, "string-missing")
    assert finding.message == "fixlib.workers.OldWorker does not exist in the target version"
    assert finding.baseline_signature == "class OldWorker"


def test_default_changed(lib: Lib) -> None:
    """A default not passed changed (function parameter, dataclass field); passing it silences the warning."""
    module = "client_defaults.py"
    result = audit(lib, module)
    assert_exact(lib, module, result)
    function = at(lib, module, result, "default-function")
    assert function.baseline_signature == "retry(op, attempts=3)"
    assert function.target_signature == "retry(op, attempts=5)"
    assert function.fix == "pass attempts=3 to keep the old behaviour"
    field = at(lib, module, result, "default-field")
    assert field.baseline_signature == "Limits(size: int = 10, depth: int = 2)"
    assert field.target_signature == "Limits(size: int = 20, depth: int = 2)"
    assert field.fix == "pass size=10 to keep the old behaviour"


def test_return_changed(lib: Lib) -> None:
    """Results indexed, iterated or tested whose return annotation changed; an unchanged one is silent."""
    module = "client_returns.py"
    result = audit(lib, module)
    assert_exact(lib, module, result)
    index = at(lib, module, result, "return-index")
    assert index.message == ("the result of fixlib.listing is indexed here, and its return type changed "
                             "from list[str] to dict[str, str]")
    assert index.baseline_signature == "listing() -> list[str]"
    assert index.target_signature == "listing() -> dict[str, str]"
    assert "is iterated here" in at(lib, module, result, "return-iterate").message
    assert "is tested here" in at(lib, module, result, "return-test").message


def test_method_removed_on_untyped_receiver(lib: Lib) -> None:
    """`x.old_name()` with x untyped: a package class the client uses lost it; the fix names `new_name`."""
    module = "client_untyped.py"
    result = audit(lib, module)
    assert_exact(lib, module, result)
    finding = at(lib, module, result, "untyped-removed")
    assert finding.fix == "likely replacement: new_name"
    assert finding.message == ("old_name() is called on x (type unknown here); fixlib.engine.Reader had it in "
                               "the baseline and no longer has it")


def test_unchanged_uses_report_nothing(lib: Lib) -> None:
    """Every use in this module still works the same in v2."""
    module = "client_clean.py"
    assert_exact(lib, module, audit(lib, module))


# --------------------------------------------------------------------------------------------
# Further cases, each in its own client module
# --------------------------------------------------------------------------------------------


def test_local_factory_defined_after_use(lib: Lib) -> None:
    """A local `-> fixlib.Engine` factory is known to the whole module, not only below its definition."""
    module = "client_forward_ref.py"
    assert_exact(lib, module, audit(lib, module))


def test_pydantic_dataclass_accepts_positional_arguments(lib: Lib) -> None:
    """Pydantic dataclasses take fields positionally (like dataclasses): only the missing InitVar is reported."""
    module = "client_pydantic_positional.py"
    result = audit(lib, module)
    assert_exact(lib, module, result)
    finding = at(lib, module, result, "initvar-positional")
    assert problems(finding) == ["missing required argument(s) 'secret'"]
    assert finding.baseline_signature == "Conn(host: str, secret: InitVar[str | None] = None)"
    assert finding.target_signature == "Conn(host: str, secret: InitVar[str])"


def test_msgspec_struct_accepts_positional_arguments(lib: Lib) -> None:
    """msgspec Structs take fields positionally unless kw_only=True: only the new required field is reported."""
    module = "client_msgspec_positional.py"
    result = audit(lib, module)
    assert_exact(lib, module, result)
    assert problems(at(lib, module, result, "struct-positional")) == ["missing required argument(s) 'ts'"]


def test_field_specifiers(lib: Lib) -> None:
    """`attrs.field(default=0, ...)` has default 0 (unchanged from `= 0`); `field(repr=False)` has none (required)."""
    module = "client_field_specifiers.py"
    result = audit(lib, module)
    assert_exact(lib, module, result)
    assert problems(at(lib, module, result, "field-required")) == ["missing required argument(s) 'label'"]


def test_failed_import_hides_only_its_own_name(lib: Lib) -> None:
    """`from fixlib import run_job` failing hides `run_job(...)`, not `fixlib.run_job_async(...)`."""
    module = "client_import_prefix.py"
    assert_exact(lib, module, audit(lib, module))


def test_compatibility_code_is_not_checked(lib: Lib) -> None:
    """try/except ImportError and `__version__` branches are skipped; code after them is checked."""
    module = "client_guards.py"
    assert_exact(lib, module, audit(lib, module))


def test_if_test_naming_conversion_is_not_a_version_check(lib: Lib) -> None:
    """`if do_conversion:` guards nothing: the call under it is checked."""
    module = "client_guard_words.py"
    assert_exact(lib, module, audit(lib, module))


def test_return_changed_in_other_test_and_iteration_forms(lib: Lib) -> None:
    """`if not f()`, `while f()` test the result; a comprehension iterates it."""
    module = "client_returns_more.py"
    assert_exact(lib, module, audit(lib, module))


# --------------------------------------------------------------------------------------------
# Without a baseline, select, unparsable files, errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", DRIFT_MODULES)
def test_without_baseline_only_target_errors(lib: Lib, module: str) -> None:
    """Without a baseline: the errors decidable from the target alone, no warnings, no baseline text."""
    result = audit(lib, module, baseline=False)
    assert_exact(lib, module, result, baseline=False)
    assert all(f.severity == "error" for f in result.findings)
    assert all(f.baseline_signature is None for f in result.findings)
    assert result.summary["baseline"] is None


def test_select_filters_kinds(lib: Lib) -> None:
    """`select` keeps only the named kinds, on a module and on the whole client package."""
    result = audit(lib, "client_calls.py", select={"call-mismatch"})
    assert_exact(lib, "client_calls.py", result)
    whole = run_audit([lib.client], against=str(lib.v2), baseline=str(lib.v1))
    chosen = run_audit([lib.client], against=str(lib.v2), baseline=str(lib.v1), select={"call-mismatch"})
    assert chosen.findings == [f for f in whole.findings if f.kind == "call-mismatch"]
    assert {f.kind for f in whole.findings} - {"call-mismatch"}
    none = audit(lib, "client_defaults.py", select={"call-mismatch"})
    assert none.findings == [] and none.summary["warnings"] == 0


def test_whole_client_package_is_the_union_of_its_modules(lib: Lib) -> None:
    """Auditing the client directory reports what the modules report one by one, nothing more."""
    whole = run_audit([lib.client], against=str(lib.v2), baseline=str(lib.v1))
    one_by_one = [f for name in CLIENT if name.startswith("client_") for f in audit(lib, name).findings]
    assert rows(whole.findings) == rows(one_by_one)
    assert whole.summary["files"] == len(CLIENT)


def test_unparsable_file_is_one_warning(lib: Lib) -> None:
    """A syntax error gives one `unparsable` warning for the file, at the error's line."""
    result = run_audit([lib.broken], against=str(lib.v2), baseline=str(lib.v1))
    assert rows(result.findings) == [("unparsable", str(lib.broken), line_of(lib.broken, "syntax"), "warning")]
    assert result.summary == {**result.summary, "errors": 0, "warnings": 1, "files": 1}
    assert result.findings[0].path == str(lib.broken)


def test_unknown_select_kind_is_an_error(lib: Lib) -> None:
    """An unknown kind in `select` is a user error."""
    with pytest.raises(EyasError, match="unknown kind"):
        audit(lib, "client_calls.py", select={"call-mismatch", "no-such-kind"})


def test_missing_client_path_is_an_error(lib: Lib) -> None:
    """A client path that does not exist is a user error."""
    with pytest.raises(EyasError, match="no such file"):
        run_audit([lib.client / "absent.py"], against=str(lib.v2), baseline=str(lib.v1))


# --------------------------------------------------------------------------------------------
# The CLI
# --------------------------------------------------------------------------------------------


def test_cli_json_exits_1_on_errors(lib: Lib, run_cli: Callable[..., Any]) -> None:
    """`--format json` prints the findings and summary of run_audit; errors make the exit code 1."""
    done = run_cli("audit", lib.client, "--against", lib.v2, "--baseline", lib.v1, "--format", "json")
    assert done.code == 1, done.err
    report = json.loads(done.out)
    assert set(report) == {"findings", "summary"}
    expected = run_audit([lib.client], against=str(lib.v2), baseline=str(lib.v1))
    assert report["findings"] == [f.as_dict() for f in expected.findings]
    summary = {k: v for k, v in report["summary"].items() if k != "seconds"}
    assert summary == {k: v for k, v in expected.summary.items() if k != "seconds"}
    assert summary["errors"] > 0 and summary["warnings"] > 0


def test_cli_sarif(lib: Lib, run_cli: Callable[..., Any]) -> None:
    """`--format sarif` prints SARIF 2.1.0 with one result per finding."""
    done = run_cli("audit", lib.client, "--against", lib.v2, "--baseline", lib.v1, "--format", "sarif")
    assert done.code == 1, done.err
    sarif = json.loads(done.out)
    assert sarif["version"] == "2.1.0"
    findings = run_audit([lib.client], against=str(lib.v2), baseline=str(lib.v1)).findings
    results = sarif["runs"][0]["results"]
    assert len(results) == len(findings)
    assert [r["ruleId"] for r in results] == [f.kind for f in findings]
    assert "call-mismatch" in {r["ruleId"] for r in results}
    rules = {rule["id"] for rule in sarif["runs"][0]["tool"]["driver"]["rules"]}
    assert rules == {f.kind for f in findings}
    first = results[0]["locations"][0]["physicalLocation"]
    assert first["region"]["startLine"] == findings[0].line


def test_cli_exits_0_without_errors(lib: Lib, run_cli: Callable[..., Any]) -> None:
    """No findings, or warnings only: exit code 0."""
    clean = run_cli("audit", lib.module("client_clean.py"), "--against", lib.v2, "--baseline", lib.v1,
                    "--format", "json")
    assert clean.code == 0, clean.err
    assert json.loads(clean.out)["findings"] == []
    warned = run_cli("audit", lib.module("client_defaults.py"), "--against", lib.v2, "--baseline", lib.v1,
                     "--format", "json")
    assert warned.code == 0, warned.err
    summary = json.loads(warned.out)["summary"]
    assert summary["errors"] == 0 and summary["warnings"] == 2
