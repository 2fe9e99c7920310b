"""Star imports as Python runs them, through the text tests that spare parsing what a star import cannot
bind: a literal `__all__` decides alone (a name defined but not listed is not re-exported; one added by
`__all__ +=` is); without `__all__`, underscored names are not taken; a name spelt only inside another
word ("Regenerate" for `generate`) binds nothing; a lazy
package serves a submodule even when its TYPE_CHECKING star imports would bind that name. Each client
line is executed to prove which bind; the audit must report exactly the others."""

from __future__ import annotations

import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import importable_tree, prove_by_running

from eyas.audit.apimodel import ApiModel, Module
from eyas.audit.run import run_audit

STARS = {
    "starlib/__init__.py": "from .listed import *\nfrom .extended import *\nfrom .commented import *\n"
                           "from .unlisted import *\n",
    "starlib/listed.py": '__all__ = ["shown"]\n\n\ndef shown(x):\n    return x\n\n\ndef hidden(x):\n    return x\n',
    "starlib/extended.py": '__all__ = ["one"]\n__all__ += ["two"]\n\n\ndef one():\n    return 1\n\n\n'
                           'def two(y):\n    return y\n',
    "starlib/commented.py": '# Regenerate this file with tools/gen.py\n__all__ = [  # the public names\n    "third",\n]\n\n\n'
                            'def third():\n    return 3\n',
    "starlib/unlisted.py": 'def fourth(z, *, scale=1):\n    return z\n\n\ndef _private():\n    return 0\n',
    "lazystar/__init__.py": '''
import sys
import types
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .shadow import *
else:
    class _Lazy(types.ModuleType):
        def __getattr__(self, name):
            import importlib
            return importlib.import_module(f"{__name__}.{name}")

    _lazy = _Lazy(__name__)
    _lazy.__path__, _lazy.__file__ = __path__, __file__
    sys.modules[__name__] = _lazy
''',
    "lazystar/shadow.py": "def tools(a):\n    return a\n",
    "lazystar/tools.py": "def run(b, c=0):\n    return b\n",
    "client/use.py": '''import lazystar
import starlib

starlib.shown(1)
starlib.two(2)
starlib.third()
starlib.fourth(4, scale=2)
lazystar.tools.run(1, c=2)
starlib.hidden(1)
starlib.generate()
starlib._private()
starlib.two()
lazystar.tools.run(1, d=2)
''',
}


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from importable_tree(tmp_path_factory.mktemp("stars"), STARS, ("starlib", "lazystar"))


def test_star_imports_bind_what_python_binds(packages: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    prove_by_running(STARS["client/use.py"], binding=8)
    result = run_audit([packages / "client"], str(packages))
    assert sorted((f.line, f.kind, f.symbol) for f in result.findings) == [
        (9, "missing-attribute", "starlib.hidden"), (10, "missing-attribute", "starlib.generate"),
        (11, "missing-attribute", "starlib._private"), (12, "call-mismatch", "starlib.two"),
        (13, "call-mismatch", "lazystar.tools.run")]


def test_a_lazy_package_serves_its_submodule_over_a_type_checking_star_import(packages: Path) -> None:
    import lazystar

    assert isinstance(lazystar.tools, types.ModuleType)
    assert isinstance(ApiModel([packages]).lookup("lazystar.tools"), Module)
