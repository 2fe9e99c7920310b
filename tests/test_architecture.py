"""The package layout of docs/architecture.md, enforced: every `eyas` import (lazy ones and those under
TYPE_CHECKING included) goes in an allowed direction, so the stages, the model code they share, the
engine backends and the audit stay separable."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import eyas

SRC = Path(eyas.__file__).parent

BASE = {"errors", "files"}
FRAMEWORK = {"config", "stage", "outputs", "precision", "progress", "distributed"}
# package (or top-level module group) -> what it may import besides itself; docs/architecture.md draws it
ALLOWED: dict[str, set[str]] = {
    "base": set(),
    "audit": {"base"},
    "models": {"base"},
    "framework": {"base", "models"},
    "draft": {"base", "framework", "models"},
    "backends": {"base", "framework", "models", "audit"},
    "data": {"base", "framework", "models", "backends"},
    "features": {"base", "framework", "models", "data", "backends", "audit"},
    "train": {"base", "framework", "models", "draft", "data", "features", "audit"},
    "decode": {"base", "framework", "models", "draft", "data", "backends", "export"},
    "export": {"base", "framework", "models", "draft"},
    "command": {"base", "framework", "models", "draft", "backends", "audit", "data", "features", "train", "decode",
                "export"},
    "demo": {"base", "framework", "models", "draft", "data", "features", "train", "decode", "export", "command",
             "backends"},
    "testing": {"base", "framework", "models", "draft", "data", "features", "train", "decode", "export"},
}


def group(module: str) -> str:
    """Return the layout group of the dotted module `module` (eyas.x.y)."""
    parts = module.split(".")[1:]
    if not parts or parts[0] == "__init__":
        return "base"  # eyas/__init__.py: the version only
    head = parts[0]
    if head in BASE:
        return "base"
    if head in FRAMEWORK:
        return "framework"
    if head in ("cli", "cli_options", "reports", "__main__"):
        return "command"
    return head


def imports(path: Path) -> list[tuple[int, str]]:
    """Return (line, module) of every eyas import in `path`, wherever it sits."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "eyas":  # a submodule, or a name of the package root (__version__)
                found += [(node.lineno, f"eyas.{alias.name}" if (SRC / alias.name).exists()
                           or (SRC / f"{alias.name}.py").exists() else "eyas") for alias in node.names]
            elif node.module.startswith("eyas."):
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("eyas.")]
    return found


def module_of(path: Path) -> str:
    return ".".join(("eyas", *path.relative_to(SRC).with_suffix("").parts))


def test_every_module_belongs_to_a_group() -> None:
    groups = {group(module_of(path)) for path in SRC.rglob("*.py")}
    assert groups <= set(ALLOWED), groups - set(ALLOWED)


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_imports_go_in_the_allowed_directions(path: Path) -> None:
    mine = group(module_of(path))
    wrong = [f"{path.relative_to(SRC)}:{line}: {mine} imports {module} ({group(module)})"
             for line, module in imports(path) if group(module) not in ALLOWED[mine] | {mine}]
    assert not wrong, "\n".join(wrong)


def test_the_audit_is_a_separate_tool() -> None:
    assert ALLOWED["audit"] == {"base"}  # it runs without torch, transformers or any stage


def test_the_layout_has_no_folder_named_like_a_build_output() -> None:
    assert not (SRC / "target").exists() and not (SRC / "build").exists() and not (SRC / "dist").exists()
