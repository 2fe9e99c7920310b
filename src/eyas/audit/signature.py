"""Signatures read from source, and whether a call shape binds to one.

A call shape is what the client's call site fixes: how many positional arguments, which
keywords, and whether it spreads `*args`/`**kwargs` (then binding is assumed for what it could
supply). Binding fails on a missing required argument, an unexpected keyword or too many
positionals, each a separate problem.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from typing import Any, Literal

ParamKind = Literal["posonly", "pos", "varpos", "kwonly", "varkw"]
PARAMETER_KINDS: dict[Any, ParamKind] = {inspect.Parameter.POSITIONAL_ONLY: "posonly",
                                         inspect.Parameter.POSITIONAL_OR_KEYWORD: "pos",
                                         inspect.Parameter.VAR_POSITIONAL: "varpos",
                                         inspect.Parameter.KEYWORD_ONLY: "kwonly", inspect.Parameter.VAR_KEYWORD: "varkw"}


@dataclass(frozen=True)
class Param:
    name: str
    kind: ParamKind
    default: str | None  # source text, None when required
    annotation: str | None = None

    @property
    def required(self) -> bool:
        return self.default is None and self.kind not in ("varpos", "varkw")

    def text(self) -> str:
        prefix = {"varpos": "*", "varkw": "**"}.get(self.kind, "")
        annotation = f": {self.annotation}" if self.annotation else ""
        default = "" if self.default is None else f" = {self.default}" if self.annotation else f"={self.default}"
        return f"{prefix}{self.name}{annotation}{default}"


@dataclass(frozen=True)
class Signature:
    params: list[Param]

    def text(self) -> str:
        parts: list[str] = []
        kinds = [p.kind for p in self.params]
        for i, param in enumerate(self.params):
            if param.kind == "kwonly" and "varpos" not in kinds and (i == 0 or self.params[i - 1].kind != "kwonly"):
                parts.append("*")
            parts.append(param.text())
            if param.kind == "posonly" and (i + 1 == len(self.params) or self.params[i + 1].kind != "posonly"):
                parts.append("/")
        return f"({', '.join(parts)})"

    def without_first(self) -> Signature:
        """Return the signature without `self`/`cls` (a bound method's)."""
        if self.params and self.params[0].kind in ("posonly", "pos"):
            return Signature(self.params[1:])
        return self

    def changed_defaults(self, before: Signature) -> list[tuple[Param, Param]]:
        """Return (now, before) for each parameter that has a default here and in `before`, and a different one."""
        return [(param, old) for param in self.params if (old := before.param(param.name)) is not None
                and param.default is not None and old.default is not None and old.default != param.default]

    def with_taken_keywords(self, taken: list[tuple[str | None, str | None]]) -> Signature:
        """Return the signature a wrapper that takes keywords out before calling this one binds: for each
        (taken, renamed to), `taken` binds as a keyword-only parameter with a default (placed before
        `**kwargs`), and the parameter it is renamed to no longer has to be given; (None, supplied) is a
        keyword the wrapper sets itself, which no longer has to be given either."""
        params = list(self.params)
        for name, renamed in taken:
            target = next((i for i, p in enumerate(params) if p.name == renamed and p.kind not in ("varpos", "varkw")), None)
            if target is not None and params[target].required:
                params[target] = Param(params[target].name, params[target].kind, "...", params[target].annotation)
            if name is not None and not any(p.name == name and p.kind not in ("varpos", "varkw") for p in params):
                at = len(params) - (bool(params) and params[-1].kind == "varkw")
                params.insert(at, Param(name, "kwonly", "None"))
        return Signature(params)

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name and p.kind not in ("varpos", "varkw")), None)

    @property
    def passes_through(self) -> bool:
        """True for `(self, *args, **kwargs)`: a wrapper whose real signature is the next definition's."""
        rest = self.without_first().params
        return bool(rest) and all(p.kind in ("varpos", "varkw") for p in rest)

    @property
    def passes_through_all(self) -> bool:
        """True for `(*args, **kwargs)` with nothing else: a forwarder that says nothing of its callee."""
        return sorted(p.kind for p in self.params) == ["varkw", "varpos"]

    @property
    def accepts_any_keyword(self) -> bool:
        return any(p.kind == "varkw" for p in self.params)

    @property
    def accepts_any_positional(self) -> bool:
        return any(p.kind == "varpos" for p in self.params)


@dataclass(frozen=True)
class CallShape:
    positional: int
    keywords: tuple[str, ...]
    star: bool = False  # *args spread at the call site
    double_star: bool = False  # **kwargs spread at the call site


def signature_of(args: ast.arguments) -> Signature:
    """Return the signature of a parsed function's arguments."""
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + [ast.unparse(d) for d in args.defaults]
    params = [Param(a.arg, "posonly" if i < len(args.posonlyargs) else "pos", d,
                    ast.unparse(a.annotation) if a.annotation else None)
              for i, (a, d) in enumerate(zip(positional, defaults))]
    if args.vararg:
        params.append(Param(args.vararg.arg, "varpos", None, ast.unparse(args.vararg.annotation) if args.vararg.annotation else None))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        params.append(Param(arg.arg, "kwonly", ast.unparse(default) if default is not None else None,
                            ast.unparse(arg.annotation) if arg.annotation else None))
    if args.kwarg:
        params.append(Param(args.kwarg.arg, "varkw", None, ast.unparse(args.kwarg.annotation) if args.kwarg.annotation else None))
    return Signature(params)


def bind_problems(signature: Signature, call: CallShape) -> list[str]:
    """Return why `call` does not bind to `signature` (empty when it does or cannot be decided)."""
    positional_slots = [p for p in signature.params if p.kind in ("posonly", "pos")]
    problems = []
    if call.positional > len(positional_slots) and not signature.accepts_any_positional and not call.star:
        problems.append(f"takes {len(positional_slots)} positional argument(s), the call passes {call.positional}")
    filled = {p.name for p in positional_slots[:call.positional]}
    for keyword in call.keywords:
        param = signature.param(keyword)
        if param is None or param.kind == "posonly":
            if not signature.accepts_any_keyword:
                problems.append(f"unexpected keyword argument '{keyword}'")
        elif keyword in filled:
            problems.append(f"argument '{keyword}' given by position and by keyword")
        filled.add(keyword)
    if not call.star and not call.double_star:
        missing = [p.name for p in signature.params if p.required and p.name not in filled]
        if missing:
            problems.append(f"missing required argument(s) {', '.join(repr(m) for m in missing)}")
    return problems
