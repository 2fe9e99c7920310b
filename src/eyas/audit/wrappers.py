"""How a `(*args, **kwargs)` decorator wrapper uses the keywords it receives, read from its AST.

A `functools.wraps` wrapper reports the wrapped function's signature, but what a call of it binds
depends on what the wrapper does with its `**kwargs` before calling on:

- hands them on (`func(*args, **kwargs)`, or the mapping passed whole as `contextmanager` does): the
  wrapped signature binds;
- only reads them and calls on with another mapping (transformers' `filter_out_non_signature_kwargs`
  drops the keywords the wrapped function does not name): any keyword binds;
- takes keywords out (`kwargs.pop(old)`, `del kwargs[old]`), perhaps under a new name
  (`kwargs[new] = kwargs.pop(old)`: transformers' `deprecate_kwarg`): the taken keyword binds too, and a
  call may give the old name instead of the new one;
- supplies a keyword itself (`kwargs["timeout"] = ...`, `kwargs.setdefault(...)`: vLLM's retry wrappers):
  a call need not give it.

The API model (from the decorator's source) and the runtime oracle (from the live wrapper's source)
read wrappers through this one module, so both describe the same run-time binding.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

_READING_METHODS = {"get", "items", "keys", "values", "copy", "__contains__", "__getitem__"}
_EDITING_METHODS = {"update", "clear", "popitem"}


@dataclass(frozen=True)
class KeywordUse:
    hands_on: bool  # spreads its `**kwargs` into a call, or passes, returns or aliases the mapping
    takes: tuple[tuple[str | None, str | None], ...]  # (taken, renamed to) as source text: a string literal or a
    # name; (None, supplied) for a keyword the wrapper sets itself
    other_edits: bool  # changes the mapping otherwise (update, clear, popitem)

    @property
    def only_reads(self) -> bool:
        """True when the wrapper never hands its keywords on nor edits them: it takes any keyword itself."""
        return not (self.hands_on or self.takes or self.other_edits)


def keyword_use(wrapper: ast.FunctionDef | ast.AsyncFunctionDef) -> KeywordUse:
    """Return how `wrapper` uses its `**kwargs`; refuses (ValueError) a function without `**kwargs`."""
    if wrapper.args.kwarg is None:
        raise ValueError(f"{wrapper.name} takes no **kwargs")
    name = wrapper.args.kwarg.arg
    parents = {child: node for node in ast.walk(wrapper) for child in ast.iter_child_nodes(node)}
    hands_on = other_edits = False
    takes: list[tuple[str, str | None]] = []
    for node in ast.walk(wrapper):
        if not (isinstance(node, ast.Name) and node.id == name):
            continue
        parent = parents.get(node)
        if isinstance(parent, ast.keyword) and parent.arg is None:
            hands_on = True
        elif isinstance(parent, ast.Attribute):
            call = parents.get(parent)
            if parent.attr == "pop" and isinstance(call, ast.Call) and call.args:
                takes.append((ast.unparse(call.args[0]), _renamed_to(call, parents, name)))
            elif parent.attr == "setdefault" and isinstance(call, ast.Call) and call.args:
                takes.append((None, ast.unparse(call.args[0])))
            elif parent.attr in _EDITING_METHODS:
                other_edits = True
            elif parent.attr not in _READING_METHODS:
                hands_on = True
        elif isinstance(parent, ast.Subscript):
            if isinstance(parent.ctx, ast.Del):
                takes.append((ast.unparse(parent.slice), None))
            elif isinstance(parent.ctx, ast.Store) and not _is_rename_target(parent, parents, name):
                takes.append((None, ast.unparse(parent.slice)))
        elif isinstance(parent, ast.Compare) and all(isinstance(op, (ast.In, ast.NotIn)) for op in parent.ops):
            continue
        elif isinstance(parent, (ast.For, ast.comprehension)) and parent.iter is node:
            continue
        else:
            hands_on = True
    return KeywordUse(hands_on, tuple(takes), other_edits)


def _pop_of(value: ast.AST | None, name: str) -> bool:
    return (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "pop"
            and isinstance(value.func.value, ast.Name) and value.func.value.id == name)


def _renamed_to(pop: ast.Call, parents: dict[ast.AST, ast.AST], name: str) -> str | None:
    """Return the key a `kwargs[new] = kwargs.pop(old)` assignment stores the popped value under, as source."""
    assign = parents.get(pop)
    if isinstance(assign, ast.Assign) and len(assign.targets) == 1:
        target = assign.targets[0]
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and target.value.id == name:
            return ast.unparse(target.slice)
    return None


def _is_rename_target(target: ast.Subscript, parents: dict[ast.AST, ast.AST], name: str) -> bool:
    assign = parents.get(target)
    return isinstance(assign, ast.Assign) and _pop_of(assign.value, name)
