"""Ground truth for a client's uses of a package: each use resolved and bound against the live, installed
release, with Python's own machinery, never with eyas's API model.

Run in the environment of the release to judge (`python -m eyas.audit.groundtruth SITES OUT`): every
site eyas's usage reader found (an import, an attribute, a call with its shape, a member of an instance
of a package class, an override, a function bound onto a package object) gets a verdict:

- `ok`: it resolves and, for a call, `inspect.Signature.bind` accepts its shape (`bind_partial` when the
  call spreads `*args`/`**kwargs`: what it could supply is not known);
- `fails`: Python would raise: the module or name is not there (`ModuleNotFoundError` naming it, an
  `AttributeError`), the class and its bases hold no such member and no source line of them assigns
  `self.<name>`, or the call does not bind;
- `unknown`: it cannot be decided without running the client: importing it needs a dependency that is
  not installed, the class has a `__getattr__` or sets attributes dynamically, the callable has no
  signature, the receiver's class is not known.

A call binds to what Python calls first: a function's own signature; for a class, a metaclass `__call__`
or a declared `__signature__`, else the first `__new__` and the first `__init__` along the MRO (both must
accept it; neither defined: no arguments). A `(*args, **kwargs)` wrapper refuses nothing itself, so a
call it takes is `ok` when what it hands on to accepts it, else `unknown`. A result
and a call on an untyped receiver are not judged (`unknown`): their truth needs the program run.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import json
import re
import subprocess
import sys
import types
import typing
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from eyas.audit.signature import CallShape
from eyas.audit.usage import Usage

Verdict = Literal["ok", "fails", "unknown"]
_PERMISSIVE_NEW = {dict.__new__, list.__new__, set.__new__, bytearray.__new__}  # C: take any arguments
_INSTANCE_ATTRIBUTE = object()  # a member assigned as `self.<name>` in the source of the class or a base
_DYNAMIC = re.compile(r"\bsetattr\(\s*self\s*,|\bself\.__dict__\.update\(")  # attributes named at run time


class Missing(Exception):
    """Python would raise: the name is not there (`gone`: the qualified name that is missing)."""

    def __init__(self, gone: str, message: str | None = None) -> None:
        super().__init__(message or f"{gone} does not exist")
        self.gone = gone


class Undecided(Exception):
    """The verdict needs more than the installed release: a missing dependency, dynamic attributes."""


def resolve(qualname: str) -> Any:
    """Return the live object `qualname` names (importing modules as Python would); raise `Missing` when
    a module or attribute is not there and `Undecided` when importing fails for another reason."""
    parts = qualname.split(".")
    try:
        obj: Any = importlib.import_module(parts[0])
    except ModuleNotFoundError as error:
        raise Missing(parts[0], str(error)) from None
    except Exception as error:  # noqa: BLE001 - any import-time failure leaves the name undecided
        raise Undecided(f"importing {parts[0]}: {type(error).__name__}: {error}") from None
    path = parts[0]
    for part in parts[1:]:
        path = f"{path}.{part}"
        try:
            obj = getattr(obj, part)
            continue
        except AttributeError:
            if not isinstance(obj, types.ModuleType):
                raise Missing(path) from None
        except Exception as error:  # noqa: BLE001 - a lazy attribute whose import fails
            raise Undecided(f"{path}: {type(error).__name__}: {error}") from None
        try:
            obj = importlib.import_module(path)
        except ModuleNotFoundError as error:
            if error.name == path:
                raise Missing(path) from None
            raise Undecided(f"importing {path}: {error}") from None
        except Exception as error:  # noqa: BLE001
            raise Undecided(f"importing {path}: {type(error).__name__}: {error}") from None
    return obj


def instance_class(qualname: str) -> type:
    """Return the class of what `qualname` gives an instance of: the class itself, or the class a
    function's return annotation names (one class, `X | None` unwrapped); `Undecided` otherwise."""
    obj = resolve(qualname)
    if isinstance(obj, type):
        return obj
    try:
        returned = typing.get_type_hints(obj).get("return")
    except Exception as error:  # noqa: BLE001 - unresolvable annotations
        raise Undecided(f"return annotation of {qualname}: {error}") from None
    options = [a for a in typing.get_args(returned) if a is not type(None)] if typing.get_args(returned) else [returned]
    if len(options) == 1 and isinstance(options[0], type) and typing.get_origin(returned) in (None, typing.Union, types.UnionType):
        return options[0]
    raise Undecided(f"{qualname} returns {returned!r}, not one class")


