"""What client code uses of a package, read from its source with `ast`.

Recorded: imports (absolute, relative within the client are ignored, aliased), attribute chains
on package modules and objects, calls with their positional/keyword shape (functions,
constructors, methods), attribute and method uses on instances whose class is known locally
(assigned from a constructor — also `self.x = Cls()` in one method and `self.x.m()` in another —
annotated, or returned by a locally defined function with a package return annotation),
subclasses of package classes with their overrides, functions bound onto package objects
(`obj.m = f`, `obj.m = types.MethodType(f, obj)`), dotted names in strings (worker or plugin
classes named in a config), results of package calls that are indexed, iterated or tested, and
method calls on receivers of unknown type (for the removed-method warning).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple

from eyas.audit.signature import CallShape, Signature, signature_of

_VERSION_CHECK = re.compile(r"__version__|\bversion\b|\bversion_info\b|\bVERSION\b|\bparse_version\b|"
                            r"\bis_\w+_available\b|\bhasattr\(")
_COMPAT_ERRORS = ("ImportError", "ModuleNotFoundError", "AttributeError")
UsageKind = Literal["import", "attribute", "call", "member", "member_call", "override", "bind", "string", "result",
                    "untyped_call", "subclass"]


@dataclass(frozen=True)
class Usage:
    kind: UsageKind
    path: str
    line: int
    col: int
    target: str  # qualified name; for member uses, the class's
    member: str | None = None
    call: CallShape | None = None
    signature: Signature | None = None  # of an override or bound function (without self)
    use: str | None = None  # result: index / iterate / test / unpack
    guarded: bool = False  # under a version check or a try/except ImportError: compatibility code
    defines: tuple[str, ...] = ()  # subclass: the methods the client class defines


@dataclass(frozen=True)
class Ref:
    """What an expression is: a package object (`qualname`), or an instance of package class `qualname`."""

    qualname: str
    instance: bool = False
    guarded: bool = False  # bound under a version check or a try/except ImportError


@dataclass
class _ClientClass:
    name: str
    package_bases: list[str]
    methods: set[str] = field(default_factory=set)
    self_attributes: dict[str, Ref] = field(default_factory=dict)  # self.x known to be a package instance
    assigned: set[str] = field(default_factory=set)  # every self.x the class assigns or defines
    other_bases: bool = False  # a base outside the package (its members are unknown)

    def inherits(self, name: str) -> bool:
        """True when `self.<name>` can only come from the package bases (so a missing one is an error)."""
        return bool(self.package_bases) and not self.other_bases and not name.startswith("__") \
            and name not in self.methods and name not in self.assigned


def _shape(call: ast.Call) -> CallShape:
    return CallShape(sum(not isinstance(a, ast.Starred) for a in call.args),
                     tuple(k.arg for k in call.keywords if k.arg is not None),
                     any(isinstance(a, ast.Starred) for a in call.args), any(k.arg is None for k in call.keywords))


class _FileReader(ast.NodeVisitor):
    def __init__(self, path: str, packages: set[str]) -> None:
        self.path, self.packages = path, packages
        self.usages: list[Usage] = []
        self.module_scope: dict[str, Ref] = {}
        self.scopes: list[dict[str, Ref]] = []
        self.classes: dict[str, _ClientClass] = {}
        self.current_class: _ClientClass | None = None
        self.local_returns: dict[str, Ref] = {}
        self.guard_depth = 0
        self.defined: set[str] = set()  # every function and method name the file defines
        self.recording = True
        self.pattern = re.compile(rf"^({'|'.join(map(re.escape, sorted(packages)))})(\.[A-Za-z_]\w*)+$")

    def add(self, kind: UsageKind, node: ast.AST, target: str, via: Ref | None = None, **extra: object) -> None:
        if not self.recording:
            return
        guarded = self.guard_depth > 0 or (via is not None and via.guarded)
        self.usages.append(Usage(kind, self.path, getattr(node, "lineno", 0), getattr(node, "col_offset", 0) + 1,
                                 target, guarded=guarded, **extra))  # type: ignore[arg-type]

    def guarded_visit(self, nodes: list[ast.stmt]) -> None:
        self.guard_depth += 1
        for node in nodes:
            self.visit(node)
        self.guard_depth -= 1

    # names
    def lookup(self, name: str) -> Ref | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return self.module_scope.get(name)

    def bind_name(self, name: str, ref: Ref | None) -> None:
        scope = self.scopes[-1] if self.scopes else self.module_scope
        if ref is not None and self.guard_depth:
            ref = Ref(ref.qualname, ref.instance, guarded=True)
        if ref is None:
            scope.pop(name, None)
        else:
            scope[name] = ref

    def ref_of(self, node: ast.AST | None) -> Ref | None:
        """Return what `node` evaluates to, when it is package-related."""
        if isinstance(node, ast.Name):
            return self.lookup(node.id)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self" and self.current_class:
                if node.attr in self.current_class.self_attributes:
                    return self.current_class.self_attributes[node.attr]
                return None
            base = self.ref_of(node.value)
            if base is None or base.instance:
                return None
            return Ref(f"{base.qualname}.{node.attr}", guarded=base.guarded)
        if isinstance(node, ast.Call):
            func = self.ref_of(node.func)
            if func is not None and not func.instance:
                return Ref(func.qualname, instance=True, guarded=func.guarded)  # what calling it gives (class or return)
            if isinstance(node.func, ast.Attribute) and (owner := self.ref_of(node.func.value)) is not None and owner.instance:
                return Ref(f"{owner.qualname}.{node.func.attr}", instance=True, guarded=owner.guarded)  # a method's result
            if isinstance(node.func, ast.Name) and node.func.id in self.local_returns:
                return self.local_returns[node.func.id]
        return None

    def annotation_ref(self, annotation: ast.AST | None) -> Ref | None:
        if annotation is None:
            return None
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                annotation = ast.parse(annotation.value, mode="eval").body
            except SyntaxError:
                return None
        if isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value).endswith("Optional"):
            annotation = annotation.slice
        if isinstance(annotation, ast.BinOp):  # X | None
            annotation = annotation.left
        ref = self.ref_of(annotation)
        return Ref(ref.qualname, instance=True) if ref is not None and not ref.instance else None

    # statements
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] in self.packages:
                self.add("import", node, alias.name)
                self.bind_name(alias.asname or alias.name.split(".")[0],
                               Ref(alias.name if alias.asname else alias.name.split(".")[0]))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module or node.module.split(".")[0] not in self.packages:
            return
        for alias in node.names:
            if alias.name == "*":
                continue
            qualname = f"{node.module}.{alias.name}"
            self.add("import", node, qualname)
            self.bind_name(alias.asname or alias.name, Ref(qualname))

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        bases = [ref.qualname for b in node.bases if (ref := self.ref_of(b)) is not None and not ref.instance]
        defined = {f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        defined |= {t.id for item in node.body if isinstance(item, (ast.Assign, ast.AnnAssign))
                    for t in (item.targets if isinstance(item, ast.Assign) else [item.target]) if isinstance(t, ast.Name)}
        client = _ClientClass(node.name, bases, defined, other_bases=len(bases) < len(node.bases))
        self.classes[node.name] = client
        outer, self.current_class = self.current_class, client
        for item in node.body:  # first pass: self.x = <package object> anywhere in the class
            for sub in ast.walk(item):
                if isinstance(sub, (ast.Assign, ast.AnnAssign)):
                    targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                    for target in targets:
                        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                            client.assigned.add(target.attr)
                            ref = self.annotation_ref(sub.annotation) if isinstance(sub, ast.AnnAssign) else None
                            ref = ref or self.ref_of(sub.value)
                            if ref is not None and ref.instance:
                                client.self_attributes[target.attr] = ref
        for base in bases:
            self.add("subclass", node, base, member=node.name, defines=tuple(sorted(defined)))
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not (
                        item.name.startswith("__") and item.name != "__init__"):
                    decorated = {ast.unparse(d) for d in item.decorator_list}
                    signature = signature_of(item.args)
                    if not decorated & {"staticmethod"}:
                        signature = signature.without_first()
                    self.add("override", item, base, member=item.name, signature=signature,
                             use="marked" if any(d.endswith("override") for d in decorated) else None)
        self.generic_visit(node)
        self.current_class = outer

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.defined.add(node.name)
        returns = self.annotation_ref(node.returns)
        if returns is not None and self.current_class is None:
            self.local_returns[node.name] = returns
        self.scopes.append({})
        for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
            ref = self.annotation_ref(arg.annotation)
            if ref is not None:
                self.bind_name(arg.arg, ref)
        for item in node.body:
            self.visit(item)
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        value = self.ref_of(node.value)
        if any(isinstance(target, (ast.Tuple, ast.List)) for target in node.targets):
            self._result_use(node.value, "unpack")
        for target in node.targets:
            if isinstance(target, ast.Name):
                self.bind_name(target.id, value)
            elif isinstance(target, ast.Attribute):
                owner = self.ref_of(target.value)
                if owner is not None and owner.instance:
                    self._bound_function(node, owner, target.attr)
                self.visit(target.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
        if isinstance(node.target, ast.Name):
            self.bind_name(node.target.id, self.annotation_ref(node.annotation) or self.ref_of(node.value))

    def _bound_function(self, node: ast.Assign, owner: Ref, member: str) -> None:
        value = node.value
        if isinstance(value, ast.Call) and ast.unparse(value.func).endswith("MethodType") and value.args:
            value = value.args[0]
        if isinstance(value, ast.Name):
            function = next((f for f in ast.walk(self.tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                             and f.name == value.id), None)
            if function is not None:
                signature = signature_of(function.args)
                bound = isinstance(node.value, ast.Call)  # MethodType passes the object as first argument
                self.add("bind", node, owner.qualname, member=member,
                         signature=signature.without_first() if bound else signature)

    # expressions
    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Name) and node.value.id == "self" and self.current_class:
            if self.current_class.inherits(node.attr):
                for base in self.current_class.package_bases:
                    self.add("member", node, base, member=node.attr)
            return
        base = self.ref_of(node.value)
        if base is not None:
            if base.instance:
                self.add("member", node, base.qualname, via=base, member=node.attr)
            else:
                self.add("attribute", node, f"{base.qualname}.{node.attr}", via=base)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        shape = _shape(node)
        if isinstance(func, ast.Attribute):
            owner = self.ref_of(func.value)
            is_self = isinstance(func.value, ast.Name) and func.value.id == "self" and self.current_class is not None
            if owner is not None and owner.instance:
                self.add("member_call", node, owner.qualname, via=owner, member=func.attr, call=shape)
            elif owner is not None:
                self.add("call", node, f"{owner.qualname}.{func.attr}", via=owner, call=shape)
            elif is_self and self.current_class.inherits(func.attr):  # type: ignore[union-attr]
                for base in self.current_class.package_bases:  # type: ignore[union-attr]
                    self.add("member_call", node, base, member=func.attr, call=shape)
            elif not is_self and not isinstance(func.value, ast.Constant):
                self.add("untyped_call", node, ast.unparse(func.value)[:60], member=func.attr, call=shape)
        else:
            ref = self.ref_of(func)
            if ref is not None and not ref.instance:
                self.add("call", node, ref.qualname, via=ref, call=shape)
        self.generic_visit(node)

    def _result_use(self, node: ast.AST | None, use: str) -> None:
        if isinstance(node, ast.Call):
            ref = self.ref_of(node.func)
            if ref is not None and not ref.instance:
                self.add("result", node, ref.qualname, use=use)
            elif isinstance(node.func, ast.Attribute) and (owner := self.ref_of(node.func.value)) is not None and owner.instance:
                self.add("result", node, owner.qualname, member=node.func.attr, use=use)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        self._result_use(node.value, "index")
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        self._result_use(node.iter, "iterate")
        self.generic_visit(node)

    def _test_use(self, test: ast.AST) -> None:
        """Record call results tested by `if`/`while` conditions (through `not`, `and`, `or`)."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            self._test_use(test.operand)
        elif isinstance(test, ast.BoolOp):
            for value in test.values:
                self._test_use(value)
        else:
            self._result_use(test, "test")

    def visit_While(self, node: ast.While) -> None:
        self._test_use(node.test)
        self.generic_visit(node)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self._result_use(node.iter, "iterate")
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        self._test_use(node.test)
        self.visit(node.test)
        if _VERSION_CHECK.search(ast.unparse(node.test)):
            self.guarded_visit(node.body)
            self.guarded_visit(node.orelse)
            return
        for child in [*node.body, *node.orelse]:
            self.visit(child)

    def visit_Try(self, node: ast.Try) -> None:
        caught = {ast.unparse(h.type) if h.type is not None else "" for h in node.handlers}
        compat = any(not c or any(e in c for e in _COMPAT_ERRORS) for c in caught)
        for block in (node.body, *[h.body for h in node.handlers]):
            if compat:
                self.guarded_visit(block)
            else:
                for child in block:
                    self.visit(child)
        for child in [*node.orelse, *node.finalbody]:
            self.visit(child)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and self.pattern.match(node.value):
            self.add("string", node, node.value)

    def read(self, tree: ast.Module) -> list[Usage]:
        """Return the file's usages. A silent first pass binds the imports and the return types of the
        module's functions, so a factory defined below its callers is known to them."""
        self.tree = tree
        self.recording = False
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.visit(node)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (ref := self.annotation_ref(node.returns)):
                self.local_returns[node.name] = ref
        self.module_scope, self.recording = {}, True
        self.visit(tree)
        return self.usages


