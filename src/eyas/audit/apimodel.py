"""The API model of a package, read from its source with `ast` (never imported), one module at a time.

Only the modules a client reaches are parsed: a 500k-line package is not read in full to check
a 20k-line client. A module holds its functions, classes, assignments, imports (re-exports),
`__all__`, star imports and whether it has a lazy module `__getattr__`; names imported under
`if TYPE_CHECKING:` count as re-exports (that is how lazy packages such as transformers declare
what their `__getattr__` serves). Classes hold their bases, methods, properties, class and
instance attributes (with default values as source text), and the `__init__` that dataclasses,
pydantic models and pydantic dataclasses (`InitVar` included), attrs classes, msgspec Structs
and NamedTuples synthesize from their fields.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Union

from eyas.audit.signature import Param, Signature, signature_of

if TYPE_CHECKING:
    from eyas.audit.modelcache import ModuleCache

DATACLASS_DECORATORS = {"dataclass", "dataclasses.dataclass", "pydantic.dataclasses.dataclass", "attr.s", "attr.attrs",
                        "attrs.define", "attrs.frozen", "attrs.mutable", "attr.define", "attr.frozen", "define", "frozen"}
_STAR_IMPORT = re.compile(r"^\s*from\s+(\.*)([\w.]*)\s+import\s+\*", re.MULTILINE)
FIELD_BASES = {"pydantic.BaseModel": "pydantic", "pydantic.main.BaseModel": "pydantic", "msgspec.Struct": "msgspec",
               "typing.NamedTuple": "namedtuple", "NamedTuple": "namedtuple"}


@dataclass
class Attribute:
    name: str
    lineno: int
    annotation: str | None = None
    default: str | None = None  # source text of the assigned value
    has_value: bool = False
    instance: bool = False  # set on self in a method


@dataclass
class Function:
    name: str
    qualname: str
    lineno: int
    signature: Signature
    returns: str | None
    decorators: list[str]
    docstring: str | None = None
    returns_class: str | None = None  # the qualified name the return annotation names (Optional/quotes removed)

    @property
    def is_property(self) -> bool:
        return any(d.endswith(("property", "cached_property")) or d.endswith(".setter") for d in self.decorators)

    @property
    def is_static(self) -> bool:
        return "staticmethod" in self.decorators

    @property
    def is_classmethod(self) -> bool:
        return "classmethod" in self.decorators


@dataclass
class Klass:
    name: str
    qualname: str
    module: str
    lineno: int
    bases: list[str]  # qualified names as written (resolved through the module's imports)
    decorators: list[str]
    methods: dict[str, Function] = field(default_factory=dict)
    attributes: dict[str, Attribute] = field(default_factory=dict)
    field_order: list[str] = field(default_factory=list)  # annotated class-level names, in order
    init_false: set[str] = field(default_factory=set)
    kw_only_fields: set[str] = field(default_factory=set)
    forbids_extra: bool = False
    docstring: str | None = None
    decorator_sources: list[str] = field(default_factory=list)  # as written, arguments included


@dataclass
class Alias:
    target: str  # a qualified name in some module


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    members: dict[str, Union[Function, Klass, Attribute, Alias]] = field(default_factory=dict)
    all: list[str] | None = None
    star_imports: list[str] = field(default_factory=list)
    lazy_getattr: bool = False


@dataclass(frozen=True)
class Opaque:
    """A member of a value the model does not type (`module.__version__.split`, a class attribute's
    members): it may exist, so it is unknown, never missing."""

    name: str


Member = Union[Function, Klass, Attribute, Alias, Module, Opaque]


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    if isinstance(node, ast.Subscript):
        return _dotted(node.value)
    return None


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    """Return the absolute module of a `from ... import` with `level` leading dots."""
    if level == 0:
        return name or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, name] if name else base)


_FIELD_SPECIFIERS = ("field", "Field", "attrib", "ib")


def _annotated_type(annotation: ast.expr | None) -> ast.expr | None:
    """Return the type an annotation names: unquoted, without `Optional[...]` or `| None`."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(annotation, ast.Subscript) and (_dotted(annotation.value) or "").endswith("Optional"):
        return _annotated_type(annotation.slice)
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        side = annotation.right if isinstance(annotation.left, ast.Constant) else annotation.left
        return _annotated_type(side)
    return annotation if isinstance(annotation, (ast.Name, ast.Attribute)) else None


