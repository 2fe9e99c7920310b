"""Star imports re-export what the star-imported module's `__all__` lists (everything public without
one), and names under `if TYPE_CHECKING:` count as re-exports of a lazy package."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write_tree

from eyas.audit.run import run_audit

FILES = {
    "pkg/starlib/__init__.py": ("from typing import TYPE_CHECKING\nfrom .listed import *\nfrom .open import *\n"
                                "if TYPE_CHECKING:\n    from .lazy import Lazy\n"),
    "pkg/starlib/listed.py": "__all__ = ['Public']\n\nclass Public: ...\n\nclass Private: ...\n",
    "pkg/starlib/open.py": "class Other: ...\n",
    "pkg/starlib/lazy.py": "class Lazy: ...\n",
    "client/use.py": ("from starlib import Public  # <- public\nfrom starlib import Private  # <- private\n"
                      "from starlib import Other  # <- other\nfrom starlib import Lazy  # <- lazy\n"),
}


def test_star_imports_follow_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    write_tree(tmp_path, FILES)
    result = run_audit([tmp_path / "client"], str(tmp_path / "pkg"), str(tmp_path / "pkg"))
    assert [(f.kind, f.symbol, f.line) for f in result.findings] == [("unresolved-import", "starlib.Private", 2)]