def instance_member(klass: type, name: str) -> Any:
    """Return the raw member `name` of instances of `klass`: the class attribute found along the MRO,
    or `_INSTANCE_ATTRIBUTE` when a class of the MRO declares it (annotation, `__slots__`) or its source
    assigns `self.<name>`. Raise `Missing` when none does, `Undecided` when a `__getattr__`, a
    `setattr(self, ...)` or unreadable source could supply it."""
    for owner in klass.__mro__:
        if name in vars(owner):
            return vars(owner)[name]
    assigned = re.compile(rf"\bself\.{re.escape(name)}\s*(:[^=\n]+)?=(?!=)")
    dynamic = False
    for owner in klass.__mro__[:-1]:
        if "__getattr__" in vars(owner):
            raise Undecided(f"{owner.__qualname__} defines __getattr__")
        if name in getattr(owner, "__annotations__", {}) or name in getattr(owner, "__slots__", ()):
            return _INSTANCE_ATTRIBUTE
        try:
            source = inspect.getsource(owner)
        except (OSError, TypeError):
            raise Undecided(f"no source for {owner.__qualname__}") from None
        if assigned.search(source):
            return _INSTANCE_ATTRIBUTE
        dynamic = dynamic or bool(_DYNAMIC.search(source))
    if dynamic:
        raise Undecided(f"{klass.__qualname__} sets attributes with setattr")
    raise Missing(f"{klass.__module__}.{klass.__qualname__}.{name}", f"{klass.__qualname__} has no attribute {name}")


def _bind(signature: inspect.Signature, usage: Usage) -> None:
    """Raise `_Unbound` with Python's message when the call shape does not bind."""
    call = usage.call
    assert call is not None
    args, kwargs = [object()] * call.positional, {k: object() for k in call.keywords}
    binder = signature.bind_partial if call.star or call.double_star else signature.bind
    try:
        binder(*args, **kwargs)
    except TypeError as error:
        raise _Unbound(str(error)) from None


class _Unbound(Exception):
    """The call shape does not bind."""


def _signature(obj: Any, drop_first: bool, follow_wrapped: bool = False) -> inspect.Signature:
    try:
        signature = inspect.signature(obj, follow_wrapped=follow_wrapped)
    except (ValueError, TypeError):
        raise Undecided(f"no signature for {obj!r}") from None
    if drop_first:
        parameters = list(signature.parameters.values())
        if not parameters or parameters[0].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                                        inspect.Parameter.POSITIONAL_OR_KEYWORD):
            raise Undecided(f"{obj!r} takes no self")
        signature = signature.replace(parameters=parameters[1:])
    return signature


def _catch_all(signature: inspect.Signature) -> bool:
    return sorted(p.kind for p in signature.parameters.values()) == [inspect.Parameter.VAR_POSITIONAL,
                                                                     inspect.Parameter.VAR_KEYWORD]


def _bind_callable(function: Any, usage: Usage, drop_first: bool, then: list[Any]) -> None:
    """Bind the call to `function`, the first definition Python calls. Its own signature decides a
    refusal. A `(*args, **kwargs)` wrapper refuses nothing itself: the call is `ok` when what it wraps
    (`__wrapped__`), or else the next definition in `then`, accepts it, and `unknown` otherwise (its
    body may filter or forward the arguments)."""
    own = _signature(function, drop_first)
    _bind(own, usage)
    if not _catch_all(own):
        return
    if hasattr(function, "__wrapped__"):
        inner = _signature(function, drop_first, follow_wrapped=True)
    elif then:
        inner = _signature(then[0], drop_first)
    else:
        return
    try:
        _bind(inner, usage)
    except _Unbound as error:
        raise Undecided(f"a (*args, **kwargs) wrapper hands the call to one that refuses it: {error}") from None


