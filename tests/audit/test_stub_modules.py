"""Extension modules through their `.pyi` stubs, `@overload`s, and star imports the model cannot read:
what the API model claims of code it has no Python source for."""

from __future__ import annotations

from pathlib import Path

from conftest import write_tree

from eyas.audit.apimodel import ApiModel, Function, Klass, Opaque

TREE = {
    "pkg/__init__.py": "from ._native import Handle\nfrom _no_source_anywhere import *\nfrom .both import made\n",
    "pkg/_native.pyi": '''from typing import overload

class Handle:
    def __init__(self, fd: int, mode: str = ...) -> None: ...
    @overload
    def read(self, n: int) -> bytes: ...
    @overload
    def read(self) -> bytes: ...
''',
    "pkg/both.py": "def made(a, b):\n    return a\n",
    "pkg/both.pyi": "def made(a: int) -> int: ...\n",
}


def test_a_stub_gives_constructors_but_no_closed_class(tmp_path: Path) -> None:
    model = ApiModel([write_tree(tmp_path, TREE)])
    handle = model.lookup("pkg.Handle")
    assert isinstance(handle, Klass)
    assert model.constructor(handle).text() == "(fd: int, mode: str = ...)"
    read = model.member_of(handle, "read")
    assert isinstance(read, Function) and model.call_signature(read).text() == "(*args, **kwargs)"  # overloads: any
    assert model.is_open(handle) and model.member_of(handle, "patched_in_at_run_time") is None
    assert not model.has_unmodelled_base(handle)


def test_source_beats_its_stub_and_an_unreadable_star_import_is_opaque(tmp_path: Path) -> None:
    model = ApiModel([write_tree(tmp_path, TREE)])
    made = model.lookup("pkg.made")
    assert isinstance(made, Function) and made.signature.text() == "(a, b)"
    assert model.lookup("pkg.anything") == Opaque("anything")  # `from _no_source_anywhere import *` may define it
    assert model.lookup("pkg.both.missing") is None  # a module with source and no such star import: missing
