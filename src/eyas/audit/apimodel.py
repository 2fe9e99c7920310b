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
import enum
import inspect
import re
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Union

from eyas.audit.signature import PARAMETER_KINDS as _PARAMETER_KINDS
from eyas.audit.signature import Param, Signature, signature_of
from eyas.audit.wrappers import keyword_use

if TYPE_CHECKING:
    from eyas.audit.modelcache import ModuleCache

DATACLASS_DECORATORS = {"dataclass", "dataclasses.dataclass", "pydantic.dataclasses.dataclass", "attr.s", "attr.attrs",
                        "attrs.define", "attrs.frozen", "attrs.mutable", "attr.define", "attr.frozen", "define", "frozen"}
_METHOD_DEF = re.compile(r"^[ \t]+(?:async[ \t]+)?def[ \t]+(\w+)", re.MULTILINE)
_STAR_IMPORT = re.compile(r"^\s*from\s+(\.*)([\w.]*)\s+import\s+\*", re.MULTILINE)
# transformers' lazy init: `define_import_structure(Path(__file__).parent / "models", ...)` -> "models"
_IMPORT_STRUCTURE = re.compile(r"define_import_structure\(\s*Path\(__file__\)\.parent((?:\s*/\s*[\"']\w+[\"'])*)")
_ALL_LIST = re.compile(r"^__all__\s*(?::[^=]*)?=\s*[\[(](.*?)[\])]", re.MULTILINE | re.DOTALL)
_QUOTED_NAME = re.compile(r"[\"'](\w+)[\"']")
FIELD_BASES = {"pydantic.BaseModel": "pydantic", "pydantic.main.BaseModel": "pydantic", "msgspec.Struct": "msgspec",
               "typing.NamedTuple": "namedtuple", "NamedTuple": "namedtuple"}
STDLIB = Path(sysconfig.get_paths()["stdlib"])
_EXTENSION_SUFFIXES = (".so", ".pyd")
# What every class and instance has, whatever its source says (`x.__class__`, `Base.__init__`).
OBJECT_MEMBERS = frozenset(dir(object)) | {"__dict__", "__module__", "__weakref__", "__annotations__"}


@dataclass
class Attribute:
    name: str
    lineno: int
    annotation: str | None = None
    default: str | None = None  # source text of the assigned value
    has_value: bool = False
    instance: bool = False  # set on self in a method
    specifier: str | None = None  # the qualified callee when the value is a call (`field(...)`, `Field(...)`)
    specified_default: str | None = None  # the default that call gives if it is a field specifier
    alias: str | None = None  # its `alias=` keyword


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
    transform: str | None = None  # its `@dataclass_transform(...)` decorator as written (PEP 681)
    wraps_as: str | None = None  # as a decorator returning a `(*args, **kwargs)` wrapper: see `_wraps_as`
    forwards: bool = False  # its body passes its own `*args` and `**kwargs` on to a call
    sets_members: list[str] = field(default_factory=list)  # names it sets on a parameter (`cls.x = ...`); "*": setattr
    sets_methods: dict[str, Signature] = field(default_factory=dict)  # those set to a function it defines, with its signature
    return_shape: str | None = None  # what every `return` gives when all agree: "list of 1", "tuple of 2", "dict", "value"
    state_errors: list[str] = field(default_factory=list)  # messages it raises that name a call to make first
    takes_keywords: list[tuple[str | None, str | None]] = field(default_factory=list)  # as a decorator whose wrapper
    # takes keywords out of its `**kwargs` or sets them: (taken, renamed to) as `eyas.audit.wrappers` reads them
    decorator_sources: list[str] = field(default_factory=list)  # as written, arguments included

    @property
    def forwarder(self) -> bool:
        """True for `(self, *args, **kwargs)` that hands them to another callable: it binds as that one
        does. One that does not forward (raises, ignores them) takes anything."""
        return self.signature.passes_through and self.forwards

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
    metaclass: str | None = None  # the `metaclass=` keyword, qualified


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
    lazy_getattr: bool = False  # a module `__getattr__`: may serve names its source never spells
    lazy_module: bool = False  # `sys.modules[__name__] = _LazyModule(...)`: serves the names its import structure lists


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


def _specified_default(call: ast.Call) -> str | None:
    """Return the default a field specifier call gives (`field(default=...)`, `attrs.field(factory=...)`,
    `pydantic.Field(0)`): its default argument, `<factory>` for a factory, None when it has neither."""
    keywords = {k.arg: k.value for k in call.keywords if k.arg}
    if "default" in keywords:
        return ast.unparse(keywords["default"])
    if "default_factory" in keywords or "factory" in keywords:
        return "<factory>"
    if call.args and not (isinstance(call.args[0], ast.Constant) and call.args[0].value is Ellipsis):
        return ast.unparse(call.args[0])
    return None


def _field_default(value: ast.expr | None) -> str | None:
    """Return the default of a class-level field as source text (None: required); a call of a standard
    field specifier gives its specified default."""
    if value is None:
        return None
    if isinstance(value, ast.Call) and (_dotted(value.func) or "").split(".")[-1] in _FIELD_SPECIFIERS:
        return _specified_default(value)
    return ast.unparse(value)


def transform_specifiers(transform: str | None) -> set[str]:
    """Return the last names of the field specifiers a `dataclass_transform(...)` source declares."""
    if transform is None:
        return set()
    call = ast.parse(transform, mode="eval").body
    for keyword in call.keywords if isinstance(call, ast.Call) else []:
        if keyword.arg == "field_specifiers" and isinstance(keyword.value, (ast.Tuple, ast.List)):
            return {(_dotted(e) or "").split(".")[-1] for e in keyword.value.elts}
    return set()


