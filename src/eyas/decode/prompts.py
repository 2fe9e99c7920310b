"""Evaluation prompts: one JSONL file turned into the target's token ids (eyas.data.prompts reads them).

Each line is an object with exactly one of: `"prompt"` (a user message, rendered through the
target's chat template with the generation prompt), `"messages"` (a list of `{role, content}`,
rendered the same way) or `"text"` (tokenized as is). The chat template is the one in effect on
`tokenizer` (`eyas.models.tokenizer.load_tokenizer`: the target's own or a `--chat-template FILE`).
A tokenizer without a chat template takes `"prompt"` as raw text and refuses `"messages"`. The template gets the same `chat_template_kwargs`
as `eyas prepare` and `eyas regenerate`, so the draft is evaluated on prompts shaped as it was trained.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eyas.data.chat_tokens import ChatEncoder
from eyas.data.prompts import KINDS, read_prompt_files
from eyas.errors import EyasError


def read_prompts(path: Path, tokenizer: Any, limit: int | None = None,
                 template_kwargs: dict[str, Any] | None = None) -> list[list[int]]:
    """Return the token ids of the first `limit` prompts of `path` (all when None), chats rendered with
    `template_kwargs`; refuses a missing or unreadable file, a bad line (file, line, field: not JSON, not
    UTF-8, a lone surrogate, ...) and a file of no prompts."""
    if not path.is_file():
        raise EyasError(f"{path}: prompts file not found (--prompts)")
    encoder = ChatEncoder(tokenizer, template_kwargs or {}, False, str(tokenizer.name_or_path), masks=False)
    prompts, _ = read_prompt_files([path], encoder, KINDS, limit)
    if not prompts:
        raise EyasError(f"{path}: no prompts")
    return [prompt.ids for prompt in prompts]
