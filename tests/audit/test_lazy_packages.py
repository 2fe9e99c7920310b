"""A lazy package as transformers 4.57 builds one, against Python: the module replaces itself in
`sys.modules` by a lazy module serving what `define_import_structure` finds under `models/` (every file's
`__all__`, newer models its TYPE_CHECKING imports miss) and a literal `_import_structure` dict; its
TYPE_CHECKING block star-imports a misspelt module nothing runs; a module-level loop imports; an auto
class's classmethod is a copy of its base's made with `update_wrapper` from the bound method; and a
class built on a placeholder the lazy module makes at run time. eyas must resolve what Python serves,
still say a name nobody serves does not exist, and the oracle must compare what Python itself gives."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import importable_tree, prove_by_running

from eyas.audit.oracle import package_fidelity
from eyas.audit.run import run_audit

LAZY = {
    "lazylib/_lazy.py": '''
import ast
import importlib
import types
from pathlib import Path


def define_import_structure(directory, prefix):
    structure = {}
    for path in sorted(Path(directory).rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__all__":
                module = ".".join((prefix, *path.relative_to(directory).with_suffix("").parts))
                structure.update({name: module for name in ast.literal_eval(node.value)})
    return structure


class LazyModule(types.ModuleType):
    def __init__(self, name, file, structure):
        super().__init__(name)
        self.__file__ = file
        self.__path__ = [str(Path(file).parent)]
        self._structure = structure
        self.__all__ = sorted(structure)

    def __getattr__(self, name):
        if name not in self._structure:
            raise AttributeError(name)
        value = getattr(importlib.import_module(f"{self.__name__}.{self._structure[name]}"), name)
        setattr(self, name, value)
        return value


def placeholder(name):
    class Placeholder:
        def __init__(self, *args, **kwargs):
            raise ImportError(f"{name} needs a backend that is not installed")
    return Placeholder
''',
    "lazylib/__init__.py": '''
from pathlib import Path
from typing import TYPE_CHECKING

from ._lazy import LazyModule, define_import_structure

_import_structure = {"integrations.quant": ["quantize"]}

if TYPE_CHECKING:
    from .models import *
else:
    import sys

    structure = define_import_structure(Path(__file__).parent / "models", prefix="models")
    structure.update({name: module for module, names in _import_structure.items() for name in names})
    sys.modules[__name__] = LazyModule(__name__, __file__, structure)
''',
    "lazylib/checks.py": '''
for _backend in ("quant", "other"):
    if _backend == "quant":
        from .integrations.quant import quantize
    elif _backend == "other":
        from .integrations.quant import dequantize
''',
    "lazylib/integrations/__init__.py": "",
    "lazylib/integrations/quant.py": "def quantize(x, bits=8):\n    return x\n\n\ndef dequantize(x):\n    return x\n",
    "lazylib/models/__init__.py": '''
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .old import *
    from .auto import *
    from .typo_modul import *
''',
    "lazylib/models/old.py": '''
from .._lazy import placeholder
from ..integrations.quant import quantize as _quantize

Backend = placeholder("Backend")

__all__ = ["OldConfig", "OldTokenizer"]


class OldConfig:
    def __init__(self, size=1):
        self.size = size


class OldTokenizer(Backend):
    pass
''',
    "lazylib/models/new/__init__.py": "",
    "lazylib/models/new/configuration_new.py": '''
__all__ = ["NewConfig"]


class NewConfig:
    def __init__(self, size=1, *, layers=2):
        self.size, self.layers = size, layers
''',
    "lazylib/models/auto.py": '''
import functools
import types

__all__ = ["AutoModel"]


class Auto:
    @classmethod
    def load(cls, name, *args, **kwargs):
        return cls


def copy_func(function):
    copied = types.FunctionType(function.__code__, function.__globals__, function.__name__, function.__defaults__,
                                function.__closure__)
    return functools.update_wrapper(copied, function)


class AutoModel(Auto):
    pass


AutoModel.load = classmethod(copy_func(Auto.load))
''',
    "client/use.py": '''import lazylib
from lazylib.checks import dequantize, quantize
from lazylib.integrations import quant

lazylib.OldConfig(size=2)
lazylib.NewConfig(3, layers=4)
lazylib.quantize(1, bits=4)
lazylib.AutoModel.load("x", 1, k=2)
quantize(2)
dequantize(3)
lazylib.NewConfig(4, heads=1)
lazylib.NotServed()
quant.quantize(5, scale=2)
''',
}


@pytest.fixture(scope="module")
def lazylib(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from importable_tree(tmp_path_factory.mktemp("lazy"), LAZY, ("lazylib",))


def test_what_the_lazy_module_serves_matches_python(lazylib: Path) -> None:
    fidelity = package_fidelity("lazylib", roots=[lazylib])
    verdicts = {c.qualname.removeprefix("lazylib."): c for c in fidelity.comparisons}
    assert {name: c.verdict for name, c in verdicts.items()
            if name in ("OldConfig", "NewConfig", "quantize", "AutoModel.load")} == dict.fromkeys(
        ("OldConfig", "NewConfig", "quantize", "AutoModel.load"), "matched")
    assert verdicts["NewConfig"].modelled == "(size=1, *, layers=2)"  # served from models/new, not TYPE_CHECKING
    assert verdicts["AutoModel.load"].live == "(name, *args, **kwargs)"  # not inspect's `(*args, **kwargs)`
    assert "OldTokenizer" not in verdicts  # built on a run-time placeholder: this environment, not the source
    assert [c for c in fidelity.comparisons if c.verdict in ("mismatched", "unknown")] == []


def test_calls_bind_as_at_run_time_and_a_name_nobody_serves_is_missing(lazylib: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    prove_by_running(LAZY["client/use.py"], binding=10)
    result = run_audit([lazylib / "client"], str(lazylib))
    assert [(f.line, f.kind, f.symbol) for f in result.findings] == [
        (11, "call-mismatch", "lazylib.NewConfig"), (12, "missing-attribute", "lazylib.NotServed"),
        (13, "call-mismatch", "lazylib.integrations.quant.quantize")]
