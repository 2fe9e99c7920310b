"""The parsed API model is cached as JSON per module: a second audit reads it back (same findings,
nothing parsed again), and a cache file that does not read back is parsed again."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write_tree

from eyas.audit import apimodel
from eyas.audit.run import run_audit

LIB = {
    "v1/cachelib/__init__.py": "from .core import Engine, build\n",
    "v1/cachelib/core.py": ("import dataclasses\n\n@dataclasses.dataclass\nclass Options:\n    size: int = 1\n\n"
                            "class Engine:\n    def __init__(self, options: Options, *, tp=1):\n        self.options = options\n"
                            "    def step(self, n, block=True):\n        return [n]\n\ndef build(x):\n    return Engine(x)\n"),
    "v2/cachelib/__init__.py": "from .core import Engine\n",
    "v2/cachelib/core.py": ("import dataclasses\n\n@dataclasses.dataclass\nclass Options:\n    size: int = 2\n\n"
                            "class Engine:\n    def __init__(self, options: Options, *, tp=2):\n        self.options = options\n"
                            "    def step(self, n, block=False):\n        return (n,)\n"),
    "client/use.py": ("from cachelib import Engine, build\nfrom cachelib.core import Options\n\n"
                      "engine = Engine(Options(), tp=4)\nengine.step(3)\nengine.stop()\n"),
}


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    write_tree(tmp_path, LIB)
    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    return tmp_path


def kinds(tree: Path) -> list[tuple[str, str, int]]:
    result = run_audit([tree / "client"], str(tree / "v2"), str(tree / "v1"))
    return [(f.kind, f.symbol, f.line) for f in result.findings]


def test_second_audit_reads_the_cache_and_finds_the_same(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = kinds(tree)
    assert first == [("unresolved-import", "cachelib.build", 1), ("default-changed", "cachelib.core.Options(size)", 4),
                     ("default-changed", "cachelib.Engine.step(block)", 5), ("missing-attribute", "cachelib.Engine.stop", 6)]
    assert len(list((tree / "cache" / "audit" / "api").glob("*.json"))) >= 4  # both versions' modules
    parsed: list[str] = []
    original = apimodel._ModuleReader.read

    def counting(self, module_tree):  # noqa: ANN001, ANN202 - wraps the reader
        parsed.append(self.module.name)
        return original(self, module_tree)

    monkeypatch.setattr(apimodel._ModuleReader, "read", counting)
    assert kinds(tree) == first
    assert parsed == []
    for file in (tree / "cache" / "audit" / "api").glob("*.json"):
        file.write_text("{not json")
    assert kinds(tree) == first
    assert parsed  # unreadable cache files are parsed again