def client_files(paths: list[Path]) -> list[Path]:
    """Return the Python files under `paths` (files or directories), sorted."""
    files: list[Path] = []
    for path in paths:
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


class ClientUses(NamedTuple):
    usages: list[Usage]
    files: int
    unparsable: list[tuple[Path, int, str]]  # (path, line, reason): reported, not skipped silently
    defined: frozenset[str]  # every function and method name the client defines


def read_usages(paths: list[Path], packages: set[str]) -> ClientUses:
    """Return the uses of `packages` (import names) in the client files under `paths`, the file count,
    the files that could not be parsed, and the names of the functions and methods the client defines."""
    usages: list[Usage] = []
    defined: set[str] = set()
    unparsable: list[tuple[Path, int, str]] = []
    files = client_files(paths)
    for file in files:
        try:
            tree = ast.parse(file.read_text(encoding="utf-8", errors="replace"), filename=str(file))
        except SyntaxError as error:
            unparsable.append((file, error.lineno or 1, f"syntax error: {error.msg}"))
            continue
        reader = _FileReader(str(file), packages)
        usages += reader.read(tree)
        defined |= reader.defined
    return ClientUses(usages, len(files), unparsable, frozenset(defined))


def called_names(usages: list[Usage]) -> frozenset[str]:
    """Return every method or function name the client calls (on any receiver, typed or not)."""
    return frozenset(u.member if u.member is not None else u.target.rsplit(".", 1)[-1]
                     for u in usages if u.kind in ("call", "member_call", "untyped_call"))
