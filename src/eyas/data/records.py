"""Normalise raw records into conversations, documents or prompts, detected per record.

Accepted shapes:
- ShareGPT: `{"conversations": [{"from": "human"|"gpt"|"system"|"tool"|..., "value": str}]}`
- OpenAI: `{"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": str}]}`
  Either shape may call tools: the record's `tools` (function specs: a list, or its JSON text), an
  assistant turn's `tool_calls` (`[{"type": "function", "function": {"name": str, "arguments": an object
  or its JSON text}}]`; its content may then be null or absent) and a tool turn's `tool_call_id`; an
  assistant turn's reasoning comes as `reasoning_content`, `reasoning` or `thinking`; any turn may
  have a `name`. A null optional field counts as absent.
- plain document: `{"text": str}` (every token is trained on)
- prompt only: `{"prompt": str}` (kept for `eyas regenerate`, not trained on; `Prompt` is also the
  type `eyas regenerate` and `eyas eval` read their prompts into, eyas.data.prompts)
Anything else is an `InputError` naming the record and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from eyas.errors import InputError

Role = Literal["system", "user", "assistant", "tool"]

ROLE_ALIASES: dict[str, Role] = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
    "tool": "tool",
}
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")  # the names datasets give an assistant's reasoning

# (list field, role field, content field) for each conversation shape
_SHAPES = {"conversations": ("from", "value"), "messages": ("role", "content")}


@dataclass(frozen=True)
class ToolCall:
    """One function call of an assistant turn: `arguments` decoded to a JSON object, `id` as given."""

    name: str
    arguments: dict[str, Any]
    id: str | None = None

    def template_dict(self) -> dict[str, Any]:
        """Return the call in the OpenAI shape chat templates read, `arguments` an object (as vLLM hands
        them to the template, decoding the JSON text a client sends)."""
        call: dict[str, Any] = {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if self.id is not None:
            call["id"] = self.id
        return call


@dataclass(frozen=True)
class Message:
    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def template_dict(self) -> dict[str, Any]:
        """Return the message as vLLM hands it to a chat template: role and content, plus the fields the
        turn has: `tool_calls`, the reasoning as `reasoning_content` and `reasoning`, `tool_call_id`, `name`."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.template_dict() for call in self.tool_calls]
        if self.reasoning is not None:
            message["reasoning_content"] = message["reasoning"] = self.reasoning
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        return message


@dataclass(frozen=True)
class Conversation:
    source: str
    field: str  # "conversations" or "messages": the key errors about turns name
    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...] = ()  # function specs, as given, for the template's `tools`


@dataclass(frozen=True)
class Document:
    source: str
    text: str


@dataclass(frozen=True)
class Prompt:
    """A request for the target to answer, as its record gave it: exactly one of `prompt` (one user
    message), `turns` (`{role, content}` messages, roles as written) or `text` (raw text, no chat
    template). `ids` are its token ids once rendered for a target (eyas.data.prompts), else empty."""

    source: str
    prompt: str | None = None
    turns: list[dict[str, str]] | None = None
    text: str | None = None
    ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if sum(value is not None for value in (self.prompt, self.turns, self.text)) != 1:
            raise ValueError("a Prompt holds exactly one of prompt, turns or text")

    @property
    def kind(self) -> str:
        """The record field this prompt came from: "prompt", "messages" or "text"."""
        return "prompt" if self.prompt is not None else "messages" if self.turns is not None else "text"

    @property
    def messages(self) -> list[dict[str, str]]:
        """The chat the template renders: `turns`, or `prompt` as one user message; refuses raw text."""
        if self.turns is not None:
            return self.turns
        if self.prompt is not None:
            return [{"role": "user", "content": self.prompt}]
        raise ValueError("a raw-text prompt has no messages")


Record = Conversation | Document | Prompt


