"""Tokenize conversations with the target's chat template and mask exactly the assistant tokens.

The template is rendered once per conversation and tokenized once; assistant spans are found
as character ranges in the rendered text and mapped to tokens through the tokenizer's offset
mapping (no re-tokenization of prefixes). Two markers are learned once per tokenizer by
rendering a probe conversation with sentinel contents:
- `before_assistant`: the text between a user turn's content and the next assistant content
  (the end of the user turn plus the assistant header), and
- `end_of_turn`: the text after assistant content up to and including the first special
  token (`<|im_end|>`, `<|eot_id|>`, `<end_of_turn>`, `</s>`, ...).
An assistant span runs from the end of its header to the end of its end-of-turn marker, so
whatever the template renders there (a thinking block included) is trained on, and the
header, which the server writes into the prompt, is not.

A prompt (`eyas regenerate`, `eyas eval`) is rendered by the same template call, with the
generation prompt, and tokenized the same way (`ChatEncoder.prompt_ids`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from eyas.data.records import Conversation, Document, Prompt
from eyas.errors import EyasError, InputError

_PROBE_USER = ("eyasprobeuserone", "eyasprobeusertwo")
_PROBE_ASSISTANT = ("eyasprobeassistantone", "eyasprobeassistanttwo")


@dataclass(frozen=True)
class Encoded:
    """One tokenized sample: `input_ids [T] int32` and `loss_mask [T] bool`."""

    source: str
    input_ids: np.ndarray
    loss_mask: np.ndarray


@dataclass(frozen=True)
class TurnMarkers:
    """Template text that brackets assistant content (see the module docstring)."""

    before_assistant: str
    generation_prompt: str
    end_of_turn: str


def special_token_strings(tokenizer: Any) -> list[str]:
    """Return the tokenizer's special token strings, longest first."""
    specials = set(tokenizer.all_special_tokens)
    specials.update(t.content for t in tokenizer.added_tokens_decoder.values() if t.special)
    return sorted((s for s in specials if s), key=len, reverse=True)


def _first_special_end(text: str, specials: list[str]) -> int:
    """Return the end index of the earliest special token in `text`, or -1 when there is none."""
    best_pos, best_end = len(text) + 1, -1
    for special in specials:
        pos = text.find(special)
        if 0 <= pos < best_pos:
            best_pos, best_end = pos, pos + len(special)
    return best_end


