"""Evaluation prompts: a JSONL file, one prompt per line, turned into the target's token ids.

Each line is an object with exactly one of: `"prompt"` (a user message, rendered through the
target's chat template with the generation prompt), `"messages"` (a list of `{role, content}`,
rendered the same way) or `"text"` (tokenized as is). A tokenizer without a chat template takes
`"prompt"` as raw text and refuses `"messages"`. Blank lines are skipped; anything else that is
not such an object is refused with file, line and field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eyas.errors import EyasError

KINDS = ("prompt", "messages", "text")


def _messages(value: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise EyasError(f"{where}: messages: expected a non-empty list of {{role, content}} objects")
    for i, message in enumerate(value):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise EyasError(f"{where}: messages[{i}]: expected {{\"role\": str, \"content\": str}}")
    return value


def chat_messages(record: dict[str, Any], tokenizer: Any, where: str,
                  kinds: tuple[str, ...] = ("prompt", "messages")) -> list[dict[str, str]]:
    """Return the messages of a `{"prompt": text}` or `{"messages": [...]}` record; refuses any other
    shape, naming `where` and the field."""
    present = [k for k in KINDS if k in record]
    if len(present) != 1 or present[0] not in kinds:
        raise EyasError(f"{where}: expected exactly one of the fields {', '.join(kinds)}, found {present or 'none'}")
    value = record[present[0]]
    if present[0] == "prompt":
        if not isinstance(value, str):
            raise EyasError(f"{where}: prompt: expected a string")
        return [{"role": "user", "content": value}]
    return _messages(value, where)


def _token_ids(record: dict[str, Any], tokenizer: Any, where: str) -> list[int]:
    kinds = [k for k in KINDS if k in record]
    if len(kinds) != 1:
        raise EyasError(f"{where}: expected exactly one of the fields {', '.join(KINDS)}, found {kinds or 'none'}")
    kind, value = kinds[0], record[kinds[0]]
    if kind == "messages" or (kind == "prompt" and tokenizer.chat_template):
        if not tokenizer.chat_template:
            raise EyasError(f"{where}: messages: the target's tokenizer has no chat template")
        messages = chat_messages(record, tokenizer, where)
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        if not isinstance(value, str):
            raise EyasError(f"{where}: {kind}: expected a string")
        ids = tokenizer(value)["input_ids"]
    if not ids:
        raise EyasError(f"{where}: {kind}: no tokens")
    return list(ids)


def read_prompts(path: Path, tokenizer: Any, limit: int | None = None) -> list[list[int]]:
    """Return the token ids of the first `limit` prompts of `path` (all when None); refuses bad lines."""
    if not path.is_file():
        raise EyasError(f"{path}: prompts file not found (--prompts)")
    prompts: list[list[int]] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if limit is not None and len(prompts) >= limit:
                break
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise EyasError(f"{where}: not JSON ({error.msg})") from None
            if not isinstance(record, dict):
                raise EyasError(f"{where}: expected a JSON object")
            prompts.append(_token_ids(record, tokenizer, where))
    if not prompts:
        raise EyasError(f"{path}: no prompts")
    return prompts