_PLAIN_METACLASSES = {"type", "abc.ABCMeta", "ABCMeta"}
_ANY_ARGUMENTS = Signature([Param("args", "varpos", None), Param("kwargs", "varkw", None)])
_ENUM_CALL = Signature([Param(p.name, _PARAMETER_KINDS[p.kind], None if p.default is p.empty else repr(p.default))
                        for p in list(inspect.signature(enum.EnumMeta.__call__).parameters.values())[1:]])


def _transform_source(klass: Klass) -> str | None:
    """Return the `dataclass_transform(...)` decorating `klass` itself, as written, or None."""
    return next((s for s in klass.decorator_sources if "dataclass_transform" in s.split("(")[0]), None)


def _taken_keywords(decorator: Function, source: str) -> list[tuple[str | None, str | None]] | None:
    """Return the (taken, renamed to) keyword names a `_wraps_as` "takes" decorator's wrapper handles, with
    the decorator's parameters bound to the string literals of its call as written (`source`:
    `deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")`) or to their defaults; None when one is
    not a literal."""
    try:
        call = ast.parse(source, mode="eval").body
    except SyntaxError:
        return None
    values: dict[str, object] = {}
    for param in decorator.signature.params:
        if param.default is not None:
            try:
                values[param.name] = ast.literal_eval(param.default)
            except ValueError:
                pass
    if isinstance(call, ast.Call):
        positional = [p for p in decorator.signature.params if p.kind in ("posonly", "pos")]
        values.update({p.name: a.value for p, a in zip(positional, call.args) if isinstance(a, ast.Constant)})
        values.update({k.arg: k.value.value for k in call.keywords if k.arg and isinstance(k.value, ast.Constant)})

    def name_of(text: str) -> str | None:
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = values.get(text)
        return value if isinstance(value, str) else None

    taken: list[tuple[str | None, str | None]] = []
    for old, new in decorator.takes_keywords:
        name, renamed = (name_of(old) if old is not None else None), (name_of(new) if new is not None else None)
        if old is not None and name is None or new is not None and renamed is None:
            return None
        taken.append((name, renamed))
    return taken


def _wraps_as(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str | None, list[tuple[str | None, str | None]]]:
    """Return what a call of a function decorated by `node` binds against when `node` returns a nested
    `(*args, **kwargs)` or `(self, *args, **kwargs)` wrapper, and the keywords that wrapper takes out (`eyas.audit.wrappers`):

    - "anything": the wrapper never copies the wrapped signature (`functools.wraps`, `update_wrapper`);
    - "filters": it copies it, only reads its keywords and calls on with others: any keyword binds;
    - "takes": it copies it and takes keywords out, perhaps renamed (transformers' `deprecate_kwarg`), or
      sets some itself (vLLM's `_sync_retry` sets `timeout`);
    - "edits": it copies it but edits its keywords otherwise, or writes its own `__signature__`;
    - None: the decorated function's own signature decides."""
    inner = [n for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n is not node]
    wrappers = [n for n in inner if n.args.vararg and n.args.kwarg and signature_of(n.args).passes_through]
    if not wrappers:
        return None, []
    text = ast.unparse(node)
    if "wraps" not in text and "update_wrapper" not in text:
        return "anything", []
    uses = [keyword_use(w) for w in wrappers]
    taken = [pair for use in uses for pair in use.takes]
    if any(use.other_edits for use in uses):
        return "edits", []
    if taken:
        return "takes", taken
    if "__signature__" in text:
        return "edits", []
    return ("filters" if all(use.only_reads for use in uses) else None), []


