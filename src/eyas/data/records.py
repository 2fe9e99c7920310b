"""Normalise raw records into conversations, documents or prompts, detected per record.

Accepted shapes:
- ShareGPT: `{"conversations": [{"from": "human"|"gpt"|"system"|..., "value": str}]}`
- OpenAI: `{"messages": [{"role": "system"|"user"|"assistant", "content": str}]}`
- plain document: `{"text": str}` (every token is trained on)
- prompt only: `{"prompt": str}` (kept for `eyas regenerate`, not trained on; `Prompt` is also the
  type `eyas regenerate` and `eyas eval` read their prompts into, eyas.data.prompts)
Anything else is an `InputError` naming the record and the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from eyas.errors import InputError

Role = Literal["system", "user", "assistant"]

ROLE_ALIASES: dict[str, Role] = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
}

# (list field, role field, content field) for each conversation shape
_SHAPES = {"conversations": ("from", "value"), "messages": ("role", "content")}


@dataclass(frozen=True)
class Message:
    role: Role
    content: str


@dataclass(frozen=True)
class Conversation:
    source: str
    field: str  # "conversations" or "messages": the key errors about turns name
    messages: tuple[Message, ...]


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


def _conversation(source: str, key: str, turns: Any) -> Conversation:
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
        if content_key not in turn:
            raise InputError(source, f"{field}.{content_key}", "missing", "missing content")
        content = _string(source, f"{field}.{content_key}", turn[content_key])
        messages.append(Message(role, content))
    if not any(m.role == "assistant" for m in messages):
        raise InputError(source, key, "no assistant turn (nothing to train on; use {\"prompt\": ...} for prompts)", "no assistant turn")
    return Conversation(source, key, tuple(messages))


def parse_record(source: str, value: Any) -> Record:
    """Return the typed record for one decoded JSON value; raise InputError if it fits no shape."""
    if not isinstance(value, dict):
        raise InputError(source, "record", f"expected a JSON object, got {type(value).__name__}", "record not an object")
    for key in _SHAPES:
        if key in value:
            return _conversation(source, key, value[key])
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