def _field_default(value: ast.expr | None) -> str | None:
    """Return the default of a class-level field as source text (None: required). A field specifier
    (`field(default=...)`, `attrs.field(factory=...)`, `pydantic.Field(0)`) gives its default argument,
    `<factory>` for a factory, or None when it has neither (or `Field(...)`)."""
    if value is None:
        return None
    if isinstance(value, ast.Call) and (_dotted(value.func) or "").split(".")[-1] in _FIELD_SPECIFIERS:
        keywords = {k.arg: k.value for k in value.keywords if k.arg}
        if "default" in keywords:
            return ast.unparse(keywords["default"])
        if "default_factory" in keywords or "factory" in keywords:
            return "<factory>"
        if value.args and not (isinstance(value.args[0], ast.Constant) and value.args[0].value is Ellipsis):
            return ast.unparse(value.args[0])  # pydantic.Field(default)
        return None
    return ast.unparse(value)


class _ModuleReader:
    """Turns one module's AST into a `Module`."""

    def __init__(self, name: str, path: Path, is_package: bool) -> None:
        self.module = Module(name, path, is_package)
        self.imports: dict[str, str] = {}  # local name -> qualified name

    def qualify(self, dotted: str | None) -> str | None:
        """Return `dotted` with its first part resolved through this module's imports and definitions."""
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        if head in self.imports:
            base = self.imports[head]
        elif head in self.module.members and not isinstance(self.module.members[head], Alias):
            base = f"{self.module.name}.{head}"
        else:
            base = head
        return f"{base}.{rest}" if rest else base

    def read(self, tree: ast.Module) -> Module:
        self._body(tree.body, type_checking=False)
        return self.module

    def _body(self, body: list[ast.stmt], type_checking: bool) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self._import(node)
            elif isinstance(node, ast.If):
                test = ast.unparse(node.test)
                checking = "TYPE_CHECKING" in test
                self._body(node.body, type_checking or checking)
                if not checking:
                    self._body(node.orelse, type_checking)
            elif isinstance(node, ast.Try):
                self._body(node.body, type_checking)
                for handler in node.handlers:
                    self._body(handler.body, type_checking)
                self._body(node.orelse, type_checking)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name == "__getattr__":
                    self.module.lazy_getattr = True
                self.module.members[node.name] = self._function(node, f"{self.module.name}.{node.name}")
            elif isinstance(node, ast.ClassDef):
                self.module.members[node.name] = self._class(node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                self._assign(node)

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        members = self.module.members
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                target = alias.name if alias.asname else alias.name.split(".")[0]
                self.imports[local] = target
                members.setdefault(local, Alias(target))
            return
        source = _absolute(self.module.name, self.module.is_package, node.level, node.module)
        for alias in node.names:
            if alias.name == "*":
                self.module.star_imports.append(source)
                continue
            local = alias.asname or alias.name
            self.imports[local] = f"{source}.{alias.name}"
            members[local] = Alias(f"{source}.{alias.name}")

    def _assign(self, node: ast.Assign | ast.AnnAssign) -> None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if not isinstance(target, ast.Name):
                continue
            if target.id == "__all__" and node.value is not None:
                try:
                    value = ast.literal_eval(node.value)
                    self.module.all = [str(v) for v in value]
                except ValueError:
                    pass
                continue
            existing = self.module.members.get(target.id)
            if isinstance(existing, (Klass, Function)) and isinstance(node.value, ast.Call) and any(
                    isinstance(a, ast.Name) and a.id == target.id for a in node.value.args):
                continue  # `X = decorate(X)`: X stays the class or function it was
            value = _dotted(node.value) if node.value is not None else None
            if value and isinstance(node.value, (ast.Name, ast.Attribute)) and self.qualify(value) != value:
                self.module.members[target.id] = Alias(self.qualify(value) or value)  # re-binding of an import
                continue
            self.module.members[target.id] = Attribute(
                target.id, node.lineno, ast.unparse(node.annotation) if isinstance(node, ast.AnnAssign) else None,
                ast.unparse(node.value) if node.value is not None else None, node.value is not None)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef, qualname: str) -> Function:
        decorators = [self.qualify(_dotted(d)) or ast.unparse(d) for d in node.decorator_list]
        return Function(node.name, qualname, node.lineno, signature_of(node.args),
                        ast.unparse(node.returns) if node.returns else None, decorators, ast.get_docstring(node),
                        self.qualify(_dotted(_annotated_type(node.returns))) if node.returns else None)

    def _class(self, node: ast.ClassDef) -> Klass:
        qualname = f"{self.module.name}.{node.name}"
        bases = [q for b in node.bases if (q := self.qualify(_dotted(b)))]
        decorators = [self.qualify(_dotted(d)) or ast.unparse(d) for d in node.decorator_list]
        klass = Klass(node.name, qualname, self.module.name, node.lineno, bases, decorators,
                      docstring=ast.get_docstring(node), decorator_sources=[ast.unparse(d) for d in node.decorator_list])
        for keyword in node.keywords:  # class Model(BaseModel, extra="forbid") / msgspec kw_only=True
            if keyword.arg == "extra" and ast.unparse(keyword.value).strip("'\"") == "forbid":
                klass.forbids_extra = True
            if keyword.arg == "kw_only" and ast.unparse(keyword.value) == "True":
                klass.decorator_sources.append("kw_only=True")
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                function = self._function(item, f"{qualname}.{item.name}")
                if item.name in klass.methods and function.decorators and function.decorators[-1].endswith(".setter"):
                    continue  # the getter stays the member
                klass.methods[item.name] = function
                self._instance_attributes(item, klass)
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                name = item.target.id
                annotation = ast.unparse(item.annotation)
                default = _field_default(item.value)
                klass.attributes[name] = Attribute(name, item.lineno, annotation, default, default is not None)
                if "ClassVar" not in annotation:
                    klass.field_order.append(name)
                if isinstance(item.value, ast.Call):
                    for keyword in item.value.keywords:
                        if keyword.arg == "init" and ast.unparse(keyword.value) == "False":
                            klass.init_false.add(name)
                        if keyword.arg == "kw_only" and ast.unparse(keyword.value) == "True":
                            klass.kw_only_fields.add(name)
            elif isinstance(item, ast.Assign):
                for target in item.targets:
                    if isinstance(target, ast.Name):
                        if target.id == "model_config" and "forbid" in ast.unparse(item.value):
                            klass.forbids_extra = True
                        klass.attributes[target.id] = Attribute(target.id, item.lineno, None, ast.unparse(item.value), True)
        return klass

    @staticmethod
    def _instance_attributes(function: ast.FunctionDef | ast.AsyncFunctionDef, klass: Klass) -> None:
        for node in ast.walk(function):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            for target in targets:
                if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
                        and target.attr not in klass.attributes):
                    klass.attributes[target.attr] = Attribute(target.attr, target.lineno, None, None, True, instance=True)