def _sets_members(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[str], dict[str, Signature]]:
    """Return the attribute names the function (or a function inside it) assigns on one of its parameters
    (`cls.validate = validate`), "*" for a `setattr` on a parameter with a computed name; and, of those, the
    ones set to a function defined inside it, with that function's signature."""
    names: set[str] = set()
    methods: dict[str, Signature] = {}
    for function in [n for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        params = {a.arg for a in [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]}
        local = {n.name: n for n in function.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for item in ast.walk(function):
            set_on: list[tuple[str, ast.expr | None]] = []
            if isinstance(item, (ast.Assign, ast.AnnAssign)):
                targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                set_on = [(t.attr, item.value) for t in targets if isinstance(t, ast.Attribute)
                          and isinstance(t.value, ast.Name) and t.value.id in params]
            elif (isinstance(item, ast.Call) and isinstance(item.func, ast.Name) and item.func.id == "setattr"
                    and item.args and isinstance(item.args[0], ast.Name) and item.args[0].id in params):
                second = item.args[1] if len(item.args) > 1 else None
                named = second.value if isinstance(second, ast.Constant) and isinstance(second.value, str) else "*"
                set_on = [(named, item.args[2] if len(item.args) > 2 else None)]
            for name, value in set_on:
                names.add(name)
                if isinstance(value, ast.Name) and value.id in local:
                    methods[name] = signature_of(local[value.id].args)
    return sorted(names), methods


def _own_nodes(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.AST]:
    """Return the nodes of the function's own body (nested functions and classes excluded)."""
    found: list[ast.AST] = []
    pending: list[ast.AST] = list(node.body)
    while pending:
        item = pending.pop()
        found.append(item)
        if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            pending.extend(ast.iter_child_nodes(item))
    return found


def _return_shape(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """Return the shape every `return` of the body gives when they all agree: a list or tuple display of n
    elements, a dict display, or "value" (a name, a call: anything else); None when they disagree, when
    it only returns None, or for a generator."""
    shapes = set()
    for item in _own_nodes(node):
        if isinstance(item, ast.Return):
            value = item.value
            if value is None or isinstance(value, ast.Constant) and value.value is None:
                shapes.add("None")
            elif isinstance(value, (ast.List, ast.Tuple)) and not any(isinstance(e, ast.Starred) for e in value.elts):
                shapes.add(f"{'list' if isinstance(value, ast.List) else 'tuple'} of {len(value.elts)}")
            elif isinstance(value, ast.Dict):
                shapes.add("dict")
            else:
                shapes.add("value")
        elif isinstance(item, (ast.Yield, ast.YieldFrom)):
            return None
    return shapes.pop() if len(shapes) == 1 and shapes != {"None"} else None


_STATE_ERROR = re.compile(r"\b(first|before|prior to|has not been|have not been|was not|not yet|must be called|must call|"
                          r"call \S+ (?:first|before))\b", re.IGNORECASE)


def _state_errors(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """Return the messages the body raises that speak of a call to make first ("call `prepare()` first",
    "load_weights must be called before ..."): the text of their string parts."""
    messages = []
    for item in _own_nodes(node):
        if isinstance(item, ast.Raise) and isinstance(item.exc, ast.Call) and item.exc.args:
            text = " ".join(part.value for part in ast.walk(item.exc.args[0])
                            if isinstance(part, ast.Constant) and isinstance(part.value, str))
            if _STATE_ERROR.search(text) and re.search(r"\w\(\)|`\w+`", text):
                messages.append(text.strip()[:200])
    return messages


def _config_forbids_extra(config: ast.ClassDef) -> bool:
    """Return True for a pydantic 1 `class Config:` that sets `extra = Extra.forbid` (or "forbid"), annotated or not."""
    for item in config.body:
        targets = item.targets if isinstance(item, ast.Assign) else [item.target] if isinstance(item, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "extra" for t in targets) and item.value is not None \
                and "forbid" in ast.unparse(item.value):
            return True
    return False


def _forwards(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Return True when the body hands its own `*args` and `**kwargs` to the same method of a base class
    (`super().name(*args, **kwargs)`, `Base.name(self, *args, **kwargs)`)."""
    star, double = node.args.vararg, node.args.kwarg
    if star is None or double is None:
        return False
    for call in ast.walk(node):
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == node.name
                and (isinstance(call.func.value, ast.Call) and ast.unparse(call.func.value.func) == "super"
                     or isinstance(call.func.value, (ast.Name, ast.Attribute)))
                and any(isinstance(a, ast.Starred) and ast.unparse(a.value) == star.arg for a in call.args)
                and any(k.arg is None and ast.unparse(k.value) == double.arg for k in call.keywords)):
            return ast.unparse(call.func.value).split(".")[0] not in ("self", "cls")  # not another object's method
    return False


def _changes_all(node: ast.stmt) -> bool:
    """Return True for a statement that changes `__all__` in place: `__all__ += ...`, `__all__.extend(...)`."""
    if isinstance(node, ast.AugAssign):
        return isinstance(node.target, ast.Name) and node.target.id == "__all__"
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute)
            and isinstance(node.value.func.value, ast.Name) and node.value.func.value.id == "__all__")


def _literal_all(text: str) -> set[str] | None:
    """Return the names of a module's `__all__` when its source assigns it once, as a literal list or tuple
    of strings, and never changes it; None when `__all__` is absent or built otherwise."""
    if text.count("__all__") != 1:
        return None
    found = _ALL_LIST.search(text)
    if found is None or not re.fullmatch(r"[\s,]*(?:(?:[\"']\w+[\"']|#[^\n]*)[\s,]*)*", found.group(1)):
        return None
    return set(_QUOTED_NAME.findall(found.group(1)))


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
        member = self.module.members.get(head)
        if head in self.imports:
            base = self.imports[head]
        elif isinstance(member, Alias):  # `_Meta = _construction.ModelMetaclass`, a re-binding of an import
            base = member.target
        elif member is not None:
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
                if "TYPE_CHECKING" in ast.unparse(node.test):
                    self._body(node.body, True)
                    self._body(node.orelse, type_checking)  # read last: under `if TYPE_CHECKING:` the else is what runs
                else:  # the branch a condition names is the usual configuration (`if _enabled:`), the else its fallback
                    self._body(node.orelse, type_checking)
                    self._body(node.body, type_checking)
            elif isinstance(node, ast.Try):
                self._body(node.body, type_checking)
                for handler in node.handlers:
                    self._body(handler.body, type_checking)
                self._body(node.orelse, type_checking)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)):  # a module-level loop's imports bind too
                self._body(node.body, type_checking)
                self._body(node.orelse, type_checking)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                self._body(node.body, type_checking)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name == "__getattr__":
                    self.module.lazy_getattr = True
                self.module.members[node.name] = self._function(node, f"{self.module.name}.{node.name}")
            elif isinstance(node, ast.ClassDef):
                self.module.members[node.name] = self._class(node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                if isinstance(node, ast.Assign) and any(isinstance(t, ast.Subscript) and ast.unparse(t.value) == "sys.modules"
                                                        for t in node.targets):
                    self.module.lazy_module = True
                self._assign(node)
            elif _changes_all(node):
                self._extend_all(node)

    def _extend_all(self, node: ast.stmt) -> None:
        """`__all__ += [...]` with literal names adds them; any other change (`.extend(x)`, `+= other.__all__`)
        leaves what a star import takes unknown."""
        added = None
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
            try:
                added = [str(v) for v in ast.literal_eval(node.value)]
            except ValueError:
                added = None
        self.module.all = self.module.all + added if self.module.all is not None and added is not None else None

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
            if node.value is not None and (bound := self._bound_function(node.value, f"{self.module.name}.{target.id}")):
                self.module.members[target.id] = bound
                continue
            if isinstance(node.value, ast.Call) and (made := self._namedtuple(node.value, target.id, node.lineno)):
                self.module.members[target.id] = made
                continue
            value = _dotted(node.value) if node.value is not None else None
            if value and isinstance(node.value, (ast.Name, ast.Attribute)) and self.qualify(value) != value:
                self.module.members[target.id] = Alias(self.qualify(value) or value)  # re-binding of an import
                continue
            self.module.members[target.id] = Attribute(
                target.id, node.lineno, ast.unparse(node.annotation) if isinstance(node, ast.AnnAssign) else None,
                ast.unparse(node.value) if node.value is not None else None, node.value is not None)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef, qualname: str) -> Function:
        decorators = [self.qualify(_dotted(d)) or ast.unparse(d) for d in node.decorator_list]
        transform = next((ast.unparse(d) for d, q in zip(node.decorator_list, decorators) if q.endswith("dataclass_transform")),
                         None)
        wraps_as, takes = _wraps_as(node)
        # one `@overload` of several says little of the others: a stub's last one stands for them all
        signature = _ANY_ARGUMENTS if any(d.split(".")[-1] == "overload" for d in decorators) else signature_of(node.args)
        return Function(node.name, qualname, node.lineno, signature,
                        ast.unparse(node.returns) if node.returns else None, decorators, ast.get_docstring(node),
                        self.qualify(_dotted(_annotated_type(node.returns))) if node.returns else None, transform,
                        wraps_as, _forwards(node), *_sets_members(node), _return_shape(node),
                        _state_errors(node), takes, [ast.unparse(d) for d in node.decorator_list])

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
            if keyword.arg == "metaclass":
                klass.metaclass = self.qualify(_dotted(keyword.value))
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                function = self._function(item, f"{qualname}.{item.name}")
                function.decorators = [f"{qualname}.{d}" if d in klass.methods else d for d in function.decorators]
                if item.name in klass.methods and function.decorators and function.decorators[-1].endswith(".setter"):
                    continue  # the getter stays the member
                klass.methods[item.name] = function
                self._instance_attributes(item, klass)
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                name = item.target.id
                if item.value is not None and (bound := self._bound_function(item.value, f"{qualname}.{name}", klass)):
                    klass.methods[name] = bound  # `forward: Callable[..., Any] = _forward_unimplemented`
                annotation = ast.unparse(item.annotation)
                default = _field_default(item.value)
                attribute = Attribute(name, item.lineno, annotation, default, default is not None)
                klass.attributes[name] = attribute
                if "ClassVar" not in annotation:
                    klass.field_order.append(name)
                if isinstance(item.value, ast.Call):
                    attribute.specifier = self.qualify(_dotted(item.value.func))
                    attribute.specified_default = _specified_default(item.value)
                    for keyword in item.value.keywords:
                        if keyword.arg == "alias" and isinstance(keyword.value, ast.Constant):
                            attribute.alias = str(keyword.value.value)
                        if keyword.arg == "init" and ast.unparse(keyword.value) == "False":
                            klass.init_false.add(name)
                        if keyword.arg == "kw_only" and ast.unparse(keyword.value) == "True":
                            klass.kw_only_fields.add(name)
            elif isinstance(item, ast.ClassDef) and item.name == "Config" and _config_forbids_extra(item):
                klass.forbids_extra = True
            elif isinstance(item, (ast.Import, ast.ImportFrom)):  # `from .utils import save_metrics` in a class body
                for alias in item.names:
                    local = alias.asname or alias.name.split(".")[0]
                    klass.attributes[local] = Attribute(local, item.lineno, None, None, True)
            elif isinstance(item, ast.Assign):
                for target in item.targets:
                    if isinstance(target, ast.Name):
                        if target.id == "model_config" and "forbid" in ast.unparse(item.value):
                            klass.forbids_extra = True
                        klass.attributes[target.id] = Attribute(target.id, item.lineno, None, ast.unparse(item.value), True)
                        if bound := self._bound_function(item.value, f"{qualname}.{target.id}", klass):
                            klass.methods[target.id] = bound  # `with_args = classmethod(_with_args)`
        return klass

    def _namedtuple(self, call: ast.Call, name: str, lineno: int) -> Klass | None:
        """Return the class a `collections.namedtuple("Name", fields, defaults=...)` call makes, its fields as
        literals (a list or tuple of strings, or one string separated by spaces or commas); None otherwise."""
        if (self.qualify(_dotted(call.func)) or "") not in ("collections.namedtuple", "namedtuple") or len(call.args) != 2:
            return None
        try:
            fields = ast.literal_eval(call.args[1])
            keywords = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg in ("defaults", "rename")}
        except ValueError:
            return None
        names = fields.replace(",", " ").split() if isinstance(fields, str) else list(fields)
        if keywords.get("rename") or not all(isinstance(n, str) for n in names):
            return None
        defaulted = len(keywords.get("defaults") or ())
        klass = Klass(name, f"{self.module.name}.{name}", self.module.name, lineno, ["typing.NamedTuple", "tuple"], [])
        for index, field_name in enumerate(names):
            default = "..." if index >= len(names) - defaulted else None
            klass.attributes[field_name] = Attribute(field_name, lineno, None, default, default is not None)
            klass.field_order.append(field_name)
        return klass

    def _bound_function(self, value: ast.expr, qualname: str, klass: Klass | None = None) -> Function | None:
        """Return the function an assignment binds when its value names one defined above (in the class body
        or the module) or applies decorators to one, each called with it alone (`f = deprecated("...")(g)`,
        `with_args = classmethod(_with_args)`): that function under the new name, the decorators added."""
        applied: list[ast.expr] = []
        while isinstance(value, ast.Call) and len(value.args) == 1 and not value.keywords:
            applied.append(value.func)
            value = value.args[0]
        if not isinstance(value, ast.Name) or klass is None and not applied:
            return None  # a module-level `g = f` is an alias already
        found = (klass.methods.get(value.id) if klass else None) or self.module.members.get(value.id)
        if not isinstance(found, Function):
            return None
        return replace(found, name=qualname.rsplit(".", 1)[-1], qualname=qualname,
                       decorators=[*(self.qualify(_dotted(d)) or ast.unparse(d) for d in applied), *found.decorators],
                       decorator_sources=[*(ast.unparse(d) for d in applied), *found.decorator_sources])

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
        """`roots` come first; the running Python's standard library is read after them, so a class whose
        base is `uuid.UUID` or `pathlib.Path` has that base's source (a C module stays unread)."""
        self.roots, self.cache = [*roots, STDLIB], cache
        self._modules: dict[str, Module | None] = {}
        self._scans: dict[str, tuple[str, list[str]] | None] = {}
        self._structures: dict[str, dict[str, str]] = {}  # lazy package -> name -> module its import structure names
        self._lookups: dict[str, Member | None] = {}
        self._mros: dict[str, list[Klass]] = {}
        self._defines: dict[tuple[str, str], bool] = {}
        self._method_index: dict[str, dict[str, set[str]]] = {}  # package -> method name -> modules defining it

    def find_file(self, name: str) -> tuple[Path, bool] | None:
        """Return the source of module `name` and whether it is a package: its `.py`, else the `.pyi` stub an
        extension module ships (`torch/_C/__init__.pyi`), else a namespace package's directory; None when
        no root has it."""
        parts = name.split(".")
        for root in self.roots:
            base = root.joinpath(*parts)
            for suffix in (".py", ".pyi"):
                if (base / f"__init__{suffix}").is_file():
                    return base / f"__init__{suffix}", True
                if base.with_suffix(suffix).is_file():
                    return base.with_suffix(suffix), False
            if base.is_dir() and len(parts) > 1:  # a namespace package
                return base, True
        return None

    def unreadable(self, name: str) -> bool:
        """Return True when module `name` exists without source the model reads: built into the interpreter,
        a compiled extension (`.so`, `.pyd`), or in a package outside the model. False for a module with
        source, and for one its own readable package does not have (transformers 4.57's TYPE_CHECKING
        star-imports of misspelt modules, which nothing executes)."""
        if self.find_file(name) is not None:
            return False
        if name in sys.builtin_module_names or self.find_file(name.split(".")[0]) is None:
            return True
        parent, _, last = name.rpartition(".")
        for root in (*self.roots, STDLIB / "lib-dynload"):
            folder = root.joinpath(*parent.split(".")) if parent else root
            if folder.is_dir() and any(p.suffix in _EXTENSION_SUFFIXES for p in folder.glob(f"{last}.*")):
                return True
        return False

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
        parent = self.module(".".join(parts[:-1])) if len(parts) > 1 else None
        if parent is not None and self.module(qualname) is not None:
            bound = self.member_of(parent, parts[-1], seen)
            if bound is not None and not isinstance(bound, Module):
                return bound  # `from .quantize import quantize` (or `*`) rebinds the submodule's name in its package
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
            owner = self._follow(owner.target, seen)  # type: ignore[assignment]
        if isinstance(owner, (Attribute, Opaque)) or (isinstance(owner, Function) and name.startswith("__")):
            return Opaque(name)
        if isinstance(owner, Module):
            member = owner.members.get(name)
            if isinstance(member, Alias):
                return self._follow(member.target, seen)
            if member is not None:
                return member
            if owner.lazy_module and name in self._import_structure(owner):
                # a `_LazyModule` serves its import structure and submodules; its star imports run only for type checkers
                return self.lookup(f"{self._import_structure(owner)[name]}.{name}", seen)
            if owner.lazy_module and owner.is_package and (submodule := self.module(f"{owner.name}.{name}")) is not None:
                return submodule
            for source in owner.star_imports:  # `from .quantize import *` rebinds the submodule's name `quantize`
                if (source, name) not in self._defines:
                    self._defines[(source, name)] = self._could_define(source, name, set())
                if not self._defines[(source, name)]:
                    continue  # a text search spares parsing the hundreds of modules a package star-imports
                exporting = self.module(source)
                if exporting is not None and (name not in exporting.all if exporting.all is not None else name.startswith("_")):
                    continue  # `from m import *` takes only what m's __all__ lists, else only names without "_"
                found = self.lookup(f"{source}.{name}", seen)
                if found is not None:
                    return found
            submodule = self.module(f"{owner.name}.{name}") if owner.is_package else None
            if submodule is None and any(self.unreadable(source) for source in owner.star_imports):
                return Opaque(name)  # `from posix import *` (a module without source) may define anything
            return submodule
        if isinstance(owner, Klass):
            for klass in self.mro(owner):
                if name in klass.methods:
                    return klass.methods[name]
                if name in klass.attributes:
                    return klass.attributes[name]
            if name in OBJECT_MEMBERS:
                return Opaque(name)
            return self._added_by_decorator(owner, name)
        return None

    def _added_by_decorator(self, klass: Klass, name: str) -> Member | None:
        """Return member `name` when a class decorator of the package (in the MRO) sets it on the class:
        the function it defines and sets (`cls.validate = validate`: huggingface_hub's `@strict`), opaque
        when it sets another value or a `setattr` whose name it does not spell; None when none sets it."""
        for current in self.mro(klass):
            for decorator in current.decorators:
                found = self.decorator_function(decorator)
                if found is None:
                    continue
                if name in found.sets_methods:
                    return Function(name, f"{current.qualname}.{name}", found.lineno, found.sets_methods[name], None, [])
                if name in found.sets_members or "*" in found.sets_members:
                    return Opaque(name)
        return None

    def decorator_function(self, decorator: str) -> Function | None:
        """Return the package function a decorator (qualified as written) names, or None."""
        found = self.lookup(decorator) if "." in decorator else None
        return found if isinstance(found, Function) else None

    def _follow(self, target: str, seen: frozenset[str]) -> Member | None:
        """Return what an import or re-binding names; a name from a package outside the model (`uuid.UUID`
        re-exported) is opaque, not missing."""
        found = self.lookup(target, seen)
        if found is None and self.find_file(target.split(".")[0]) is None:
            return Opaque(target.rsplit(".", 1)[-1])
        return found

    def call_signature(self, function: Function) -> Signature:
        """Return the signature a call of `function` binds, through the package's decorators that replace it
        by a `(*args, **kwargs)` wrapper (`_wraps_as`): `(*args, **kwargs)` for one that copies no signature;
        its own plus `**kwargs` for one that filters keywords; its own plus the keywords one takes out (with
        their names read from the decorator's arguments; a renamed-to parameter need not be given); its own
        when it has `**kwargs` and a wrapper edits them otherwise (or takes keywords it cannot name), else
        `(*args, **kwargs)`."""
        signature = function.signature
        applied = list(zip(function.decorators, function.decorator_sources or function.decorators))
        for decorator, source in reversed(applied):  # the innermost first: Python applies decorators bottom-up
            found = self.decorator_function(decorator)
            if found is None or found.wraps_as is None:
                continue
            if found.wraps_as == "anything":
                return _ANY_ARGUMENTS
            if found.wraps_as == "filters" and not signature.accepts_any_keyword:
                signature = Signature([*signature.params, Param("kwargs", "varkw", None)])
            elif found.wraps_as == "takes" and (taken := _taken_keywords(found, source)) is not None:
                signature = signature.with_taken_keywords(taken)
            elif found.wraps_as in ("takes", "edits") and not signature.accepts_any_keyword:
                return _ANY_ARGUMENTS
        return signature

    def concrete_member(self, klass: Klass, name: str) -> Member | None:
        """Return member `name` through the MRO, skipping `(*args, **kwargs)` pass-through overrides: a
        call binds against the signature such a wrapper forwards to."""
        first = None
        for current in self.mro(klass):
            member = current.methods.get(name) or current.attributes.get(name)
            if member is None:
                continue
            first = first or member
            if not (isinstance(member, Function) and member.forwarder) or self.is_open(current):
                return member  # below an unmodelled base (a C class), `super()` may be that base's method
        return first

    def _could_define(self, module: str, name: str, visited: set[str]) -> bool:
        """Return False when `from module import *` cannot bind `name`: its literal `__all__` does not list it,
        or its source (and that of what it star-imports) never spells it as a word (a text test: a false hit
        only costs a parse)."""
        if module in visited:
            return False
        visited.add(module)
        scanned = self._scan(module)
        if scanned is None:
            return self.find_file(module) is not None
        text, star_sources = scanned
        listed = _literal_all(text)
        if listed is not None:
            return name in listed  # `from m import *` takes exactly what a literal `__all__` lists
        return (name in text and re.search(rf"\b{re.escape(name)}\b", text) is not None  # a binding spells it as a word
                or any(self._could_define(source, name, visited) for source in star_sources))

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

    def classes_defining(self, method: str, package: str) -> Iterator[str]:
        """Yield the qualified names of the classes of `package` whose body defines method `method` (found by
        a text index of every `def` indented in a class, built once per model; a module naming it is loaded
        only when the caller asks for more classes)."""
        if package not in self._method_index:
            index: dict[str, set[str]] = {}
            found = self.find_file(package)
            files = sorted(found[0].parent.rglob("*.py")) if found is not None and found[1] else []
            for path in files:
                text = path.read_text(encoding="utf-8", errors="replace")
                module = ".".join(path.relative_to(found[0].parent.parent).with_suffix("").parts).removesuffix(".__init__")  # type: ignore[index]
                for name in set(_METHOD_DEF.findall(text)):
                    index.setdefault(name, set()).add(module)
            self._method_index[package] = index
        for module_name in sorted(self._method_index[package].get(method, ())):
            module = self.module(module_name)
            for member in (module.members.values() if module is not None else ()):
                if isinstance(member, Klass) and member.module == module_name and method in member.methods:
                    yield member.qualname

    def find_parsed(self, name: str, package: str) -> str | None:
        """Return where an already-parsed module of `package` defines `name` (a moved definition), or None."""
        for module in self._modules.values():
            if module is not None and module.name.split(".")[0] == package and isinstance(
                    module.members.get(name), (Klass, Function)):
                return f"{module.name}.{name}"
        return None

    def hidden_by_lazy_module(self, qualname: str) -> bool:
        """Return True when a missing `qualname` may be served by a module `__getattr__` of its parent."""
        module = self.lookup(qualname.rpartition(".")[0])
        return isinstance(module, Module) and module.lazy_getattr

    def lazily_named(self, qualname: str) -> bool:
        """Return True when a lazy parent module (a module `__getattr__`, or a `_LazyModule` put in
        `sys.modules`) spells the missing name in its source: its import structure serves it."""
        module = self.lookup(qualname.rpartition(".")[0])
        if not (isinstance(module, Module) and (module.lazy_getattr or module.lazy_module)):
            return False
        scanned = self._scan(module.name)
        name = qualname.rpartition(".")[2]
        if scanned is not None and "define_import_structure" in scanned[0] and module.is_package:
            # transformers' structure from every module file of the package, not only those TYPE_CHECKING names
            if any(name in (self._scan(f"{module.name}.{f.stem}") or ("", []))[0] for f in module.path.parent.glob("*.py")):
                return True
            return name in self._import_structure(module)
        return scanned is not None and name in scanned[0]

    @staticmethod
    def _literal_structure(module: Module) -> dict[str, str]:
        """Return name -> submodule from a lazy package's literal `_import_structure = {"mxfp4": [...]}`."""
        written = module.members.get("_import_structure")
        try:
            value = ast.literal_eval(written.default) if isinstance(written, Attribute) and written.default else None
        except (ValueError, SyntaxError):
            return {}
        if not isinstance(value, dict):
            return {}
        return {name: f"{module.name}.{submodule}" for submodule, names in value.items() if isinstance(submodule, str)
                and isinstance(names, (list, tuple)) for name in names if isinstance(name, str)}

    def _import_structure(self, module: Module) -> dict[str, str]:
        """Return, for a lazy package `module`, each name its import structure serves -> the module defining
        it: its literal `_import_structure` dict, and every name an `__all__` lists in the files under the
        directories it hands to `define_import_structure` (transformers' `models/`, walked at import time:
        its TYPE_CHECKING imports may miss newer models). Empty for other modules; read once."""
        if module.name not in self._structures:
            structure = self._literal_structure(module)
            scanned = self._scan(module.name) if module.is_package else None
            for found in _IMPORT_STRUCTURE.finditer(scanned[0] if scanned is not None else ""):
                directory = module.path.parent.joinpath(*_QUOTED_NAME.findall(found.group(1)))
                for path in sorted(directory.rglob("*.py")):
                    parts = path.relative_to(module.path.parent).with_suffix("").parts
                    defining = ".".join((module.name, *parts)).removesuffix(".__init__")
                    for listed in _ALL_LIST.findall(path.read_text(encoding="utf-8", errors="replace")):
                        for name in _QUOTED_NAME.findall(listed):
                            structure.setdefault(name, defining)
            self._structures[module.name] = structure
        return self._structures[module.name]

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
        """Return True when members of `klass` cannot be known: a base outside the model, a `__getattr__`, or
        a class declared in a `.pyi` stub (an extension type: Python code may add members to it at run time,
        as torch does to `torch._C.ScriptMethod`)."""
        return any("__getattr__" in current.methods or self._from_stub(current) for current in self.mro(klass)) \
            or self.has_unmodelled_base(klass)

    def _from_stub(self, klass: Klass) -> bool:
        module = self.module(klass.module)
        return module is not None and module.path.suffix == ".pyi"

    def has_unmodelled_base(self, klass: Klass) -> bool:
        """Return True when a class in the MRO of `klass` has a base outside the model (a C or stdlib class
        the package does not define): its `__init__` and members are not read."""
        for current in self.mro(klass):
            for base in current.bases:
                if base not in ("object", "type", "typing.Generic", "Generic") and not base.startswith(("typing.", "abc.")) \
                        and self.resolve_class(base) is None and base not in FIELD_BASES and "Protocol" not in base:
                    return True
        return False

    def field_kind(self, klass: Klass) -> str | None:
        """Return how the class synthesizes `__init__` from fields: dataclass, pydantic, msgspec, namedtuple,
        transform (PEP 681 `dataclass_transform`), or None."""
        for current in self.mro(klass):
            if any(self._transform_function(d) for d in current.decorators) or current is not klass and _transform_source(current):
                return "transform"  # a PEP 681 base decides for its subclasses, whatever decorates the base itself
            if any(self._synthesizing_decorator(current, d, s) for d, s in zip(current.decorators, current.decorator_sources)):
                return "dataclass"  # pydantic dataclasses bind as standard dataclasses do
            for base in current.bases:
                if base in FIELD_BASES or base.endswith(("BaseModel", "msgspec.Struct", "NamedTuple")):
                    return FIELD_BASES.get(base) or ("pydantic" if base.endswith("BaseModel") else
                                                     "msgspec" if base.endswith("Struct") else "namedtuple")
        return "transform" if self.transform_of(klass) else None

    def _transform_function(self, decorator: str) -> Function | None:
        found = self.decorator_function(decorator)
        return found if found is not None and found.transform else None

    def _synthesizing_decorator(self, klass: Klass, decorator: str, source: str) -> bool:
        """Return True when `decorator` writes the class's `__init__` from its fields (not with `init=False`)."""
        if "init=False" in source.replace(" ", ""):
            return False
        return (decorator.split("(")[0] in DATACLASS_DECORATORS or decorator.endswith((".dataclass", ".define", ".frozen"))
                or self._transform_function(decorator) is not None)

    def transform_of(self, klass: Klass) -> str | None:
        """Return the `dataclass_transform(...)` that makes `klass` dataclass-like, in any of PEP 681's
        three forms (a decorator function, a base class, a metaclass), or None."""
        for current in self.mro(klass):
            for decorator in current.decorators:
                if (function := self._transform_function(decorator)) is not None:
                    return function.transform
            if current is not klass and (source := _transform_source(current)):
                return source
            meta = self.resolve_class(current.metaclass) if current.metaclass else None
            for meta_class in self.mro(meta) if meta else []:
                if source := _transform_source(meta_class):
                    return source
        return None

    def _synthesis_root(self, klass: Klass) -> bool:
        """Return True for a class whose own `__init__` its field-synthesizing subclasses never use:
        pydantic's BaseModel, msgspec's Struct, NamedTuple, a PEP 681 base or metaclass user."""
        if klass.qualname in FIELD_BASES or _transform_source(klass):
            return True
        meta = self.resolve_class(klass.metaclass) if klass.metaclass else None
        return meta is not None and any(_transform_source(m) for m in self.mro(meta))

    def built_by_machinery(self, klass: Klass) -> bool:
        """Return True when Python builds instances of `klass` through machinery the model does not follow:
        a metaclass defining `__call__` or `__setattr__` (which rewrites the `__init__` a dataclass sets:
        transformers' ModelOutput), one outside the model, or an `__init_subclass__` that sets `__init__`
        or `__new__` on the subclass."""
        for current in self.mro(klass):
            if current.module in ("typing", "typing_extensions"):
                continue  # Protocol's and Generic's hooks: `constructor` models protocols by name
            hook = current.methods.get("__init_subclass__")
            if hook is not None and {"__init__", "__new__", "*"} & set(hook.sets_members):
                return True
            if current.metaclass is None or current.metaclass in _PLAIN_METACLASSES:
                continue
            meta = self.resolve_class(current.metaclass)
            if meta is None or self.has_unmodelled_base(meta) or any({"__call__", "__setattr__"} & set(m.methods)
                                                                     for m in self.mro(meta)):
                return True
        return False

    def constructor(self, klass: Klass) -> Signature | None:
        """Return the signature a call of `klass` binds against (without self), or None when unknown.

        As Python builds it: an `__init__` (or `__new__`) in a class body beats any synthesis from
        fields (a dataclass keeps its own `__init__`; classic `attr.s` without `auto_detect` replaces it);
        a field-synthesizing decorator writes the decorated class's `__init__`; a pydantic model, msgspec
        Struct, NamedTuple or PEP 681 base/metaclass user gets one from all its fields unless a class
        below the framework's root defines one. Below a protocol, a class without an `__init__` takes anything;
        an Enum binds as this Python's enum metaclass `__call__`; any other metaclass `__call__` is unknown."""
        if any(b.split(".")[0] == "enum" or b.endswith(("Enum", "Flag")) and self.resolve_class(b) is None
               for current in self.mro(klass) for b in current.bases):
            return _ENUM_CALL  # `Color(value)` is a member lookup by the enum metaclass, whatever the class defines
        if self.built_by_machinery(klass):
            return None
        forwarder: Signature | None = None
        for current in self.mro(klass):
            if current is not klass and self._synthesis_root(current):
                break
            if any(b.split(".")[-1] == "Protocol" for b in current.bases):
                return _ANY_ARGUMENTS  # a protocol's init stand-in: refuses a protocol, takes anything otherwise
            own = current.methods.get("__init__") or current.methods.get("__new__")
            replaced = any(s.startswith(("attr.s", "attr.attrs", "attrs.attrs")) and "auto_detect=True" not in s
                           for s in current.decorator_sources)
            if own is not None and not replaced:
                signature = self.call_signature(own).without_first()
                if not own.forwarder:
                    return self._pydantic_init(klass, signature) if signature.accepts_any_keyword else signature
                forwarder = forwarder or signature  # `(self, *args, **kwargs)`: binds as the next one does
            if any(self._synthesizing_decorator(current, d, s) for d, s in zip(current.decorators, current.decorator_sources)):
                break
        kind = self.field_kind(klass)
        if kind is None:
            # a forwarder hands its arguments to object (an instance `__getattr__` plays no part in a call)
            return forwarder if self.has_unmodelled_base(klass) else Signature([])
        return self._fields_signature(klass, kind)

    def _pydantic_init(self, klass: Klass, init: Signature) -> Signature:
        """Return a pydantic model's own `__init__` with `**kwargs` as pydantic (v1 and v2) describes it: the
        model's fields it does not name become keyword-only parameters, and `**kwargs` stays unless the model
        forbids extra fields. Another class's `init` is returned as is."""
        kind = self.field_kind(klass)
        pydantic = kind == "pydantic" or kind == "transform" and any(
            c.qualname.split(".")[0] == "pydantic" and c.name == "BaseModel" for c in self.mro(klass))
        if not pydantic:
            return init
        fields = self._fields_signature(klass, "pydantic")
        named = [p for p in init.params if p.kind != "varkw"]
        added = [p for p in fields.params if p.kind != "varkw" and init.param(p.name) is None]
        extra = [p for p in init.params if p.kind == "varkw"] if not any(k.forbids_extra for k in self.mro(klass)) else []
        return Signature([*named, *added, *extra])

    def _fields_signature(self, klass: Klass, kind: str) -> Signature:
        """Return the `__init__` synthesized from the fields of `klass` and its bases (base fields first; a
        redefined field keeps its place; keyword-only fields last), for field kind `kind`."""
        transform = self.transform_of(klass) if kind == "transform" else None
        specifiers = {*_FIELD_SPECIFIERS, *transform_specifiers(transform)}
        params: dict[str, Param] = {}
        aliased = False
        for current in reversed(self.mro(klass)):
            own = " ".join(current.decorator_sources).replace(" ", "")
            transformed = transform is not None and not _transform_source(current)  # a PEP 681 base's own fields are its own
            class_keyword_only = kind == "pydantic" or "kw_only=True" in own or (
                "kw_only=False" not in own and transformed and "kw_only_default=True" in transform)
            after_marker = False
            for name in current.field_order:
                attribute = current.attributes[name]
                if (attribute.annotation or "").split(".")[-1] == "KW_ONLY":
                    after_marker = True  # `_: KW_ONLY`: the fields below it are keyword-only
                    continue
                if name in current.init_false or name.startswith("_") and kind == "pydantic":
                    params.pop(name, None)
                    continue
                specified = attribute.specifier is not None and attribute.specifier.split(".")[-1] in specifiers
                default = attribute.specified_default if specified else attribute.default if attribute.has_value else None
                keyword_only = class_keyword_only or after_marker or name in current.kw_only_fields
                aliased = aliased or bool(specified and attribute.alias)
                shown = attribute.alias if specified and attribute.alias and kind == "transform" else name
                params[name] = Param(shown, "kwonly" if keyword_only else "pos", default, attribute.annotation)
        sources = [d for k in self.mro(klass) for d in k.decorator_sources]
        extra = (kind == "pydantic" and (aliased or not any(k.forbids_extra for k in self.mro(klass)))
                 or any("accept_kwargs=True" in d for d in sources))  # huggingface_hub's strict dataclasses
        ordered = [p for p in params.values() if p.kind == "pos"] + [p for p in params.values() if p.kind == "kwonly"]
        if extra:
            ordered.append(Param("data", "varkw", None, None))
        return Signature(ordered)