def _call(usage: Usage) -> None:
    obj = resolve(usage.target)
    if not isinstance(obj, type):
        _bind_callable(obj, usage, drop_first=False, then=[])
        return
    if getattr(obj, "__signature__", None) is not None or type(obj).__call__ is not type.__call__:
        _bind(_signature(obj, drop_first=False, follow_wrapped=True), usage)  # what the class says it takes
        return
    custom = {}
    for name in ("__new__", "__init__"):
        chain = [vars(owner)[name] for owner in obj.__mro__[:-1] if name in vars(owner)]
        custom[name] = [f.__func__ if isinstance(f, (staticmethod, classmethod)) else f for f in chain]
    if not custom["__new__"] and not custom["__init__"]:
        _bind(inspect.Signature([]), usage)  # object() takes nothing
    if custom["__init__"] and custom["__new__"] and custom["__new__"][0] in _PERMISSIVE_NEW:
        del custom["__new__"]  # dict.__new__ and the like ignore the arguments __init__ takes
    for functions in custom.values():
        if functions:
            if not inspect.isfunction(functions[0]):
                raise Undecided(f"{usage.target} is built by a C {functions[0]!r}")
            _bind_callable(functions[0], usage, drop_first=True, then=functions[1:])


def _member_call(usage: Usage) -> None:
    klass = instance_class(usage.target)
    name = usage.member or ""
    raw = instance_member(klass, name)
    later = [vars(owner)[name] for owner in klass.__mro__ if name in vars(owner)][1:]
    if isinstance(raw, (staticmethod, classmethod)):
        _bind_callable(raw.__func__, usage, drop_first=isinstance(raw, classmethod), then=[])
    elif inspect.isfunction(raw):
        _bind_callable(raw, usage, drop_first=True, then=[f for f in later if inspect.isfunction(f)])
    else:
        raise Undecided(f"{klass.__qualname__}.{name} is not a plain method")


def _judge(usage: Usage) -> None:
    """Raise `Missing`/`_Unbound` when the use fails at run time, `Undecided` when that is unknown."""
    if usage.kind in ("import", "attribute", "string"):
        resolve(usage.target)
    elif usage.kind == "call":
        _call(usage)
    elif usage.kind in ("member", "bind"):
        instance_member(instance_class(usage.target), usage.member or "")
    elif usage.kind == "member_call":
        _member_call(usage)
    elif usage.kind == "override":
        klass = resolve(usage.target)
        if not isinstance(klass, type):
            raise Undecided(f"{usage.target} is not a class")
        if not any(usage.member in vars(owner) for owner in klass.__mro__):
            raise Missing(f"{usage.target}.{usage.member}")
    else:
        raise Undecided(f"a {usage.kind} is judged only by running the client (not in JUDGED_KINDS)")


