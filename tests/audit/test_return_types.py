"""Instances typed by the package's own return annotations: a package function or method annotated
`-> "Engine"` / `-> Optional[Engine]` (a class defined later in the module included) gives an
Engine, so its missing members and unbindable method calls are found, through chains like
`make().clone().x`."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write_tree

from eyas.audit.run import run_audit

FILES = {
    "lib/rtlib/__init__.py": ("from typing import Optional\nfrom .core import Engine\n\n"
                              "def make(x) -> \"Engine\":\n    return Engine()\n\n"
                              "def maybe() -> Optional[Engine]:\n    return None\n"),
    "lib/rtlib/core.py": ("class Engine:\n    def clone(self) -> \"Engine\":\n        return self\n\n"
                          "    def run(self, n):\n        return n\n"),
    "client/use.py": ("import rtlib\n\ne = rtlib.make(1)\ne.gone()\ne.run(1, 2)\nrtlib.maybe().vanished\n"
                      "e.clone().missing_too\ne.clone().run(3)\n"),
}


def test_return_annotations_type_the_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    write_tree(tmp_path, FILES)
    result = run_audit([tmp_path / "client"], str(tmp_path / "lib"))
    assert [(f.kind, f.symbol, f.line) for f in result.findings] == [
        ("missing-attribute", "rtlib.core.Engine.gone", 4),
        ("call-mismatch", "rtlib.core.Engine.run", 5),
        ("missing-attribute", "rtlib.core.Engine.vanished", 6),
        ("missing-attribute", "rtlib.core.Engine.missing_too", 7),
    ]
