"""The live ground truth (`eyas.audit.groundtruth`): uses of a package judged by importing it and binding
with `inspect` in a fresh interpreter, and the scoring of a tool's error lines against it. Every verdict
here is what Python does with the package below (the calls marked ok are executed to prove it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import write_tree

from eyas.audit.groundtruth import judge_in, score, site_key
from eyas.audit.signature import CallShape
from eyas.audit.usage import Usage

PACKAGE = {"gtpkg/__init__.py": '''\
import dataclasses
import functools


def f(a, b=1):
    return a


@dataclasses.dataclass
class Point:
    x: int
    y: int = 0


class Bag(dict):
    def __init__(self, size, **rest):
        super().__init__(**rest)
        self.size = size


class Plain:
    def __init__(self):
        self.ready = True

    def run(self, steps):
        return steps


class Dynamic:
    def __init__(self, **values):
        for key, value in values.items():
            setattr(self, key, value)


class Lazy:
    def __getattr__(self, name):
        return name


def _strict(a):
    return a


@functools.wraps(_strict)
def lenient(*args, **kwargs):
    return kwargs or args


def make_plain() -> Plain:
    return Plain()
'''}


def use(kind: str, target: str, member: str | None = None, positional: int = 0, *keywords: str, line: int = 1) -> Usage:
    call = CallShape(positional, tuple(keywords)) if kind in ("call", "member_call") else None
    return Usage(kind, "client.py", line, 1, target, member, call)  # type: ignore[arg-type]


CASES = [  # (use, verdict, the missing name when it fails)
    (use("import", "gtpkg.gone"), "fails", "gtpkg.gone"),
    (use("attribute", "gtpkg.nothing"), "fails", "gtpkg.nothing"),
    (use("attribute", "gtpkg.f"), "ok", ""),
    (use("call", "gtpkg.f", None, 1), "ok", ""),
    (use("call", "gtpkg.f", None, 1, "c"), "fails", ""),
    (use("call", "gtpkg.Point", None, 0, "x"), "ok", ""),
    (use("call", "gtpkg.Point", None, 0), "fails", ""),
    (use("call", "gtpkg.Bag", None, 1, "anything"), "ok", ""),  # dict.__new__ takes what __init__ takes
    (use("call", "gtpkg.lenient", None, 2), "unknown", ""),  # the wrapper takes it, what it wraps refuses it
    (use("call", "gtpkg.lenient", None, 1), "ok", ""),
    (use("member", "gtpkg.Plain", "ready"), "ok", ""),  # assigned in __init__
    (use("member", "gtpkg.Plain", "steps"), "fails", "gtpkg.Plain.steps"),
    (use("member", "gtpkg.make_plain", "ready"), "ok", ""),  # the class from the return annotation
    (use("member", "gtpkg.Dynamic", "anything"), "unknown", ""),
    (use("member", "gtpkg.Lazy", "anything"), "unknown", ""),
    (use("member_call", "gtpkg.Plain", "run", 1), "ok", ""),
    (use("member_call", "gtpkg.Plain", "run", 0, "stride"), "fails", ""),
    (use("override", "gtpkg.Plain", "run"), "ok", ""),
    (use("override", "gtpkg.Plain", "walk"), "fails", "gtpkg.Plain.walk"),
]


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    write_tree(tmp_path / "site", PACKAGE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return tmp_path


def test_each_verdict_is_what_python_does(package: Path, tmp_path: Path) -> None:
    write_tree(tmp_path / "site", {"gtpkg-0.dist-info/METADATA": "Metadata-Version: 2.1\nName: gtpkg\nVersion: 0\n"})
    version, truth = judge_in(sys.executable, [u for u, _, _ in CASES], "gtpkg", tmp_path)
    assert version == "0"
    got = {site_key(u): (truth[site_key(u)][0], truth[site_key(u)][2]) for u, _, _ in CASES}
    assert got == {site_key(u): (verdict, gone) for u, verdict, gone in CASES}

    import gtpkg  # the ok calls run, the failing ones raise TypeError

    gtpkg.f(1)
    gtpkg.Point(x=1)
    assert gtpkg.Bag(1, anything=2)["anything"] == 2
    gtpkg.lenient(1)
    assert gtpkg.make_plain().ready and gtpkg.Plain().run(1) == 1
    for bad in (lambda: gtpkg.f(1, c=2), lambda: gtpkg.Point(), lambda: gtpkg.Plain().run(stride=1)):
        with pytest.raises(TypeError):
            bad()


def test_score_counts_one_break_per_missing_name_per_file() -> None:
    uses = [use("import", "pkg.Gone", line=1), use("call", "pkg.Gone", None, 0, line=5),
            use("call", "pkg.f", None, 0, "old", line=7), use("attribute", "pkg.g", line=9),
            use("attribute", "pkg.h", line=11), use("attribute", "pkg.lazy", line=13)]
    before = {site_key(u): ("ok", "", "") for u in uses}
    after = {site_key(uses[0]): ("fails", "", "pkg.Gone"), site_key(uses[1]): ("fails", "", "pkg.Gone"),
             site_key(uses[2]): ("fails", "", ""), site_key(uses[3]): ("ok", "", ""),
             site_key(uses[4]): ("ok", "", ""), site_key(uses[5]): ("unknown", "", "")}
    scored = score({("client.py", 1), ("client.py", 9), ("client.py", 13), ("client.py", 20)}, uses, before, after)
    assert scored.summary() == {"breaks": 2, "found": 1, "recall": 0.5, "wrong_errors": 1, "unconfirmed_errors": 2}
    assert scored.wrong == {("client.py", 9)}  # pkg.g works in both
    assert scored.unconfirmed == {("client.py", 13), ("client.py", 20)}  # undecided; no use judged on line 20
