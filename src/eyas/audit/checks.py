"""Findings: what in the client breaks against the target version, and (with a baseline) what
changed under it. Nothing is reported that cannot be decided from source: members of classes
with bases outside the model or a `__getattr__`, and names behind a lazy module `__getattr__`
that the baseline did not have either, are unknown, not errors.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import asdict, dataclass
from itertools import islice

from eyas.audit.apimodel import ApiModel, Attribute, Function, Klass, Module
from eyas.audit.signature import CallShape, Signature, bind_problems
from eyas.audit.usage import Usage

ERROR, WARNING = "error", "warning"
_DUTY = re.compile(r"[^.\n]*\b(must (be )?call(ed)?|callers? must|has to be called|needs to be called|"
                   r"(call|use) (it|this) (after|before)|(after|before) calling)\b[^.\n]*", re.IGNORECASE)
_USE_WORDS = {"index": "indexed", "iterate": "iterated", "test": "tested", "unpack": "unpacked"}
_CONFIG_NAME = re.compile(r"(Config|Arguments|Args|Options|Params)$")
_MENTIONED_CALL = re.compile(r"`?\.?(\w+)\(\)`?|`(\w+)`")
# Methods of the builtin containers: a call of one on an untyped receiver says nothing of a package class.
_BUILTIN_METHODS = frozenset(n for t in (list, dict, str, set, bytes, tuple, int, float) for n in dir(t))


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    col: int
    symbol: str
    kind: str
    severity: str
    message: str
    baseline_signature: str | None = None
    target_signature: str | None = None
    fix: str | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _text(member: object, name: str) -> str | None:
    if isinstance(member, Function):
        return f"{name}{member.signature.text()}" + (f" -> {member.returns}" if member.returns else "")
    if isinstance(member, Klass):
        return f"class {name}"
    if isinstance(member, Attribute):
        return f"{name} = {member.default}" if member.default is not None else name
    return None


def _within(qualname: str, prefix: str) -> bool:
    """True when `qualname` is `prefix` or a member of it (not merely a longer name starting the same)."""
    return qualname == prefix or qualname.startswith(prefix + ".")


def likely_replacement(name: str, candidates: list[str]) -> str | None:
    """Return the candidate most likely to have replaced `name`: a close spelling, or one containing it."""
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.61)
    if close:
        return close[0]
    containing = sorted((c for c in candidates if name.strip("_") and name.strip("_") in c), key=len)
    return containing[0] if containing else None


def _bound_signature(model: ApiModel, function: Function, drop_self: bool) -> Signature:
    """Return the signature a call of `function` binds in `model`, without its first parameter when
    `drop_self` (a method called on an instance or class)."""
    called = model.call_signature(function)
    return called.without_first() if drop_self else called


def _shape_of(signature: Signature) -> CallShape:
    """Return the call shape with which a framework calls a method of this signature (all parameters passed)."""
    positional = sum(p.kind in ("posonly", "pos") for p in signature.params)
    keywords = tuple(p.name for p in signature.params if p.kind == "kwonly")
    return CallShape(positional, keywords)


class Checker:
    def __init__(self, target: ApiModel, baseline: ApiModel | None, called: frozenset[str] = frozenset()) -> None:
        self.target, self.baseline = target, baseline
        self.called = called  # every method or function name the client calls anywhere
        self.findings: list[Finding] = []
        self._failed: set[tuple[str, int, str]] = set()
        self._failed_imports: set[tuple[str, str]] = set()

    def add(self, usage: Usage, symbol: str, kind: str, severity: str, message: str, baseline: str | None = None,
            target: str | None = None, fix: str | None = None) -> None:
        self.findings.append(Finding(usage.path, usage.line, usage.col, symbol, kind, severity, message, baseline, target, fix))

    def _first_missing(self, qualname: str) -> str:
        """Return the shortest prefix of `qualname` that the target lacks (`a.b` when `a.b.c` is missing
        because `a.b` is): the chain is reported once, by the name that is gone."""
        parts = qualname.split(".")
        for cut in range(2, len(parts)):
            if self.target.lookup(".".join(parts[:cut])) is None:
                return ".".join(parts[:cut])
        return qualname

    def _missing(self, usage: Usage, qualname: str, kind: str) -> None:
        """Report `qualname` missing in the target, once per line for a chain (`a.b` missing hides `a.b.c`)."""
        qualname = self._first_missing(qualname) if kind != "unresolved-import" else qualname
        if any(_within(qualname, done) for (path, line, done) in self._failed if (path, line) == (usage.path, usage.line)):
            return
        in_baseline = self.baseline.lookup(qualname) if self.baseline else None
        if self.target.lazily_named(qualname) or self.target.hidden_by_lazy_module(qualname) and in_baseline is None:
            return
        self._failed.add((usage.path, usage.line, qualname))
        leaf = qualname.rsplit(".", 1)[-1]
        parent = self.target.lookup(qualname.rsplit(".", 1)[0])
        fix = None
        if isinstance(parent, Module):
            close = likely_replacement(leaf, list(parent.members))
            fix = f"did you mean {parent.name}.{close}?" if close else None
        if fix is None and (moved := self.target.find_parsed(leaf, qualname.split(".")[0])) is not None:
            fix = f"now at {moved}?"
        what = "cannot be imported" if kind == "unresolved-import" else "does not exist"
        severity, before = self._severity(in_baseline is not None or self.baseline is None)
        self.add(usage, qualname, kind, severity, f"{qualname} {what} in the target version{before}",
                 _text(in_baseline, leaf), None, fix)

    def check(self, usage: Usage) -> None:
        """Check one usage; code under a version check or a try/except ImportError is compatibility
        code written for other versions, and is not checked."""
        if usage.guarded:
            return
        if usage.kind in ("attribute", "call", "member", "member_call") and any(
                usage.path == path and _within(usage.target, failed) for path, failed in self._failed_imports):
            return  # the failed import is the finding
        handler = getattr(self, f"_{usage.kind}")
        handler(usage)

    def _import(self, usage: Usage) -> None:
        if self.target.lookup(usage.target) is None:
            self._missing(usage, usage.target, "unresolved-import")
            self._failed_imports.add((usage.path, usage.target))

    def _attribute(self, usage: Usage) -> None:
        if self.target.lookup(usage.target) is None:
            self._missing(usage, usage.target, "missing-attribute")

    _string = _attribute

    def _binding(self, usage: Usage, member: object, name: str, skip_self: bool) -> None:
        if not isinstance(member, Function) or member.is_property:
            return
        drop_self = skip_self and not member.is_static
        target_signature = _bound_signature(self.target, member, drop_self)
        if usage.call is None:
            return
        problems = bind_problems(target_signature, usage.call)  # type: ignore[arg-type]
        if not problems:
            self._defaults_changed(usage, member, name, skip_self)
            return
        baseline = self._baseline_member(usage, name)
        before_signature = _bound_signature(self.baseline, baseline, drop_self) \
            if self.baseline is not None and isinstance(baseline, Function) and not baseline.is_property else None
        severity, before = self._severity(self._bound_before(usage, before_signature))
        self.add(usage, name, "call-mismatch", severity, f"call of {name} does not bind: " + "; ".join(problems) + before,
                 _text(baseline, name.rsplit('.', 1)[-1]), _text(member, name.rsplit('.', 1)[-1]))

    @staticmethod
    def _severity(worked_before: bool) -> tuple[str, str]:
        """Return the severity and message suffix of a failing use: an error when it worked in the baseline
        (or there is none), else a warning: what never worked there is no break of this upgrade, and most
        often the receiver is not what its annotation says (`config: PretrainedConfig` holding a subclass)."""
        return (ERROR, "") if worked_before else (WARNING, " (nor in the baseline: the object may not be what "
                                                            "its type says; check it runs at all)")

    def _had_member(self, usage: Usage) -> bool:
        """True without a baseline, or when the baseline's class of the receiver has the member (or is open)."""
        if self.baseline is None:
            return True
        klass = self.baseline.instance_class(usage.target)
        return klass is not None and (self.baseline.is_open(klass) or self.baseline.member_of(klass, usage.member) is not None)  # type: ignore[arg-type]

    def _bound_before(self, usage: Usage, before: Signature | None) -> bool:
        """True without a baseline, or when the call bound to the baseline's signature: a call that never
        bound (or to a callable the baseline lacks or cannot state) is not a break of this upgrade."""
        if self.baseline is None:
            return True
        return before is not None and not bind_problems(before, usage.call)  # type: ignore[arg-type]

    def _baseline_member(self, usage: Usage, name: str) -> object:
        if self.baseline is None:
            return None
        if usage.member is not None:
            klass = self.baseline.instance_class(usage.target)
            return self.baseline.concrete_member(klass, usage.member) if klass else None
        return self.baseline.lookup(name)

    def _call(self, usage: Usage) -> None:
        found = self.target.lookup(usage.target)
        if found is None:
            self._missing(usage, usage.target, "missing-attribute")
        elif isinstance(found, Klass):
            constructor = self.target.constructor(found)
            if constructor is not None:
                problems = bind_problems(constructor, usage.call)  # type: ignore[arg-type]
                baseline_class = self.baseline.resolve_class(usage.target) if self.baseline else None
                baseline_init = self.baseline.constructor(baseline_class) if self.baseline and baseline_class else None
                if problems:
                    severity, before = self._severity(self._bound_before(usage, baseline_init))
                    self.add(usage, usage.target, "call-mismatch", severity,
                             f"{usage.target}(...) does not bind: " + "; ".join(problems) + before,
                             f"{found.name}{baseline_init.text()}" if baseline_init else None,
                             f"{found.name}{constructor.text()}")
                elif baseline_init is not None:
                    self._changed_defaults(usage, baseline_init, constructor, usage.target)
        elif isinstance(found, Function):
            owner = self.target.lookup(usage.target.rsplit(".", 1)[0])
            self._binding(usage, found, usage.target, skip_self=isinstance(owner, Klass) and found.is_classmethod)

    def _owner(self, usage: Usage, klass: Klass) -> str:
        """Return how findings name the class of an instance: as the client reached it when that is the class."""
        return usage.target if self.target.resolve_class(usage.target) is not None else klass.qualname

    def _member_call(self, usage: Usage) -> None:
        klass = self.target.instance_class(usage.target)
        if klass is None:
            return
        member = self.target.concrete_member(klass, usage.member)  # type: ignore[arg-type]
        if member is None:
            self._member(usage)
        else:
            name = f"{self._owner(usage, klass)}.{usage.member}"
            self._binding(usage, member, name, skip_self=True)
            self._must_follow(usage, klass, member, name)

    def _must_follow(self, usage: Usage, klass: Klass, member: object, name: str) -> None:
        """With a baseline: the method now raises a state error naming another method of its class to call
        first, which it did not before, and the client never calls that one."""
        before = self._baseline_member(usage, name)
        if not isinstance(member, Function) or not isinstance(before, Function):
            return
        methods = {n for k in self.target.mro(klass) for n in k.methods}
        for message in set(member.state_errors) - set(before.state_errors):
            for first in {a or b for a, b in _MENTIONED_CALL.findall(message)} & methods - {usage.member} - self.called:
                self.add(usage, name, "protocol-change", WARNING,
                         f"{usage.member}() now raises unless {first}() was called first (\"{message}\"); this client "
                         f"never calls {first}()", _text(before, usage.member), _text(member, usage.member),  # type: ignore[arg-type]
                         f"call {first}() before {usage.member}()")

    def _member(self, usage: Usage) -> None:
        klass = self.target.instance_class(usage.target)
        if klass is None or self.target.is_open(klass):
            return
        if self.target.member_of(klass, usage.member) is None:  # type: ignore[arg-type]
            name = f"{self._owner(usage, klass)}.{usage.member}"
            if (usage.path, usage.line, name) in self._failed:
                return
            self._failed.add((usage.path, usage.line, name))
            members = [n for k in self.target.mro(klass) for n in [*k.methods, *k.attributes]]
            close = likely_replacement(usage.member, members)  # type: ignore[arg-type]
            severity, before = self._severity(self._had_member(usage))
            self.add(usage, name, "missing-attribute", severity, f"{klass.name} has no attribute {usage.member} in the "
                     f"target version{before}", _text(self._baseline_member(usage, name), usage.member),  # type: ignore[arg-type]
                     None, f"did you mean {close}?" if close else None)

    def _bind(self, usage: Usage) -> None:
        """A function assigned onto a package object: the member must exist and accept how it is called."""
        klass = self.target.instance_class(usage.target)
        if klass is None or self.target.is_open(klass):
            return
        upstream = self.target.member_of(klass, usage.member)  # type: ignore[arg-type]
        name = f"{usage.target}.{usage.member}"
        if upstream is None:
            self.add(usage, name, "dead-binding", ERROR, f"binds a function onto {name}, which no longer exists "
                     "upstream: nothing calls it", _text(self._baseline_member(usage, name), usage.member))  # type: ignore[arg-type]
        elif isinstance(upstream, Function) and usage.signature is not None and not upstream.signature.passes_through:
            problems = bind_problems(usage.signature, _shape_of(upstream.signature.without_first()))
            if problems:
                self.add(usage, name, "bind-mismatch", ERROR, f"the function bound onto {name} does not accept how "
                         "it is called: " + "; ".join(problems), None, _text(upstream, usage.member))  # type: ignore[arg-type]

    def _override(self, usage: Usage) -> None:
        klass = self.target.resolve_class(usage.target)
        if klass is None:
            return
        upstream = self.target.member_of(klass, usage.member)  # type: ignore[arg-type]
        name = f"{usage.target}.{usage.member}"
        baseline_class = self.baseline.resolve_class(usage.target) if self.baseline else None
        before = self.baseline.member_of(baseline_class, usage.member) if self.baseline and baseline_class else None  # type: ignore[arg-type]
        if upstream is None:
            if before is not None or usage.use == "marked":
                close = likely_replacement(usage.member, [n for k in self.target.mro(klass) for n in k.methods])  # type: ignore[arg-type]
                self.add(usage, name, "dead-override", ERROR, f"overrides {name}, which no longer exists upstream: "
                         "the framework will not call it", _text(before, usage.member), None,  # type: ignore[arg-type]
                         f"override {close} instead?" if close else None)
            return
        if not isinstance(upstream, Function) or upstream.is_property or usage.signature is None \
                or upstream.signature.passes_through:  # `(*args, **kwargs)` says nothing of how it is called
            return
        shape = _shape_of(upstream.signature.without_first())
        problems = bind_problems(usage.signature, shape)
        if not problems:
            return
        if isinstance(before, Function) and not bind_problems(usage.signature, _shape_of(before.signature.without_first())) \
                or self.baseline is None:
            self.add(usage, name, "override-mismatch", ERROR, f"override of {name} no longer matches how it is called: "
                     + "; ".join(problems), _text(before, usage.member), _text(upstream, usage.member))  # type: ignore[arg-type]

    def _result(self, usage: Usage) -> None:
        if self.baseline is None:
            return
        name = usage.target if usage.member is None else f"{usage.target}.{usage.member}"
        now, before = self._resolve_callable(self.target, usage), self._resolve_callable(self.baseline, usage)
        if not isinstance(now, Function) or not isinstance(before, Function):
            return
        if now.returns == before.returns and now.return_shape != before.return_shape \
                and now.return_shape is not None and before.return_shape is not None:
            self.add(usage, name, "return-changed", WARNING, f"the result of {name} is {_USE_WORDS[usage.use]} here, "  # type: ignore[index]
                     f"and what it returns changed from a {before.return_shape} to a {now.return_shape} (its return "
                     "statements)", _text(before, name.rsplit('.', 1)[-1]), _text(now, name.rsplit('.', 1)[-1]))
        elif now.returns != before.returns:
            self.add(usage, name, "return-changed", WARNING, f"the result of {name} is {_USE_WORDS[usage.use]} "  # type: ignore[index]
                     f"here, and its return type changed from {before.returns} to {now.returns}",
                     _text(before, name.rsplit('.', 1)[-1]), _text(now, name.rsplit('.', 1)[-1]))

    @staticmethod
    def _resolve_callable(model: ApiModel, usage: Usage) -> object:
        if usage.member is None:
            return model.lookup(usage.target)
        klass = model.instance_class(usage.target)
        return model.member_of(klass, usage.member) if klass else None

    def _defaults_changed(self, usage: Usage, member: Function, name: str, skip_self: bool) -> None:
        before = self._baseline_member(usage, name)
        if isinstance(before, Function):
            strip = (lambda s: s.without_first()) if skip_self and not member.is_static else (lambda s: s)
            self._changed_defaults(usage, strip(before.signature), strip(member.signature), name)

    def _changed_defaults(self, usage: Usage, before: Signature, now: Signature, name: str) -> None:
        call = usage.call
        if call is None or call.double_star:
            return
        passed = {p.name for p in [p for p in now.params if p.kind in ("posonly", "pos")][:call.positional]} | set(call.keywords)
        for param, old in now.changed_defaults(before):
            if param.name not in passed:
                self.add(usage, f"{name}({param.name})", "default-changed", WARNING,
                         f"{param.name} is not passed here and its default changed from {old.default} to {param.default}",
                         f"{name.rsplit('.', 1)[-1]}{before.text()}", f"{name.rsplit('.', 1)[-1]}{now.text()}",
                         f"pass {param.name}={old.default} to keep the old behaviour")

    def _subclass(self, usage: Usage) -> None:
        """With a baseline: abstract methods the base gained that the client's subclass does not implement."""
        klass = self.target.resolve_class(usage.target)
        old = self.baseline.resolve_class(usage.target) if self.baseline else None
        if klass is None or old is None or self.baseline is None:
            return
        for name in sorted(self._abstract(self.target, klass) - self._abstract(self.baseline, old) - set(usage.defines)):
            method = self.target.member_of(klass, name)
            self.add(usage, f"{usage.target}.{name}", "protocol-change", WARNING,
                     f"{usage.target} now declares {name}() abstract; {usage.member} does not implement it "
                     "(instantiating it raises TypeError)", None, _text(method, name), f"implement {name}() in {usage.member}")

    @staticmethod
    def _abstract(model: ApiModel, klass: Klass) -> set[str]:
        """Return the methods left abstract along the MRO (the first definition of each name decides)."""
        decided: dict[str, bool] = {}
        for current in model.mro(klass):
            for name, method in current.methods.items():
                decided.setdefault(name, any(d.endswith("abstractmethod") for d in method.decorators))
        return {name for name, abstract in decided.items() if abstract}

    def new_duties(self, usages: list[Usage], classes: set[str]) -> None:
        """With a baseline: methods new in a class the client uses, which the client never calls, whose
        docstring says callers must call them (or call them after/before another: a method split in two)."""
        if self.baseline is None:
            return
        first_use: dict[str, Usage] = {}
        for usage in usages:
            klass = self.target.resolve_class(usage.target) if not usage.guarded and usage.kind != "untyped_call" else None
            if klass is not None and klass.qualname in classes:
                first_use.setdefault(klass.qualname, usage)
        for qualname, usage in sorted(first_use.items()):
            new, old = self.target.resolve_class(qualname), self.baseline.resolve_class(qualname)
            if new is None or old is None:
                continue
            for name, method in new.methods.items():
                if self.baseline.member_of(old, name) is None and name not in self.called and method.docstring \
                        and _DUTY.search(method.docstring):
                    self.add(usage, f"{qualname}.{name}", "protocol-change", WARNING,
                             f"{qualname}.{name}() is new, and its docstring says callers must call it: "
                             f"\"{_DUTY.search(method.docstring).group(0)}\"", None, _text(method, name),  # type: ignore[union-attr]
                             f"call {name}() where {new.name} is used")

    def untyped(self, usages: list[Usage], classes: set[str], packages: set[str], defined: frozenset[str]) -> None:
        """Warn about methods called on receivers of unknown type that are gone from the target: from a
        package class the client uses, or from the one class of the package that defined the name in the
        baseline (a name the client defines itself, or a builtin container's method, proves nothing)."""
        if self.baseline is None:
            return
        gone_from: dict[str, list[tuple[str, str]]] = {}  # member -> (class, likely replacement); one search per name
        for usage in usages:
            member: str = usage.member  # type: ignore[assignment]
            if member in defined or member in _BUILTIN_METHODS or member.startswith("__"):
                continue
            if member not in gone_from:
                gone_from[member] = self._gone_from(member, classes, packages)
            candidates = gone_from[member]
            if candidates:
                names = ", ".join(c for c, _ in candidates)
                replacement = next((r for _, r in candidates if r), None)
                self.add(usage, f"{usage.target}.{member}", "method-removed", WARNING,
                         f"{member}() is called on {usage.target} (type unknown here); {names} had it in the "
                         "baseline and no longer " + ("has" if len(candidates) == 1 else "have") + " it",
                         fix=f"likely replacement: {replacement}" if replacement else None)

    def _gone_from(self, member: str, classes: set[str], packages: set[str]) -> list[tuple[str, str]]:
        """Return (class, likely replacement) for the client's package classes that lost `member`, else for the
        one baseline class of `packages` that defined it (empty when none did, or two or more)."""
        candidates = [(q, r) for q in sorted(classes) if (r := self._gone(q, member)) is not None]
        if candidates:
            return candidates
        owners = list(islice((q for package in sorted(packages)  # a second owner is enough to say "not unique"
                              for q in self.baseline.classes_defining(member, package)), 2))  # type: ignore[union-attr]
        if len(owners) == 1 and (replacement := self._gone(owners[0], member)) is not None:
            return [(owners[0], replacement)]
        return []

    def _gone(self, qualname: str, member: str) -> str | None:
        """Return the likely replacement ("" when none) when class `qualname` had `member` in the baseline and
        the target's class (still there, closed) has not; None otherwise."""
        old, new = self.baseline.resolve_class(qualname), self.target.resolve_class(qualname)  # type: ignore[union-attr]
        if old is None or new is None or self.target.is_open(new):
            return None
        if self.baseline.member_of(old, member) is None or self.target.member_of(new, member) is not None:  # type: ignore[union-attr]
            return None
        return likely_replacement(member, [n for k in self.target.mro(new) for n in k.methods]) or ""

    def unset_config_defaults(self, usages: list[Usage]) -> None:
        """With a baseline: fields of the package's configuration classes the client names but never
        constructs (it loads them: `from_pretrained`, a YAML) whose default changed: a field the loaded
        file leaves out takes the new value. One warning per field, at the first use of the class; a
        construction's unset fields are warned at the call (`default-changed` there)."""
        if self.baseline is None:
            return
        first_use: dict[str, Usage] = {}
        constructed: set[str] = set()
        for usage in usages:
            if usage.kind in ("call", "import", "attribute") and not usage.guarded and _CONFIG_NAME.search(usage.target):
                first_use.setdefault(usage.target, usage)
                if usage.kind == "call":
                    constructed.add(usage.target)
        for qualname, usage in sorted(first_use.items()):
            new, old = self.target.resolve_class(qualname), self.baseline.resolve_class(qualname)
            if new is None or old is None or qualname in constructed:
                continue
            now, before = self.target.constructor(new), self.baseline.constructor(old)
            if now is None or before is None:
                continue
            for param, old_param in now.changed_defaults(before):
                self.add(usage, f"{qualname}.{param.name}", "default-changed", WARNING,
                         f"{new.name}.{param.name} is never set by this client and its default changed from "
                         f"{old_param.default} to {param.default}", f"{param.name}={old_param.default}",
                         f"{param.name}={param.default}", f"set {param.name}={old_param.default} where the config is loaded")


def package_classes(usages: list[Usage], model: ApiModel) -> set[str]:
    """Return the package classes the client names (called, subclassed, typed), with their bases."""
    names: set[str] = set()
    for usage in usages:
        if usage.kind in ("member", "member_call", "override", "bind") or usage.kind in ("call", "import", "attribute"):
            klass = model.resolve_class(usage.target)
            if klass is not None:
                names |= {k.qualname for k in model.mro(klass)}
    return names