class ApiModel:
    """The API of the packages under `roots` (directories holding top-level packages or modules)."""

    def __init__(self, roots: list[Path], cache: ModuleCache | None = None) -> None:
        self.roots, self.cache = roots, cache
        self._modules: dict[str, Module | None] = {}
        self._scans: dict[str, tuple[str, list[str]] | None] = {}
        self._lookups: dict[str, Member | None] = {}
        self._mros: dict[str, list[Klass]] = {}
        self._defines: dict[tuple[str, str], bool] = {}

    def find_file(self, name: str) -> tuple[Path, bool] | None:
        parts = name.split(".")
        for root in self.roots:
            base = root.joinpath(*parts)
            if (base / "__init__.py").is_file():
                return base / "__init__.py", True
            if base.with_suffix(".py").is_file():
                return base.with_suffix(".py"), False
            if base.is_dir() and len(parts) > 1:  # a namespace package
                return base, True
        return None

    def module(self, name: str) -> Module | None:
        """Return the module `name` (parsed on first use), or None when the package has no such module."""
        if name not in self._modules:
            found = self.find_file(name)
            if found is None:
                self._modules[name] = None
            else:
                path, is_package = found
                if path.is_dir():
                    self._modules[name] = Module(name, path, True)
                else:
                    cached = self.cache.load(path) if self.cache else None
                    if cached is None:
                        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"), filename=str(path))
                        cached = _ModuleReader(name, path, is_package).read(tree)
                        if self.cache:
                            self.cache.save(cached)
                    self._modules[name] = cached
        return self._modules[name]

    def lookup(self, qualname: str, _seen: frozenset[str] = frozenset()) -> Member | None:
        """Return what `qualname` names (following re-exports, star imports and submodules), or None."""
        if not _seen:
            if qualname not in self._lookups:
                self._lookups[qualname] = self._lookup(qualname, frozenset())
            return self._lookups[qualname]
        return self._lookup(qualname, _seen)

    def _lookup(self, qualname: str, _seen: frozenset[str]) -> Member | None:
        if qualname in _seen:
            return None
        seen = _seen | {qualname}
        parts = qualname.split(".")
        for cut in range(len(parts), 0, -1):
            module = self.module(".".join(parts[:cut]))
            if module is None:
                continue
            found: Member | None = module
            for i, part in enumerate(parts[cut:], cut):
                found = self.member_of(found, part, seen)
                if found is None:
                    return None
            return found
        return None

    def member_of(self, owner: Member, name: str, seen: frozenset[str] = frozenset()) -> Member | None:
        """Return member `name` of a module or class (through its MRO), following aliases; None when absent."""
        if isinstance(owner, Alias):
            owner = self.lookup(owner.target, seen)  # type: ignore[assignment]
        if isinstance(owner, (Attribute, Opaque)) or (isinstance(owner, Function) and name.startswith("__")):
            return Opaque(name)
        if isinstance(owner, Module):
            member = owner.members.get(name)
            if isinstance(member, Alias):
                return self.lookup(member.target, seen)
            if member is not None:
                return member
            submodule = self.module(f"{owner.name}.{name}") if owner.is_package else None
            if submodule is not None:
                return submodule
            for source in owner.star_imports:
                if (source, name) not in self._defines:
                    self._defines[(source, name)] = self._could_define(source, name, set())
                if not self._defines[(source, name)]:
                    continue  # a text search spares parsing the hundreds of modules a package star-imports
                exporting = self.module(source)
                if exporting is not None and exporting.all is not None and name not in exporting.all:
                    continue  # `from m import *` takes only what m's __all__ lists
                found = self.lookup(f"{source}.{name}", seen)
                if found is not None:
                    return found
            return None
        if isinstance(owner, Klass):
            for klass in self.mro(owner):
                if name in klass.methods:
                    return klass.methods[name]
                if name in klass.attributes:
                    return klass.attributes[name]
            return None
        return None

    def concrete_member(self, klass: Klass, name: str) -> Member | None:
        """Return member `name` through the MRO, skipping `(*args, **kwargs)` pass-through overrides: a
        call binds against the signature such a wrapper forwards to."""
        first = None
        for current in self.mro(klass):
            member = current.methods.get(name) or current.attributes.get(name)
            if member is None:
                continue
            first = first or member
            if not (isinstance(member, Function) and member.signature.passes_through):
                return member
        return first

    def _could_define(self, module: str, name: str, visited: set[str]) -> bool:
        """Return False when the source of `module` (and of what it star-imports) never contains `name`
        (a substring test: a false hit only costs a parse)."""
        if module in visited:
            return False
        visited.add(module)
        scanned = self._scan(module)
        if scanned is None:
            return self.find_file(module) is not None
        text, star_sources = scanned
        return name in text or any(self._could_define(source, name, visited) for source in star_sources)

    def _scan(self, module: str) -> tuple[str, list[str]] | None:
        """Return a module's source text and the modules it star-imports (read once, not parsed)."""
        if module not in self._scans:
            found = self.find_file(module)
            if found is None or found[0].is_dir():
                self._scans[module] = None
            else:
                text = found[0].read_text(encoding="utf-8", errors="replace")
                package = module if found[1] else module.rsplit(".", 1)[0]
                sources = []
                for dots, rest in _STAR_IMPORT.findall(text):
                    parts = package.split(".")
                    base = parts[: len(parts) - (len(dots) - 1)] if dots else []
                    sources.append(".".join([*base, rest] if rest else base) if dots else rest)
                self._scans[module] = (text, sources)
        return self._scans[module]

    def find_parsed(self, name: str, package: str) -> str | None:
        """Return where an already-parsed module of `package` defines `name` (a moved definition), or None."""
        for module in self._modules.values():
            if module is not None and module.name.split(".")[0] == package and isinstance(
                    module.members.get(name), (Klass, Function)):
                return f"{module.name}.{name}"
        return None

    def resolve_class(self, qualname: str) -> Klass | None:
        found = self.lookup(qualname)
        return found if isinstance(found, Klass) else None

    def instance_class(self, qualname: str) -> Klass | None:
        """Return the class of the objects `qualname` gives when called: the class itself, or the class a
        function's (or method's) return annotation names."""
        found = self.lookup(qualname)
        if (found is None or isinstance(found, Opaque)) and "." in qualname:  # a method of an instance: `make().clone`
            owner, _, name = qualname.rpartition(".")
            owner_class = self.instance_class(owner)
            found = self.member_of(owner_class, name) if owner_class is not None else None
        if isinstance(found, Klass):
            return found
        if isinstance(found, Function) and found.returns_class:
            if "." in found.returns_class:
                return self.resolve_class(found.returns_class)
            scope = found.qualname  # a bare name: defined later in the function's module (or its class)
            while "." in scope:
                scope = scope.rsplit(".", 1)[0]
                klass = self.resolve_class(f"{scope}.{found.returns_class}")
                if klass is not None:
                    return klass
        return None

    def mro(self, klass: Klass) -> list[Klass]:
        """Return `klass` and its resolvable bases, depth first, each once (a close stand-in for C3)."""
        if klass.qualname in self._mros:
            return self._mros[klass.qualname]
        order: list[Klass] = []
        stack = [klass]
        while stack:
            current = stack.pop(0)
            if any(k.qualname == current.qualname for k in order):
                continue
            order.append(current)
            stack[0:0] = [b for q in current.bases if (b := self.resolve_class(q)) is not None]
        self._mros[klass.qualname] = order
        return order

    def is_open(self, klass: Klass) -> bool:
        """Return True when members of `klass` cannot be known: a base outside the model, or a `__getattr__`."""
        for current in self.mro(klass):
            if "__getattr__" in current.methods:
                return True
            for base in current.bases:
                if base not in ("object", "typing.Generic", "Generic") and not base.startswith(("typing.", "abc.")) \
                        and self.resolve_class(base) is None and base not in FIELD_BASES and "Protocol" not in base:
                    return True
        return False

    def field_kind(self, klass: Klass) -> str | None:
        """Return how the class synthesizes `__init__` from fields: dataclass, pydantic, msgspec, namedtuple, or None."""
        for current in self.mro(klass):
            if any(d.split("(")[0] in DATACLASS_DECORATORS or d.endswith((".dataclass", ".define", ".frozen"))
                   for d in current.decorators):
                return "dataclass"  # pydantic dataclasses bind as standard dataclasses do
            for base in current.bases:
                if base in FIELD_BASES or base.endswith(("BaseModel", "msgspec.Struct", "NamedTuple")):
                    return FIELD_BASES.get(base) or ("pydantic" if base.endswith("BaseModel") else
                                                     "msgspec" if base.endswith("Struct") else "namedtuple")
        return None

    def constructor(self, klass: Klass) -> Signature | None:
        """Return the signature a call of `klass` binds against (without self), or None when unknown."""
        for current in self.mro(klass):
            if "__init__" in current.methods and not self.field_kind(current):
                return current.methods["__init__"].signature.without_first()
            if "__new__" in current.methods and not self.field_kind(current):
                return current.methods["__new__"].signature.without_first()
        kind = self.field_kind(klass)
        if kind is None:
            return None if self.is_open(klass) else Signature([])
        sources = [d for k in self.mro(klass) for d in k.decorator_sources]
        all_keyword = any("kw_only=True" in d or "kw_only_default=True" in d for d in sources)
        params: dict[str, Param] = {}
        for current in reversed(self.mro(klass)):
            for name in current.field_order:
                if name in current.init_false or name.startswith("_") and kind == "pydantic":
                    continue
                attribute = current.attributes[name]
                default = attribute.default if attribute.has_value else None
                keyword_only = kind == "pydantic" or all_keyword or name in current.kw_only_fields
                params.pop(name, None)
                params[name] = Param(name, "kwonly" if keyword_only else "pos", default, attribute.annotation)
        extra = (kind == "pydantic" and not any(k.forbids_extra for k in self.mro(klass))
                 or any("accept_kwargs=True" in d for d in sources))  # huggingface_hub's strict dataclasses
        ordered = [p for p in params.values() if p.kind == "pos"] + [p for p in params.values() if p.kind == "kwonly"]
        if extra:
            ordered.append(Param("data", "varkw", None, None))
        return Signature(ordered)
