"""The API model against Python itself: for a fixture package holding every class-construction form
the issue names (and the real packages installed here), eyas's modelled signatures are compared with
`inspect.signature` of the imported objects by `eyas.audit.oracle`. No mismatch may be able to give a
wrong error; the fixture forms must all match; and calls that bind at run time give no finding."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from conftest import write_tree

from eyas.audit.oracle import package_fidelity
from eyas.audit.run import run_audit

LIBRARY = {
    "oraclelib/__init__.py": "from .forms import *\nfrom .forms import __all__\n",
    "oraclelib/forms.py": '''
import dataclasses
import enum
import functools
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import Protocol
from typing_extensions import dataclass_transform

__all__ = ["OwnInit", "Options", "Marked", "Ordered", "Colour", "Reader", "FileReader", "Model", "ModelField",
           "model", "Based", "BasedChild", "Meta", "Metaed", "wrapped", "forwarded", "Service", "Refusing",
           "Strict", "strict"]


@dataclass
class OwnInit:
    choices: list
    def __init__(self, first, *rest):
        self.choices = [first, *rest]


@dataclass(kw_only=True)
class Options:
    a: int
    b: int = 2


@dataclass
class Marked:
    x: int
    _: KW_ONLY
    y: int = 0
    z: InitVar[int] = 1
    hidden: int = field(default=0, init=False)


@dataclass
class Base:
    a: int
    b: int = 1


@dataclass
class Ordered(Base):
    a: int = 5
    c: int = 3


class Colour(enum.Enum):
    RED = 1
    def __init__(self, value):
        self.code = value


class Reader(Protocol):
    def read(self, n: int) -> bytes: ...


class FileReader(Reader):
    def read(self, n: int) -> bytes:
        return b""


def ModelField(*, default=None, alias=None, init=True):
    return default


@dataclass_transform(kw_only_default=True, field_specifiers=(ModelField,))
def model(cls):
    names = [n for n in cls.__dict__.get("__annotations__", {})]
    defaults = {n: getattr(cls, n) for n in names if hasattr(cls, n)}
    aliases = {"size": "n"}
    def __init__(self, **kwargs):
        for name in names:
            setattr(self, name, kwargs.get(aliases.get(name, name), defaults.get(name)))
    params = [__import__("inspect").Parameter(aliases.get(n, n), __import__("inspect").Parameter.KEYWORD_ONLY,
              **({"default": defaults[n]} if n in defaults else {})) for n in names]
    __init__.__signature__ = __import__("inspect").Signature([__import__("inspect").Parameter("self", 1), *params])
    cls.__init__ = __init__
    return cls


@model
class Model:
    name: str
    size: int = ModelField(default=3, alias="n")


@dataclass_transform()
class Based:
    def __init_subclass__(cls):
        dataclasses.dataclass(cls)


class BasedChild(Based):
    p: int
    q: str = "q"


@dataclass_transform()
class Meta(type):
    def __new__(mcs, name, bases, namespace):
        cls = super().__new__(mcs, name, bases, namespace)
        return dataclasses.dataclass(cls) if namespace.get("__annotations__") else cls


class Metaed(metaclass=Meta):
    u: int


def blind(function):
    def wrapper(*args, **kwargs):
        return function(*args, **kwargs)
    return wrapper


def keeping(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return function(*args, **kwargs)
    return wrapper


@blind
def wrapped(a, b):
    return a


@keeping
def forwarded(a, b=1):
    return a


class Service:
    def run(self, a, b=2):
        return a


class Refusing(Service):
    def run(self, *args, **kwargs):
        raise NotImplementedError("not supported")  # peft's OSFModel.unmerge_adapter


def strict(cls):
    def validate(self):
        return True
    cls.validate = validate
    return cls


@strict
@dataclass
class Strict:
    a: int
''',
    "client/use.py": '''import oraclelib

oraclelib.OwnInit(1, 2, 3)
oraclelib.Options(a=1)
oraclelib.Marked(1, y=2, z=3)
oraclelib.Ordered(1, 2, 3)
oraclelib.Colour(1)
oraclelib.FileReader()
oraclelib.Model(name="m", n=4)
oraclelib.BasedChild(1, "x")
oraclelib.Metaed(u=1)
oraclelib.wrapped(1, b=2)
oraclelib.forwarded(1, b=2)
oraclelib.Refusing().run(1, 2, 3, extra=4)
oraclelib.Strict(1).validate()
oraclelib.forwarded(1, c=2)
''',
}


@pytest.fixture(scope="module")
def oraclelib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_tree(tmp_path_factory.mktemp("oracle"), LIBRARY)
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    yield root
    sys.path.remove(str(root))
    for name in [n for n in sys.modules if n.split(".")[0] == "oraclelib"]:
        del sys.modules[name]


def test_every_construction_form_matches_python(oraclelib: Path) -> None:
    fidelity = package_fidelity("oraclelib", roots=[oraclelib])
    verdicts = {c.qualname.removeprefix("oraclelib."): c for c in fidelity.comparisons}
    wrong = {name: (c.modelled, c.live) for name, c in verdicts.items() if c.verdict not in ("matched", "no_signature")
             and name not in ("FileReader", "Strict.validate")}
    assert wrong == {}
    assert verdicts["Reader"].verdict == "no_signature"  # Python refuses to instantiate a protocol
    assert verdicts["Meta"].verdict == "no_signature"  # a metaclass: type's C constructor
    # typing's stand-in init below a protocol: CPython 3.11 hands on to object (no arguments), typing_extensions'
    # takes anything; eyas takes anything, so it never errs on either
    assert verdicts["FileReader"].modelled == "(*args, **kwargs)" and not verdicts["FileReader"].error_capable
    assert verdicts["Strict.validate"].verdict == "unknown"  # set by a class decorator: exists, signature unread
    assert verdicts["Model"].live == "(*, name, n=...)" and verdicts["Marked"].live == "(x, *, y=..., z=...)"
    assert fidelity.error_capable == []


def test_calls_that_bind_at_run_time_give_no_finding(oraclelib: Path, monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    for line in LIBRARY["client/use.py"].splitlines()[2:-1]:  # each call binds: executed here as proof
        try:
            exec(line, {"oraclelib": importlib.import_module("oraclelib")})
        except NotImplementedError:
            pass  # bound, then refused by the method's body
    with pytest.raises(TypeError):
        importlib.import_module("oraclelib").forwarded(1, c=2)
    result = run_audit([oraclelib / "client"], str(oraclelib))
    assert [(f.line, f.kind, f.symbol) for f in result.findings] == [(16, "call-mismatch", "oraclelib.forwarded")]


@pytest.mark.parametrize("package", ["pydantic", "accelerate", "safetensors", "peft", "torch"])
def test_installed_packages_have_no_error_capable_mismatch(package: str) -> None:
    pytest.importorskip(package)
    fidelity = package_fidelity(package)
    assert fidelity.compared > 10
    assert [(c.qualname, c.modelled, c.live) for c in fidelity.error_capable] == []