class ChatEncoder:
    """Renders records with a tokenizer's chat template and returns ids with loss masks, or a prompt's ids.

    `masks=False` makes an encoder of prompts only (`prompt_ids`): it needs no offset mapping, so it
    takes a slow tokenizer too; otherwise a tokenizer without a fast version is refused.
    """

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any], last_turn_only: bool, origin: str,
                 masks: bool = True) -> None:
        if masks and not getattr(tokenizer, "is_fast", False):
            raise EyasError(f"{origin}: tokenizer has no fast (Rust) version; eyas needs its offset mapping")
        self.tokenizer = tokenizer
        self.template_kwargs = template_kwargs
        self.last_turn_only = last_turn_only
        self.origin = origin
        self._markers: TurnMarkers | None = None

    def _render(self, conversations: list[list[dict[str, str]]], generation_prompt: bool = False) -> list[str]:
        return self.tokenizer.apply_chat_template(
            conversations, tokenize=False, add_generation_prompt=generation_prompt, **self.template_kwargs
        )

    @property
    def markers(self) -> TurnMarkers:
        """The turn markers of this template, probed on first use; refuses templates it cannot read."""
        if self._markers is None:
            self._markers = self._probe()
        return self._markers

    def check_template(self, needed_by: str) -> None:
        """Refuse a tokenizer without a chat template (naming the record that needs one) or one eyas cannot read."""
        if not self.tokenizer.chat_template:
            raise EyasError(
                f"{needed_by}: chat_template: the tokenizer of {self.origin} has no chat template;"
                " conversation records need one"
            )
        _ = self.markers

    def _probe(self) -> TurnMarkers:
        (u1, u2), (a1, a2) = _PROBE_USER, _PROBE_ASSISTANT
        probe = [{"role": "user", "content": u1}, {"role": "assistant", "content": a1},
                 {"role": "user", "content": u2}, {"role": "assistant", "content": a2}]
        try:
            text, prompt_only, with_prompt = self._render([probe, probe[:1]]) + self._render([probe[:1]], True)
        except Exception as exc:  # a template is arbitrary Jinja: any error means we cannot use it
            raise EyasError(f"{self.origin}: chat_template: rendering a user/assistant probe failed: {exc}") from None
        if not all(s in text for s in (u1, a1, u2, a2)):
            raise EyasError(f"{self.origin}: chat_template: the template does not render message contents verbatim")
        before = text[text.index(u1) + len(u1):text.index(a1)]
        after = text[text.index(a1) + len(a1):text.index(u2)]
        eot_end = _first_special_end(after, special_token_strings(self.tokenizer))
        if not before.strip() or eot_end < 0:
            raise EyasError(
                f"{self.origin}: chat_template: cannot find the assistant header or an end-of-turn special token "
                f"(rendered probe: {text[:200]!r})"
            )
        generation_prompt = with_prompt[len(prompt_only):] if with_prompt.startswith(prompt_only) else ""
        return TurnMarkers(before, generation_prompt, after[:eot_end])

    def assistant_spans(self, conversation: Conversation, text: str) -> list[tuple[int, int]]:
        """Return the character spans `[start, end)` of assistant turns in `text`, in order.

        Raises InputError naming the turn when the rendered text does not contain it.
        """
        markers = self.markers
        cursor = 0
        spans: list[tuple[int, int]] = []
        for index, message in enumerate(conversation.messages):
            if message.role != "assistant":
                for needle in (message.content, message.content.strip()):
                    pos = text.find(needle, cursor) if needle else -1
                    if pos >= 0:
                        cursor = pos + len(needle)
                        break
                continue
            start = -1
            for header in (markers.before_assistant, markers.generation_prompt):
                pos = text.find(header, cursor) if header else -1
                if pos >= 0:
                    start = pos + len(header)
                    break
            end = text.find(markers.end_of_turn, start) if start >= 0 else -1
            if end < 0:
                raise InputError(
                    conversation.source, f"{conversation.field}[{index}]",
                    "assistant turn not found in the text the chat template rendered (check the turn order)",
                    "assistant turn not found",
                )
            cursor = end + len(markers.end_of_turn)
            spans.append((start, cursor))
        return spans[-1:] if self.last_turn_only else spans

    def render(self, conversations: list[Conversation]) -> list[str]:
        """Return the chat-template text of each conversation (one batched template call)."""
        as_dicts = [[{"role": m.role, "content": m.content} for m in c.messages] for c in conversations]
        try:
            return self._render(as_dicts)
        except Exception:  # find the record that broke the template, for a precise message
            for conversation, messages in zip(conversations, as_dicts):
                try:
                    self._render([messages])
                except Exception as exc:
                    raise InputError(conversation.source, conversation.field, f"chat template failed: {exc}", "chat template failed") from None
            raise

    def prompt_ids(self, prompt: Prompt, where: str) -> list[int]:
        """Return the token ids the target is asked `prompt` with: its chat rendered with the generation
        prompt (and the template kwargs, as conversations are) and tokenized without adding special
        tokens; raw `text`, and a `prompt` when the tokenizer has no chat template, tokenized as is.

        Refuses, naming `where` and the field, `messages` without a chat template, a template that
        fails on the prompt, and a prompt of no tokens.
        """
        raw = prompt.text if prompt.text is not None or self.tokenizer.chat_template else prompt.prompt  # None: a chat
        ids = self.tokenizer(raw)["input_ids"] if raw is not None else self._chat_prompt_ids(prompt, where)
        if not ids:
            raise EyasError(f"{where}: {prompt.kind}: no tokens")
        return list(ids)

    def _chat_prompt_ids(self, prompt: Prompt, where: str) -> list[int]:
        if not self.tokenizer.chat_template:
            raise EyasError(f"{where}: messages: the target's tokenizer has no chat template")
        try:
            text = self._render([prompt.messages], generation_prompt=True)[0]
        except Exception as exc:  # a template is arbitrary Jinja (it may raise on purpose)
            raise EyasError(f"{where}: {prompt.kind}: chat template failed: {exc}") from None
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode(self, records: list[Conversation | Document]) -> list[Encoded]:
        """Tokenize a batch of records; conversations through the template, documents as plain text.

        Documents are trained on in full. Raises InputError for a conversation whose assistant
        turns cannot be located.
        """
        conversations = [r for r in records if isinstance(r, Conversation)]
        documents = [r for r in records if isinstance(r, Document)]
        encoded: dict[int, Encoded] = {}
        if conversations:
            self.check_template(conversations[0].source)
            texts = self.render(conversations)
            spans = [self.assistant_spans(c, t) for c, t in zip(conversations, texts)]
            # the Rust tokenizer directly: same ids as the HF wrapper, without its per-token Python lists
            batch = self.tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
            for conversation, encoding, turn_spans in zip(conversations, batch, spans):
                encoded[id(conversation)] = Encoded(
                    conversation.source, np.asarray(encoding.ids, dtype=np.int32), span_mask(encoding.offsets, turn_spans)
                )
        if documents:
            batch = self.tokenizer([d.text for d in documents], add_special_tokens=True)
            for document, ids in zip(documents, batch["input_ids"]):
                encoded[id(document)] = Encoded(document.source, np.asarray(ids, dtype=np.int32), np.ones(len(ids), bool))
        return [encoded[id(r)] for r in records]


def span_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> np.ndarray:
    """Return `[T] bool`: True for tokens whose characters overlap any `[start, end)` span.

    A zero-width token (some tokenizers give special tokens empty offsets) counts as covering
    its start character.
    """
    off = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)  # [T, 2] (char start, char end)
    starts, ends = off[:, 0], np.maximum(off[:, 1], off[:, 0] + 1)
    mask = np.zeros(len(off), dtype=bool)
    for start, end in spans:
        mask |= (starts < end) & (ends > start)
    return mask
