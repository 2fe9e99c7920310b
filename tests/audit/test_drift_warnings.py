"""Drift beyond call shapes, warned with the evidence (a baseline is given): a method gone from the one
class that had it, reached through an untyped receiver; a result whose shape changed where the client
indexes or unpacks it; a default changed on a config the client loads and never sets; a method that now
raises unless another is called first; a new method whose docstring says it must follow another.
Each has a negative twin that must stay silent."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write_tree

from eyas.audit.run import run_audit

V1 = {
    "drift/__init__.py": "from .core import Engine, Loader, RunConfig, pair\n",
    "drift/core.py": '''\
import dataclasses


@dataclasses.dataclass
class RunConfig:
    flag: bool | None = None
    size: int = 1

    @classmethod
    def load(cls, path):
        return cls()


class Engine:
    def old_name(self):
        return 1

    def fetch(self):
        return [self]

    def step(self):
        return 2

    def prepare(self):
        return 3

    def load(self):
        return 4

    def append(self, x):
        return x


class Loader:
    def shared(self):
        return 0


class Other:
    def shared(self):
        return 0


def pair():
    return (1, 2)
''',
}
V2 = {
    "drift/__init__.py": "from .core import Engine, Loader, RunConfig, pair\n",
    "drift/core.py": '''\
import dataclasses


@dataclasses.dataclass
class RunConfig:
    flag: bool | None = True
    size: int = 1

    @classmethod
    def load(cls, path):
        return cls()


class Engine:
    def new_name(self):
        return 1

    def fetch(self):
        return self

    def step(self):
        if not getattr(self, "_ready", False):
            raise RuntimeError("Engine not prepared: call `prepare()` first")
        return 2

    def prepare(self):
        self._ready = True

    def load(self):
        return 4

    def finalize(self):
        """Must be called after load(): it moves the weights in place."""


class Loader:
    pass


class Other:
    pass


def pair():
    return (1, 2, 3)
''',
}
CLIENT = '''\
from drift import Engine, RunConfig, pair


class Holder:
    def __init__(self, model):
        self.model = model

    def run(self):
        return self.model.old_name()  # <- untyped


def use(items: list):
    items.append(1)
    first = Engine().fetch()[0]  # <- index
    a, b = pair()  # <- unpack
    config = RunConfig.load("x.yaml")  # <- loaded
    engine = Engine()
    engine.step()  # <- step
    engine.load()  # <- load
    return first, a, b, config, items.pop()
'''


def line_of(text: str, marker: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.endswith(f"# <- {marker}"))


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    write_tree(tmp_path / "v1", V1)
    write_tree(tmp_path / "v2", V2)
    return tmp_path


def audit(tree: Path, client: str) -> set[tuple[str, str, int]]:
    (tree / "client").mkdir(exist_ok=True)
    (tree / "client" / "use.py").write_text(client)
    result = run_audit([tree / "client"], str(tree / "v2"), str(tree / "v1"))
    assert result.errors == 0, [f.message for f in result.findings if f.severity == "error"]
    return {(f.kind, f.symbol, f.line) for f in result.findings}


def test_each_drift_is_warned_where_the_client_depends_on_it(tree: Path) -> None:
    found = audit(tree, CLIENT)
    assert found == {
        ("method-removed", "self.model.old_name", line_of(CLIENT, "untyped")),
        ("return-changed", "drift.Engine.fetch", line_of(CLIENT, "index")),
        ("return-changed", "drift.pair", line_of(CLIENT, "unpack")),
        ("default-changed", "drift.RunConfig.flag", 1),  # the class's first use: its import
        ("protocol-change", "drift.Engine.step", line_of(CLIENT, "step")),
        ("protocol-change", "drift.core.Engine.finalize", 1),
    }


def test_the_evidence_is_in_the_message(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tree / "client").mkdir()
    (tree / "client" / "use.py").write_text(CLIENT)
    findings = run_audit([tree / "client"], str(tree / "v2"), str(tree / "v1")).findings
    by_kind = {f.kind + ":" + f.symbol: f for f in findings}
    assert by_kind["method-removed:self.model.old_name"].fix == "likely replacement: new_name"
    assert "drift.core.Engine had it in the baseline" in by_kind["method-removed:self.model.old_name"].message
    assert "from a list of 1 to a value" in by_kind["return-changed:drift.Engine.fetch"].message
    assert "tuple of 2 to a tuple of 3" in by_kind["return-changed:drift.pair"].message
    assert "from None to True" in by_kind["default-changed:drift.RunConfig.flag"].message
    assert "call `prepare()` first" in by_kind["protocol-change:drift.Engine.step"].message
    assert by_kind["protocol-change:drift.Engine.step"].fix == "call prepare() before step()"


def test_silent_where_nothing_is_proven(tree: Path) -> None:
    client = '''\
from drift import Engine, RunConfig


class Mine:
    def old_name(self):
        return 0


def use(thing, other):
    thing.old_name()  # the client defines old_name itself
    other.shared()  # two classes of the baseline defined shared
    other.append(1)  # a list method
    config = RunConfig(flag=False)  # constructed and set
    engine = Engine()
    engine.prepare()
    engine.step()  # prepare() is called
    engine.finalize()
    return config
'''
    assert audit(tree, client) == set()
