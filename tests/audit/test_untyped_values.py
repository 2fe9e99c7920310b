"""Members of values the API model does not type (a module's `__version__` string, a dict constant, a
class attribute, a function's dunders) are unknown, never missing: `transformers.__version__.split`
was reported as an error by eyas's own preflight. The name holding the value is still checked."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write_tree

from eyas.audit.run import run_audit

FILES = {
    "lib/vallib/__init__.py": ('__version__ = "2.1.0"\nDEFAULTS = {"a": 1}\n\n'
                               "class Engine:\n    registry = {}\n\n    def __init__(self):\n        self.state = []\n\n"
                               "def make():\n    return Engine()\n"),
    "client/use.py": ("import vallib\n\nmajor = vallib.__version__.split('.')[0]\nvallib.DEFAULTS.get('a')\n"
                      "vallib.Engine.registry.items()\nvallib.make.__name__\nvallib.gone_constant.split('.')\n"
                      "vallib.Engine.no_such_attribute.items()\n"),
}


def test_members_of_untyped_values_are_unknown_but_their_holders_are_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    write_tree(tmp_path, FILES)
    result = run_audit([tmp_path / "client"], str(tmp_path / "lib"))
    assert [(f.kind, f.severity, f.symbol, f.line) for f in result.findings] == [
        ("missing-attribute", "error", "vallib.gone_constant", 7),
        ("missing-attribute", "error", "vallib.Engine.no_such_attribute", 8),
    ]
