"""The runtime oracle of the API model: eyas's modelled signatures against `inspect.signature` of the
live objects of an installed package.

For every public function, class constructor and method reachable from a package's public modules,
the live signature (what Python builds at run time: metaclass `__call__`, `__new__`, `__init__`,
dataclass synthesis, decorators that keep `__wrapped__`) is compared with what eyas models from the
source. Each callable comes out as

- `matched`: the same parameter names, kinds and defaulted-ness, in order;
- `unknown`: eyas does not claim a signature (open class machinery, a value it does not type), so it
  never reports anything on a call of it;
- `mismatched`: eyas claims a signature that differs. A mismatch is *error-capable* when a call that
  binds at run time would not bind to eyas's signature (or eyas says the callable does not exist):
  only such a mismatch can give a wrong error. The calls tried are the live signature's own
  extremes, required arguments only, everything by position, everything by keyword, and one extra
  positional / keyword where it takes `*args` / `**kwargs`, bound through the checker's own
  `bind_problems`.

Callables without a live signature (C functions, builtins) are counted apart, as `no_signature`.
"""

from __future__ import annotations

import ast
import dis
import importlib
import inspect
import pkgutil
import textwrap
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from eyas.audit.apimodel import ApiModel, Function, Klass
from eyas.audit.signature import PARAMETER_KINDS, CallShape, Param, Signature, bind_problems
from eyas.audit.wrappers import KeywordUse, keyword_use

Verdict = Literal["matched", "mismatched", "unknown", "no_signature"]


@dataclass(frozen=True)
class Comparison:
    qualname: str  # as a client reaches it: `transformers.LlamaConfig`, `transformers.LlamaConfig.to_dict`
    verdict: Verdict
    error_capable: bool = False
    modelled: str | None = None
    live: str | None = None


@dataclass
class Fidelity:
    package: str
    version: str
    comparisons: list[Comparison] = field(default_factory=list)
    import_failures: list[str] = field(default_factory=list)  # public modules that did not import here
    rebound: list[str] = field(default_factory=list)  # names bound at run time to another definition than in source

    def count(self, verdict: Verdict) -> int:
        return sum(c.verdict == verdict for c in self.comparisons)

    @property
    def compared(self) -> int:
        return len(self.comparisons) - self.count("no_signature")

    @property
    def matched_share(self) -> float:
        """Return matched / (matched + mismatched + unknown), 1.0 when nothing was compared."""
        return self.count("matched") / self.compared if self.compared else 1.0

    @property
    def error_capable(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.error_capable]

    def summary(self) -> dict[str, Any]:
        return {"package": self.package, "version": self.version, "compared": self.compared,
                "matched": self.count("matched"), "mismatched": self.count("mismatched"),
                "unknown": self.count("unknown"), "no_signature": self.count("no_signature"),
                "matched_share": round(self.matched_share, 5), "error_capable": len(self.error_capable),
                "modules_not_importable": len(self.import_failures), "rebound_here": len(self.rebound)}


def live_signature(obj: Any) -> Signature | None:
    """Return `inspect.signature(obj)` as eyas's `Signature` (annotations dropped), None when Python has none.

    The callable's own parameters decide; `__wrapped__` is followed only from a `(*args, **kwargs)` or
    `(self, *args, **kwargs)` wrapper (a `functools.wraps` decorator hands the call on: huggingface_hub's
    `@strict` wraps every transformers config's `__init__` so). What the wrappers on that chain do with
    their keywords (`eyas.audit.wrappers`, read from each wrapper's own source) is what a call binds at run
    time, which `inspect` does not show: one that only reads them takes any keyword (huggingface_hub's
    `accept_kwargs` `__init__`, transformers' `filter_out_non_signature_kwargs`), so the signature gets
    `**kwargs`; one that takes a keyword out (`kwargs.pop(old)`, with the name its closure holds) binds it
    too. A function copied with `update_wrapper` from a bound method (transformers' auto classes) has its
    own full parameters, where `inspect` would follow `__wrapped__` to the bound method and drop one."""
    try:
        own = inspect.signature(obj, follow_wrapped=False)
        uses: list[tuple[KeywordUse, types.FunctionType]] = []
        if _star_wrapper(own, bound=inspect.ismethod(obj)) and hasattr(obj, "__wrapped__"):
            uses = _keyword_uses(obj)
            own = inspect.signature(obj)
        parameters = list(own.parameters.values())
    except (ValueError, TypeError):
        return None
    signature = Signature([Param(p.name, PARAMETER_KINDS[p.kind], None if p.default is inspect.Parameter.empty else "...")
                           for p in parameters])
    for use, wrapper in reversed(uses):  # the innermost wrapper first, as the call reaches the wrapped function
        if use.only_reads and not signature.accepts_any_keyword:
            signature = Signature([*signature.params, Param("kwargs", "varkw", None)])
        taken: list[tuple[str | None, str | None]] = []
        for old, new in use.takes:
            name = _held_string(wrapper, old) if old is not None else None
            if old is None or name is not None:
                taken.append((name, _held_string(wrapper, new) if new is not None else None))
        signature = signature.with_taken_keywords(taken)
    return signature