def verdict(usage: Usage) -> tuple[Verdict, str, str]:
    """Return the live verdict on one use, its reason (the error Python gives, or why it is unknown) and,
    when a name is missing, that name (the same missing name breaks every use of it in a file once)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _judge(usage)
    except Missing as error:
        return "fails", str(error), error.gone
    except _Unbound as error:
        return "fails", str(error), ""
    except Undecided as error:
        return "unknown", str(error), ""
    except Exception as error:  # noqa: BLE001 - anything else the live package raises leaves it undecided
        return "unknown", f"{type(error).__name__}: {error}", ""
    return "ok", "", ""


JUDGED_KINDS = ("import", "attribute", "string", "call", "member", "bind", "member_call", "override")


def judged(usages: list[Usage]) -> list[Usage]:
    """Return the uses Python's machinery can judge without running the client (results, calls on untyped
    receivers and subclasses cannot)."""
    return [u for u in usages if u.kind in JUDGED_KINDS]


def site_key(usage: Usage) -> str:
    """Return the key that names one use across runs: kind, target, member and call shape."""
    call = usage.call
    shape = f"({call.positional},{','.join(call.keywords)},{int(call.star)}{int(call.double_star)})" if call else ""
    return f"{usage.kind}:{usage.target}:{usage.member or ''}{shape}"


def usage_record(usage: Usage) -> dict[str, Any]:
    """Return the JSON form of a use that `main` reads back."""
    call = usage.call
    return {"kind": usage.kind, "target": usage.target, "member": usage.member,
            "call": [call.positional, list(call.keywords), call.star, call.double_star] if call else None}


def _from_record(record: dict[str, Any]) -> Usage:
    call = record["call"]
    return Usage(record["kind"], "", 0, 0, record["target"], record["member"],
                 CallShape(call[0], tuple(call[1]), call[2], call[3]) if call else None)


def main(argv: list[str]) -> int:
    """`python -m eyas.audit.groundtruth SITES OUT PACKAGE`: judge each use in the JSON list SITES (records of
    `usage_record`) against the installed PACKAGE and write {"version", "verdicts": [[verdict, reason]...]} to OUT."""
    sites, out, package = Path(argv[0]), Path(argv[1]), argv[2]
    records = json.loads(sites.read_text())
    verdicts = [verdict(_from_record(record)) for record in records]
    out.write_text(json.dumps({"package": package, "version": importlib.metadata.version(package),
                               "verdicts": verdicts}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


Truth = dict[str, tuple[Verdict, str, str]]  # site_key -> (verdict, reason, missing name)


def judge_in(python: str, usages: list[Usage], package: str, workdir: Path) -> tuple[str, Truth]:
    """Return the installed version of `package` in the environment of interpreter `python` and the
    verdict on each distinct use (by `site_key`), judged there in a subprocess; refuses (raises
    `RuntimeError` with its stderr) when that interpreter cannot run the judge."""
    distinct: dict[str, Usage] = {}
    for usage in judged(usages):
        distinct.setdefault(site_key(usage), usage)
    sites, out = workdir / "sites.json", workdir / "verdicts.json"
    sites.write_text(json.dumps([usage_record(u) for u in distinct.values()]))
    done = subprocess.run([python, "-m", "eyas.audit.groundtruth", str(sites), str(out), package],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{python} -m eyas.audit.groundtruth failed: {done.stderr.strip()[-400:]}")
    result = json.loads(out.read_text())
    return result["version"], {key: tuple(v) for key, v in zip(distinct, result["verdicts"])}  # type: ignore[misc]


Line = tuple[str, int]  # (client file, 1-based line)


@dataclass
class Score:
    """A tool's error lines on one client against the live truth of a release pair.

    A break is a use that is ok in the baseline and fails in the target. The uses of one missing name in
    one file are one break (an import that fails and the later uses of what it imported), found when the
    tool flags any of their lines; a call that no longer binds is a break of its own."""

    breaks: dict[tuple[str, str], set[Line]]  # (file, missing name or the call's line) -> its lines
    found: set[tuple[str, str]]
    wrong: set[Line]  # error lines with no break, every use there decided
    unconfirmed: set[Line]  # error lines with no break, where a use is undecided or no use was judged

    def summary(self) -> dict[str, Any]:
        return {"breaks": len(self.breaks), "found": len(self.found),
                "recall": round(len(self.found) / len(self.breaks), 4) if self.breaks else None,
                "wrong_errors": len(self.wrong), "unconfirmed_errors": len(self.unconfirmed)}


def score(error_lines: set[Line], usages: list[Usage], baseline: Truth, target: Truth) -> Score:
    """Return how the error lines of a tool compare with the live truth of each use on them."""
    breaks: dict[tuple[str, str], set[Line]] = {}
    undecided: set[Line] = set()
    judged_lines: set[Line] = set()
    for usage in judged(usages):
        key, line = site_key(usage), (usage.path, usage.line)
        (before, _, _), (now, _, gone) = baseline[key], target[key]
        judged_lines.add(line)
        if before == "ok" and now == "fails":
            breaks.setdefault((usage.path, gone or f"line {usage.line}"), set()).add(line)
        elif "unknown" in (before, now):
            undecided.add(line)
    break_lines = set().union(*breaks.values()) if breaks else set()
    found = {key for key, lines in breaks.items() if lines & error_lines}
    without_break = error_lines - break_lines
    unconfirmed = {line for line in without_break if line in undecided or line not in judged_lines}
    return Score(breaks, found, without_break - unconfirmed, unconfirmed)