def unicode_text(source: str, field: str, value: str) -> str:
    """Return `value`; refuses, as an InputError naming `source` and `field`, a string holding a lone
    surrogate (valid JSON such as `"\\ud800"` that pairs with nothing): no tokenizer can encode it."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        surrogate = f"\\u{ord(value[error.start]):04x}"
        raise InputError(source, field, f"holds a lone surrogate ({surrogate}), not valid Unicode text",
                         "lone surrogate") from None
    return value


def _string(source: str, field: str, value: Any) -> str:
    if not isinstance(value, str):
        raise InputError(source, field, f"expected a string, got {type(value).__name__}", "non-string field")
    return unicode_text(source, field, value)


def _optional_string(source: str, field: str, value: Any) -> str | None:
    return None if value is None else _string(source, field, value)


def _json_text(source: str, field: str, value: Any) -> Any:
    """Return `value`, or the JSON value a string `value` holds; refuses malformed JSON."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(unicode_text(source, field, value))
    except json.JSONDecodeError as error:
        raise InputError(source, field, f"malformed JSON: {error.msg} at column {error.colno}", "malformed JSON") from None
    except (RecursionError, ValueError):  # nested too deeply, an integer too long
        raise InputError(source, field, "JSON that Python cannot decode (nested too deeply or an integer too long)",
                         "malformed JSON") from None


def _json_object(source: str, field: str, value: Any, what: str) -> dict[str, Any]:
    """Return `value` when it is a JSON object whose strings are all valid Unicode; refuses anything else
    (a column of a Parquet or Arrow file can hold values JSON has not, such as bytes)."""
    if not isinstance(value, dict):
        raise InputError(source, field, f"expected {what}, got {type(value).__name__}", "not a JSON object")
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError) as error:
        raise InputError(source, field, f"holds a value JSON cannot hold ({error})", "not a JSON object") from None
    unicode_text(source, field, text)
    return value


def _function_name(source: str, field: str, spec: dict[str, Any]) -> str:
    """Return the name of a function spec or call, found at `function.name` or (the bare shape) `name`."""
    if spec.get("function") is not None:
        spec, field = _json_object(source, f"{field}.function", spec["function"], "an object"), f"{field}.function"
    if spec.get("name") is None:
        raise InputError(source, f"{field}.name", "missing", "missing function name")
    name = _string(source, f"{field}.name", spec["name"])
    if not name.strip():
        raise InputError(source, f"{field}.name", "empty function name", "missing function name")
    return name


def _tools(source: str, value: Any) -> tuple[dict[str, Any], ...]:
    """Return a record's function specs (`tools`: a list of objects, or its JSON text), each named."""
    value = _json_text(source, "tools", value)
    if not isinstance(value, list):
        raise InputError(source, "tools", f"expected a list of function specs, got {type(value).__name__}",
                         "tools not a list")
    for index, spec in enumerate(value):
        _function_name(source, f"tools[{index}]", _json_object(source, f"tools[{index}]", spec, "an object"))
    return tuple(value)


def _tool_call(source: str, field: str, value: Any) -> ToolCall:
    """Return one OpenAI-shaped tool call (or the bare `{"name", "arguments"}` shape); `arguments` null or
    empty is `{}`, as vLLM reads it; refuses another `type`, a call without a name and arguments that are
    not a JSON object (or its text)."""
    call = _json_object(source, field, value, "an object")
    if call.get("type") not in (None, "function"):
        raise InputError(source, f"{field}.type", f"unsupported tool call type {call['type']!r} (expected 'function')",
                         "unsupported tool call")
    name = _function_name(source, field, call)
    function, where = (call["function"], f"{field}.function") if call.get("function") is not None else (call, field)
    arguments = function.get("arguments")
    arguments = {} if arguments in (None, "") else _json_text(source, f"{where}.arguments", arguments)
    arguments = _json_object(source, f"{where}.arguments", arguments, "a JSON object")
    return ToolCall(name, arguments, _optional_string(source, f"{field}.id", call.get("id")))


