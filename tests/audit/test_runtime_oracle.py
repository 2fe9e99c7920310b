"""The API model against Python itself: for a fixture package holding every class-construction form
the issue names (and the real packages installed here), eyas's modelled signatures are compared with
`inspect.signature` of the imported objects by `eyas.audit.oracle`. No mismatch may be able to give a
wrong error; the fixture forms must all match; and calls that bind at run time give no finding."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import importable_tree

from eyas.audit.oracle import package_fidelity
from eyas.audit.run import run_audit

LIBRARY = {
    "oraclelib/__init__.py": ("from .forms import *\nfrom .forms import __all__\n"
                              "from .tool import tool  # rebinds the submodule's name\n__all__ = [*__all__, 'tool']\n"),
    "oraclelib/tool.py": "def tool(path, *, strict=False):\n    return path\n",
    "oraclelib/forms.py": '''
import collections
import dataclasses
import enum
import functools
import inspect
import uuid
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import Protocol
from typing_extensions import dataclass_transform

FLAG = True

__all__ = ["OwnInit", "Options", "Marked", "Ordered", "Colour", "Reader", "FileReader", "Model", "ModelField",
           "model", "Based", "BasedChild", "Meta", "Metaed", "wrapped", "forwarded", "Service", "Refusing",
           "Strict", "strict", "renamed", "renamed_open", "filtered", "Returns", "Lazy", "ConfigBase", "ChildConfig",
           "old_name", "Aliased", "Id", "Switched", "Point", "fetch"]


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


def rename_keyword(old, new=None):  # transformers' deprecate_kwarg
    def decorate(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            if old in kwargs and new is not None:
                kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)
        return wrapper
    return decorate


@rename_keyword("past", new="cache")
def renamed(x, cache):
    return x


@rename_keyword("past", new="cache")
def renamed_open(x, cache=None, **kwargs):
    return x


def drop_unknown(function):  # transformers' filter_out_non_signature_kwargs
    names = set(inspect.signature(function).parameters)
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return function(*args, **{k: v for k, v in kwargs.items() if k in names})
    return wrapper


@drop_unknown
def filtered(a, b=1):
    return a


def tuple_on_request(function):  # transformers' can_return_tuple
    @functools.wraps(function)
    def wrapper(self, *args, **kwargs):
        as_tuple = kwargs.pop("return_tuple", False)
        output = function(self, *args, **kwargs)
        return (output,) if as_tuple else output
    return wrapper


class Returns:
    @tuple_on_request
    def run(self, a):
        return a


class Lazy:  # torch's Module: a forwarder to object, and an instance __getattr__
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)

    def __getattr__(self, name):
        raise AttributeError(name)


@dataclass_transform(kw_only_default=True)
@dataclass
class ConfigBase:  # transformers' PreTrainedConfig: its own fields positional, its subclasses' keyword-only
    name: str = "base"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        dataclass(cls, kw_only=True)


class ChildConfig(ConfigBase):
    size: int = 2


def _current_name(a, b=1):
    return a


old_name = functools.lru_cache()(_current_name)


class Aliased:
    run = _current_name
    make = classmethod(_current_name)


class Id(uuid.UUID):  # a standard-library base
    pass


Point = collections.namedtuple("Point", "x, y", defaults=(0,))


def retrying(function):  # vLLM's _sync_retry: sets the keyword itself
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        kwargs["timeout"] = kwargs.get("timeout") or 1.0
        return function(*args, **kwargs)
    return wrapper


@retrying
def fetch(url, *, timeout):
    return url


if FLAG:
    class Switched:
        def __init__(self, a):
            self.a = a
else:
    class Switched:  # the fallback
        pass
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
oraclelib.renamed(1, past=2)
oraclelib.renamed_open(1, past=2, other=3)
oraclelib.filtered(1, unknown=3)
oraclelib.Returns().run(1, return_tuple=True)
oraclelib.Lazy()
oraclelib.ChildConfig("n", size=3)
oraclelib.old_name(1, b=2)
oraclelib.Aliased().run(1)
oraclelib.Aliased.make(1)
oraclelib.Id(int=5)
oraclelib.Switched(1)
oraclelib.tool("p", strict=True)
oraclelib.Point(1)
oraclelib.fetch("u")
oraclelib.forwarded(1, c=2)
''',
}


@pytest.fixture(scope="module")
def oraclelib(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from importable_tree(tmp_path_factory.mktemp("oracle"), LIBRARY, ("oraclelib",))


def test_every_construction_form_matches_python(oraclelib: Path) -> None:
    fidelity = package_fidelity("oraclelib", roots=[oraclelib])
    verdicts = {c.qualname.removeprefix("oraclelib."): c for c in fidelity.comparisons}
    wrong = {name: (c.modelled, c.live) for name, c in verdicts.items() if c.verdict not in ("matched", "no_signature")
             and name != "FileReader"}
    assert wrong == {}
    assert verdicts["Reader"].verdict == "no_signature"  # Python refuses to instantiate a protocol
    assert verdicts["Meta"].verdict == "no_signature"  # a metaclass: type's C constructor
    # typing's stand-in init below a protocol: CPython 3.11 hands on to object (no arguments), typing_extensions'
    # takes anything; eyas takes anything, so it never errs on either
    assert verdicts["FileReader"].modelled == "(*args, **kwargs)" and not verdicts["FileReader"].error_capable
    assert verdicts["Strict.validate"].modelled == "()"  # the function a class decorator sets, its signature read
    # what the wrappers do with their keywords, on both sides: a renamed keyword binds and the new one is optional,
    # a filtering wrapper takes any keyword, a taken-out literal keyword binds
    assert verdicts["renamed"].live == "(x, cache=..., *, past=None)"
    assert verdicts["filtered"].live == "(a, b=..., **kwargs)" and verdicts["Returns.run"].live == "(a, *, return_tuple=None)"
    assert verdicts["Lazy"].live == "()" and verdicts["ChildConfig"].live == "(name=..., *, size=...)"
    assert verdicts["Switched"].live == "(a)" and verdicts["tool"].live == "(path, *, strict=...)"
    assert verdicts["Point"].live == "(x, y=...)" and verdicts["fetch"].live == "(url, *, timeout=...)"
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
    assert [(f.line, f.kind, f.symbol) for f in result.findings] == [(30, "call-mismatch", "oraclelib.forwarded")]


@pytest.mark.parametrize("package", ["pydantic", "accelerate", "safetensors", "peft", "torch", "transformers"])
def test_installed_packages_match_python(package: str) -> None:
    pytest.importorskip(package)
    fidelity = package_fidelity(package)
    assert fidelity.compared > 10
    assert [(c.qualname, c.modelled, c.live) for c in fidelity.error_capable] == []
    not_matched = [(c.qualname, c.verdict, c.modelled, c.live) for c in fidelity.comparisons
                   if c.verdict in ("mismatched", "unknown")]
    assert fidelity.matched_share >= 0.995, not_matched