def _star_wrapper(signature: inspect.Signature, bound: bool = False) -> bool:
    """Return True for `(*args, **kwargs)`, or `(self, *args, **kwargs)` unless the signature is a bound
    method's (its `self` already dropped: `(name, *args, **kwargs)` is then the method's own)."""
    kinds = [p.kind for p in signature.parameters.values()]
    rest = kinds[1:] if kinds[:1] == [inspect.Parameter.POSITIONAL_OR_KEYWORD] and not bound else kinds
    return sorted(rest) == [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]


def _keyword_uses(obj: Any) -> list[tuple[KeywordUse, types.FunctionType]]:
    """Return how each `(*args, **kwargs)` wrapper on the `__wrapped__` chain of `obj` uses its keywords,
    outermost first, read from the wrapper's own source; the chain ends at a wrapper without source."""
    found = []
    current = getattr(obj, "__func__", obj)
    while hasattr(current, "__wrapped__") and inspect.isfunction(current) \
            and _star_wrapper(inspect.signature(current, follow_wrapped=False)):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(current.__code__)))  # the code's, not `__wrapped__`'s
        except (OSError, TypeError, SyntaxError):
            break
        node = next(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
        found.append((keyword_use(node), current))
        current = getattr(current.__wrapped__, "__func__", current.__wrapped__)
    return found


def _held_string(wrapper: types.FunctionType, text: str) -> str | None:
    """Return the string a wrapper's expression (a literal, or a name its closure or module holds) denotes."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        cells = dict(zip(wrapper.__code__.co_freevars, wrapper.__closure__ or ()))
        value = cells[text].cell_contents if text in cells and _filled(cells[text]) else wrapper.__globals__.get(text)
    return value if isinstance(value, str) else None


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a cell not yet bound
        return False
    return True


def live_constructor(klass: type) -> list[Signature] | None:
    """Return the signatures a call of `klass` must bind at run time, None when Python has none (a
    protocol, a C constructor).

    A `__signature__` the class declares (pydantic models) or a metaclass `__call__` decides alone, as
    `inspect.signature` says. Otherwise Python calls `__new__` and then `__init__` with the same
    arguments, so a call must bind both: each is the first in the MRO below `object` that is not a
    `(*args, **kwargs)` forwarder (one whose code calls on with them: a `typing_extensions.deprecated`
    `__new__`, a protocol's `_no_init_or_replace_init`), and a class with neither takes no arguments."""
    if getattr(klass, "_is_protocol", False):
        return None  # Python refuses to instantiate a protocol, whatever the arguments
    if getattr(klass, "__signature__", None) is not None or type(klass).__call__ is not type.__call__:
        whole = live_signature(klass)
        if whole is not None and _pydantic_takes_extra(klass) and not whole.accepts_any_keyword:
            whole = Signature([*whole.params, Param("data", "varkw", None)])
        return [whole] if whole is not None else None
    found = []
    for name in ("__new__", "__init__"):
        for owner in klass.__mro__[:-1]:
            raw = vars(owner).get(name)
            if raw is None:
                continue
            function = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
            signature = live_signature(function) if inspect.isfunction(function) else None
            if signature is None:
                return None  # a C `__new__`/`__init__` (a builtin base, an extension type) states nothing
            bound = signature.without_first()
            if not (bound.passes_through_all and _calls_with_star_arguments(function)):
                found.append(bound)
                break
    return found or [Signature([])]


def _pydantic_takes_extra(klass: type) -> bool:
    """Return True for a pydantic model (v1 or v2) whose config does not forbid extra fields: a call binds any
    keyword (ignored or kept), which the `__signature__` pydantic writes does not show."""
    config = getattr(klass, "model_config", None)
    if isinstance(config, dict) and hasattr(klass, "__pydantic_fields__"):
        return config.get("extra") != "forbid"
    config = getattr(klass, "__config__", None)
    if config is not None and hasattr(klass, "__fields__"):
        return str(getattr(getattr(config, "extra", None), "value", "ignore")) != "forbid"
    return False


def _calls_with_star_arguments(function: types.FunctionType) -> bool:
    """Return True when the compiled body makes a `f(*args, **kwargs)` call (it forwards what it got)."""
    return any(i.opname == "CALL_FUNCTION_EX" for i in dis.get_instructions(function))


def _shape(signature: Signature) -> tuple[tuple[str, str, bool], ...]:
    """Return what binding sees of a signature: names, kinds, defaulted-ness (a `*args`/`**kwargs` name
    never binds, so it is not part of it)."""
    return tuple(("" if p.kind in ("varpos", "varkw") else p.name, p.kind, p.default is not None) for p in signature.params)


def binding_calls(live: Signature) -> list[CallShape]:
    """Return calls that bind to `live` at its extremes: required only, all by position, all by keyword,
    and one extra positional / keyword where `*args` / `**kwargs` takes it."""
    positional = [p for p in live.params if p.kind in ("posonly", "pos")]
    required_kwonly = tuple(p.name for p in live.params if p.kind == "kwonly" and p.required)
    required_positional = sum(p.required for p in positional)
    calls = [CallShape(required_positional, required_kwonly),
             CallShape(len(positional), required_kwonly),
             CallShape(sum(p.kind == "posonly" for p in positional),
                       tuple(p.name for p in live.params if p.kind in ("pos", "kwonly")))]
    if live.accepts_any_positional:
        calls.append(CallShape(len(positional) + 1, required_kwonly))
    if live.accepts_any_keyword:
        calls.append(CallShape(required_positional, (*required_kwonly, "oracle_extra_keyword")))
    return calls


def compare(qualname: str, modelled: Signature | None, live: list[Signature] | None, missing: bool = False) -> Comparison:
    """Return the verdict on one callable whose calls must bind every signature in `live`; `missing`
    when eyas says it does not exist (always error-capable)."""
    if not live:
        return Comparison(qualname, "no_signature")
    live_text = " and ".join(s.text() for s in live)
    if missing:
        return Comparison(qualname, "mismatched", True, "<does not exist>", live_text)
    if modelled is None:
        return Comparison(qualname, "unknown", live=live_text)
    if any(_shape(modelled) == _shape(s) for s in live):
        return Comparison(qualname, "matched", modelled=modelled.text(), live=live_text)
    calls = [c for s in live for c in binding_calls(s) if not any(bind_problems(other, c) for other in live)]
    wrong = any(bind_problems(modelled, call) for call in calls)
    return Comparison(qualname, "mismatched", wrong, modelled.text(), live_text)


def public_modules(package: str, depth: int = 1) -> list[str]:
    """Return `package` and its public submodules down to `depth` levels below it (names without a
    leading `_`, no tests), as the package's `__path__` lists them; imports only `package`."""
    top = importlib.import_module(package)
    names, frontier = [package], [(package, list(getattr(top, "__path__", [])))]
    for _ in range(depth):
        below = []
        for name, path in frontier:
            for info in pkgutil.iter_modules(path):
                if info.name.startswith("_") or "test" in info.name:
                    continue
                names.append(f"{name}.{info.name}")
                if info.ispkg:
                    below.append((f"{name}.{info.name}", [str(Path(p) / info.name) for p in path]))
        frontier = below
    return names


def _public_names(module: types.ModuleType) -> list[str]:
    exported = getattr(module, "__all__", None)
    if isinstance(exported, (list, tuple)):
        return [str(n) for n in exported]
    return [n for n in vars(module) if not n.startswith("_")]


def _belongs(obj: Any, package: str) -> bool:
    return (getattr(obj, "__module__", None) or "").split(".")[0] == package


def _modelled_callable(model: ApiModel, member: object, klass_member: bool) -> tuple[Signature | None, bool]:
    """Return eyas's signature of a function or method member as a client calls it, and whether eyas
    models it as missing. A class gives its constructor."""
    if member is None:
        return None, True
    if isinstance(member, Klass):
        return model.constructor(member), False
    if isinstance(member, Function):
        if member.is_property:
            return None, False
        called = model.call_signature(member)
        return (called.without_first() if klass_member and not member.is_static else called), False
    return None, False


def _live_method(klass: type, name: str) -> Any:
    """Return the method as a client calls it on an instance (bound: no self), or None for a non-method.
    A `(*args, **kwargs)` override that hands them to `super()` binds as the next definition does."""
    raw = inspect.getattr_static(klass, name)
    function = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    if inspect.isfunction(function) and "__class__" in function.__code__.co_freevars \
            and _calls_with_star_arguments(function) and (own := live_signature(function)) is not None \
            and own.without_first().passes_through_all:
        below = next((k for k in klass.__mro__[1:] if name in vars(k)), None)
        if below is not None:
            return _live_method(below, name)
    if isinstance(raw, staticmethod):
        return raw.__func__
    if isinstance(raw, classmethod):
        return getattr(klass, name)
    if inspect.isfunction(raw):
        return types.MethodType(raw, object())  # inspect drops the first parameter of a bound method
    return None


def package_fidelity(package: str, depth: int = 1, roots: list[Path] | None = None) -> Fidelity:
    """Return how eyas's API model of installed `package` compares with its live objects; imports the
    package's public modules (a module that fails to import here is listed, not compared)."""
    top = importlib.import_module(package)
    version = str(getattr(top, "__version__", "?"))
    fidelity = Fidelity(package, version)
    model = ApiModel(roots or [Path(top.__file__).parent.parent])  # type: ignore[arg-type]
    seen: set[int] = set()
    for module_name in public_modules(package, depth):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                module = importlib.import_module(module_name)
            except Exception as error:  # optional dependencies missing here: listed, not compared
                fidelity.import_failures.append(f"{module_name}: {type(error).__name__}")
                continue
            for name in _public_names(module):
                try:
                    obj = getattr(module, name)
                except Exception:
                    continue
                if not _belongs(obj, package) or id(obj) in seen or not (inspect.isclass(obj) or inspect.isfunction(obj)) \
                        or _made_at_run_time(obj):
                    continue
                seen.add(id(obj))
                _compare_object(fidelity, model, f"{module_name}.{name}", obj)
    return fidelity


def _made_at_run_time(obj: Any) -> bool:
    """Return True for an object a function made, or a class built on one: a lazy module's placeholder for
    a missing backend (transformers' `T5Tokenizer` without sentencepiece) and its subclasses stand for
    this environment, not for the source."""
    return any("<locals>" in k.__qualname__ for k in (obj.__mro__ if inspect.isclass(obj) else [obj]))


def _compare_object(fidelity: Fidelity, model: ApiModel, qualname: str, obj: Any) -> None:
    found = model.lookup(qualname)
    defined = f"{obj.__module__}.{obj.__qualname__}"
    if isinstance(found, (Klass, Function)) and found.qualname != defined:
        # the name is bound to another definition in this environment (transformers serves a Pil image
        # processor where torchvision is missing): compare the object Python gave with its own definition
        fidelity.rebound.append(f"{qualname} -> {defined}")
        found = model.lookup(defined)
    modelled, missing = _modelled_callable(model, found, klass_member=False)
    missing = missing and not (model.lazily_named(qualname) or model.hidden_by_lazy_module(qualname))  # as the checker
    live = live_constructor(obj) if inspect.isclass(obj) else _one(live_signature(obj))
    fidelity.comparisons.append(compare(qualname, modelled, live, missing))
    if not inspect.isclass(obj) or not isinstance(found, Klass):
        return
    open_class = model.is_open(found)
    for name in sorted(vars(obj)):
        if name.startswith("_"):
            continue
        live = _live_method(obj, name)
        if live is None:
            continue
        member = model.concrete_member(found, name) or model.member_of(found, name)  # as the checker looks
        signature, missing = _modelled_callable(model, member, klass_member=True)
        fidelity.comparisons.append(compare(f"{qualname}.{name}", signature, _one(live_signature(live)),
                                            missing and not open_class))


def _one(signature: Signature | None) -> list[Signature] | None:
    return [signature] if signature is not None else None