def _tool_calls(source: str, field: str, value: Any) -> tuple[ToolCall, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InputError(source, field, f"expected a list of tool calls, got {type(value).__name__}",
                         "tool calls not a list")
    return tuple(_tool_call(source, f"{field}[{index}]", call) for index, call in enumerate(value))


def _reasoning(source: str, field: str, turn: dict[str, Any]) -> str | None:
    """Return an assistant turn's reasoning, under whichever of REASONING_KEYS it has; refuses differing copies."""
    given = {key: _string(source, f"{field}.{key}", turn[key]) for key in REASONING_KEYS if turn.get(key) is not None}
    if len(set(given.values())) > 1:
        raise InputError(source, field, f"{' and '.join(given)} differ; give the reasoning once", "conflicting reasoning")
    return next(iter(given.values()), None)


def _message(source: str, field: str, role: Role, turn: dict[str, Any], content_key: str) -> Message:
    """Return one turn; an assistant turn that calls tools may have null or no content (read as "").

    Refuses tool calls or reasoning on a turn that is not the assistant's: the template would drop them.
    """
    tool_calls = _tool_calls(source, f"{field}.tool_calls", turn.get("tool_calls"))
    reasoning = _reasoning(source, field, turn)
    if role != "assistant":
        extra = "tool_calls" if tool_calls else next((k for k in REASONING_KEYS if turn.get(k) is not None), None)
        if extra is not None:
            raise InputError(source, f"{field}.{extra}", f"only assistant turns have {extra} (this is a {role} turn)",
                             f"{extra} outside an assistant turn")
    if tool_calls and turn.get(content_key) is None:
        content = ""
    elif content_key not in turn:
        raise InputError(source, f"{field}.{content_key}", "missing", "missing content")
    else:
        content = _string(source, f"{field}.{content_key}", turn[content_key])
    return Message(role, content, tool_calls, reasoning,
                   _optional_string(source, f"{field}.tool_call_id", turn.get("tool_call_id")),
                   _optional_string(source, f"{field}.name", turn.get("name")))


def _conversation(source: str, key: str, turns: Any, tools: Any) -> Conversation:
    role_key, content_key = _SHAPES[key]
    if not isinstance(turns, list):
        raise InputError(source, key, f"expected a list of turns, got {type(turns).__name__}", "turns not a list")
    if not turns:
        raise InputError(source, key, "empty conversation", "empty conversation")
    messages = []
    for index, turn in enumerate(turns):
        field = f"{key}[{index}]"
        if not isinstance(turn, dict):
            raise InputError(source, field, f"expected an object, got {type(turn).__name__}", "turn not an object")
        if role_key not in turn:
            raise InputError(source, f"{field}.{role_key}", "missing", "missing role")
        raw_role = _string(source, f"{field}.{role_key}", turn[role_key])
        role = ROLE_ALIASES.get(raw_role.lower())
        if role is None:
            known = ", ".join(sorted(ROLE_ALIASES))
            raise InputError(source, f"{field}.{role_key}", f"unknown role {raw_role!r} (known: {known})", "unknown role")
        messages.append(_message(source, field, role, turn, content_key))
    if not any(m.role == "assistant" for m in messages):
        raise InputError(source, key, "no assistant turn (nothing to train on; use {\"prompt\": ...} for prompts)", "no assistant turn")
    return Conversation(source, key, tuple(messages), () if tools is None else _tools(source, tools))


def parse_record(source: str, value: Any) -> Record:
    """Return the typed record for one decoded JSON value; raise InputError if it fits no shape."""
    if not isinstance(value, dict):
        raise InputError(source, "record", f"expected a JSON object, got {type(value).__name__}", "record not an object")
    for key in _SHAPES:
        if key in value:
            return _conversation(source, key, value[key], value.get("tools"))
    if value.get("tools") is not None:
        raise InputError(source, "tools", "only conversations (messages, conversations) take tools", "tools without a conversation")
    if "text" in value:
        text = _string(source, "text", value["text"])
        if not text.strip():
            raise InputError(source, "text", "empty document", "empty document")
        return Document(source, text)
    if "prompt" in value:
        prompt = _string(source, "prompt", value["prompt"])
        if not prompt.strip():
            raise InputError(source, "prompt", "empty prompt", "empty prompt")
        return Prompt(source, prompt)
    keys = ", ".join(sorted(map(str, value))) or "none"
    raise InputError(source, "record", f"unrecognised shape (keys: {keys}); expected conversations, messages, text or prompt", "unrecognised shape")
