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
whatever the template renders there (a thinking block, tool calls included) is trained on, and the
header, which the server writes into the prompt, is not.

Tool calling adds three markers, learned from a probe conversation that calls a function and
answers after its result (only when a record has tool calls or tool turns); a header is what the
template's generation prompt writes there (what a server puts in the prompt), from its first
special token on (the closing text of a tool result before it may repeat the call's id or name):
- `before_call`: the header of an assistant turn that calls a function (after a user turn;
  `before_assistant` when the template does not continue its generation prompt there),
- `after_tool`: the header of an assistant turn that follows a tool result (when the template does
  not continue its generation prompt there, the text up to the answer, from its first special token),
- `end_of_call`: what ends an assistant turn that calls a function: `end_of_turn` when the
  template writes it after the call, else the first special token after it (`<|eom_id|>`).
Tool results (role `tool`) are found like user turns and never trained on. Messages reach the
template as vLLM hands them over (`Message.template_dict`): arguments as objects, reasoning as
`reasoning_content` and `reasoning`; a template that does not render an assistant turn's reasoning
leaves it out of the loss, and the record is counted (`Encoded.unrendered_reasoning`).

A prompt (`eyas regenerate`, `eyas eval`) is rendered by the same template call, with the
generation prompt, and tokenized the same way (`ChatEncoder.prompt_ids`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from eyas.data.records import Conversation, Document, Message, Prompt, ToolCall
from eyas.errors import EyasError, InputError

_PROBE_USER = ("eyasprobeuserone", "eyasprobeusertwo")
_PROBE_ASSISTANT = ("eyasprobeassistantone", "eyasprobeassistanttwo")
_PROBE_FUNCTION, _PROBE_ARGUMENT, _PROBE_RESULT = "eyasprobefunction", "eyasprobeargument", "eyasprobetoolresult"
_PROBE_CALL_ID = "eyasprobe"  # nine letters: Mistral's templates refuse other tool call ids


@dataclass(frozen=True)
class Encoded:
    """One tokenized sample: `input_ids [T] int32` and `loss_mask [T] bool`; `unrendered_reasoning`: an
    assistant turn in the loss has reasoning that the chat template did not render."""

    source: str
    input_ids: np.ndarray
    loss_mask: np.ndarray
    unrendered_reasoning: bool = False


@dataclass(frozen=True)
class TurnMarkers:
    """Template text that brackets assistant content (see the module docstring)."""

    before_assistant: str
    generation_prompt: str
    end_of_turn: str


@dataclass(frozen=True)
class ToolMarkers:
    """Template text around tool turns (see the module docstring)."""

    before_call: str
    after_tool: str
    end_of_call: str


def _header(text: str, prompt: str, content_end: int, answer_at: int, specials: list[str]) -> str | None:
    """Return the assistant header a generation `prompt` writes after the content ending at `content_end`
    in `text`, from its first special token on; None when `text` does not continue `prompt` there or
    the prompt runs past `answer_at` (where the answer starts)."""
    if not (text.startswith(prompt) and content_end <= len(prompt) <= answer_at):
        return None
    written = prompt[content_end:]
    return written[max(_first_special(written, specials)[0], 0):]


def special_token_strings(tokenizer: Any) -> list[str]:
    """Return the tokenizer's special token strings, longest first."""
    specials = set(tokenizer.all_special_tokens)
    specials.update(t.content for t in tokenizer.added_tokens_decoder.values() if t.special)
    return sorted((s for s in specials if s), key=len, reverse=True)


def _first_special(text: str, specials: list[str]) -> tuple[int, int]:
    """Return the `[start, end)` of the earliest special token in `text`, or (-1, -1) when there is none."""
    best_pos, best_end = len(text) + 1, -1
    for special in specials:
        pos = text.find(special)
        if 0 <= pos < best_pos:
            best_pos, best_end = pos, pos + len(special)
    return (best_pos, best_end) if best_end >= 0 else (-1, -1)


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
        self._tool_markers: ToolMarkers | EyasError | None = None

    def _render(self, conversations: list[list[dict[str, Any]]], generation_prompt: bool = False,
                tools: tuple[dict[str, Any], ...] = ()) -> list[str]:
        kwargs = {**self.template_kwargs, **({"tools": list(tools)} if tools else {})}
        return self.tokenizer.apply_chat_template(
            conversations, tokenize=False, add_generation_prompt=generation_prompt, **kwargs
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
                " conversation records need one (give one with --chat-template FILE)"
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
        eot_end = _first_special(after, special_token_strings(self.tokenizer))[1]
        if not before.strip() or eot_end < 0:
            raise EyasError(
                f"{self.origin}: chat_template: cannot find the assistant header or an end-of-turn special token "
                f"(rendered probe: {text[:200]!r})"
            )
        generation_prompt = with_prompt[len(prompt_only):] if with_prompt.startswith(prompt_only) else ""
        return TurnMarkers(before, generation_prompt, after[:eot_end])

    def tool_markers(self, conversation: Conversation) -> ToolMarkers:
        """The tool markers of this template, probed on first use; refuses (an EyasError naming the first
        turn of `conversation` that calls or answers a tool: the target cannot train on tool use) a
        template that fails on the probe, renders no tool call or result, or has no assistant header
        after a tool result or no special token ending a call."""
        if self._tool_markers is None:
            try:
                self._tool_markers = self._probe_tools()
            except EyasError as error:
                self._tool_markers = error
        if isinstance(self._tool_markers, EyasError):
            index = next(i for i, m in enumerate(conversation.messages) if m.tool_calls or m.role == "tool")
            field = f"{conversation.field}[{index}]{'.tool_calls' if conversation.messages[index].tool_calls else ''}"
            raise EyasError(f"{conversation.source}: {field}: {self._tool_markers}")
        return self._tool_markers

    def _probe_tools(self) -> ToolMarkers:
        (u1, _), a2 = _PROBE_USER, _PROBE_ASSISTANT[1]
        function = {"name": _PROBE_FUNCTION, "description": "eyas probe",
                    "parameters": {"type": "object", "properties": {"eyasprobe": {"type": "string"}}}}
        call = ToolCall(_PROBE_FUNCTION, {"eyasprobe": _PROBE_ARGUMENT}, _PROBE_CALL_ID)
        probe = [m.template_dict() for m in (
            Message("user", u1), Message("assistant", "", (call,)),
            Message("tool", _PROBE_RESULT, tool_call_id=_PROBE_CALL_ID, name=_PROBE_FUNCTION), Message("assistant", a2))]
        tools = ({"type": "function", "function": function},)
        try:
            text = self._render([probe], tools=tools)[0]
            before_call, before_answer = self._render([probe[:1], probe[:3]], generation_prompt=True, tools=tools)
        except Exception as exc:  # a template is arbitrary Jinja: any error means we cannot use it
            raise EyasError(f"the chat template of {self.origin} failed on a tool-calling probe: {exc}") from None
        user_end = text.find(u1) + len(u1)
        call_at = text.find(_PROBE_ARGUMENT, user_end)
        result_end = text.find(_PROBE_RESULT, max(call_at, 0)) + len(_PROBE_RESULT)
        answer_at = text.find(a2, result_end)
        rendered = f"(rendered probe: {text[max(user_end - len(u1), 0):][:300]!r})"
        if min(user_end - len(u1), call_at, result_end - len(_PROBE_RESULT), answer_at) < 0:
            raise EyasError(f"the chat template of {self.origin} does not render tool calls and tool results {rendered}")
        specials = special_token_strings(self.tokenizer)
        header = _header(text, before_call, user_end, call_at, specials)
        if header is None:
            header = self.markers.before_assistant if self.markers.before_assistant in text[user_end:call_at] else ""
        after_tool = _header(text, before_answer, result_end, answer_at, specials)
        if after_tool is None:
            between = text[result_end:answer_at]
            after_tool = between[max(_first_special(between, specials)[0], 0):]
        call_tail = text[call_at + len(_PROBE_ARGUMENT):result_end - len(_PROBE_RESULT)]
        end = call_tail.find(self.markers.end_of_turn)
        start, stop = (end, end + len(self.markers.end_of_turn)) if end >= 0 else _first_special(call_tail, specials)
        if not header.strip() or not after_tool.strip() or start < 0:
            raise EyasError(f"the chat template of {self.origin}: cannot find the assistant header before a tool call or "
                            f"after a tool result, or an end-of-turn special token after a call {rendered}")
        return ToolMarkers(header, after_tool, call_tail[start:stop])

    def _turn_spans(self, conversation: Conversation, text: str) -> list[tuple[int, int, int]]:
        """Return `(message index, start, end)` of each assistant turn's character span `[start, end)` in
        `text`, in order; raises InputError naming the turn when the rendered text does not contain it."""
        markers = self.markers
        tools = self.tool_markers(conversation) if any(m.tool_calls or m.role == "tool" for m in conversation.messages) else None
        cursor = 0
        spans: list[tuple[int, int, int]] = []
        for index, message in enumerate(conversation.messages):
            if message.role != "assistant":
                for needle in (message.content, message.content.strip()):
                    pos = text.find(needle, cursor) if needle else -1
                    if pos >= 0:
                        cursor = pos + len(needle)
                        break
                continue
            after_tool = index > 0 and conversation.messages[index - 1].role == "tool"
            if tools and after_tool:
                headers: tuple[str, ...] = (tools.after_tool,)
            elif tools and message.tool_calls:
                headers = (tools.before_call,)
            else:
                headers = (markers.before_assistant, markers.generation_prompt)
            end_of_turn = tools.end_of_call if tools and message.tool_calls else markers.end_of_turn
            start = -1
            for header in headers:
                pos = text.find(header, cursor) if header else -1
                if pos >= 0:
                    start = pos + len(header)
                    break
            end = text.find(end_of_turn, start) if start >= 0 else -1
            if end < 0:
                raise InputError(
                    conversation.source, f"{conversation.field}[{index}]",
                    "assistant turn not found in the text the chat template rendered (check the turn order)",
                    "assistant turn not found",
                )
            cursor = end + len(end_of_turn)
            spans.append((index, start, cursor))
        return spans[-1:] if self.last_turn_only else spans

    def assistant_spans(self, conversation: Conversation, text: str) -> list[tuple[int, int]]:
        """Return the character spans `[start, end)` of the assistant turns in the loss in `text`, in order
        (the last one only with `last_turn_only`).

        Raises InputError naming the turn when the rendered text does not contain it; EyasError when the
        conversation uses tools and the template cannot render them (`tool_markers`).
        """
        return [(start, end) for _, start, end in self._turn_spans(conversation, text)]

    def _render_group(self, conversations: list[Conversation], tools: tuple[dict[str, Any], ...]) -> list[str]:
        as_dicts = [[m.template_dict() for m in c.messages] for c in conversations]
        try:
            return self._render(as_dicts, tools=tools)
        except Exception:  # find the record that broke the template, for a precise message
            for conversation, messages in zip(conversations, as_dicts):
                try:
                    self._render([messages], tools=tools)
                except Exception as exc:
                    raise InputError(conversation.source, conversation.field, f"chat template failed: {exc}", "chat template failed") from None
            raise

    def render(self, conversations: list[Conversation]) -> list[str]:
        """Return the chat-template text of each conversation: one batched template call per distinct
        `tools` list (the template's `tools` argument holds for a whole call)."""
        groups: dict[str, list[int]] = {}
        for position, conversation in enumerate(conversations):
            groups.setdefault(json.dumps(conversation.tools), []).append(position)
        texts: list[str] = [""] * len(conversations)
        for positions in groups.values():
            members = [conversations[p] for p in positions]
            for position, text in zip(positions, self._render_group(members, members[0].tools)):
                texts[position] = text
        return texts

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
            raise EyasError(f"{where}: messages: the target's tokenizer has no chat template (give one with --chat-template FILE)")
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
            turns = [self._turn_spans(c, t) for c, t in zip(conversations, texts)]
            # the Rust tokenizer directly: same ids as the HF wrapper, without its per-token Python lists
            batch = self.tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
            for conversation, text, encoding, spans in zip(conversations, texts, batch, turns):
                encoded[id(conversation)] = Encoded(
                    conversation.source, np.asarray(encoding.ids, dtype=np.int32),
                    span_mask(encoding.offsets, [(start, end) for _, start, end in spans]),
                    reasoning_unrendered(conversation, text, spans),
                )
        if documents:
            batch = self.tokenizer([d.text for d in documents], add_special_tokens=True)
            for document, ids in zip(documents, batch["input_ids"]):
                encoded[id(document)] = Encoded(document.source, np.asarray(ids, dtype=np.int32), np.ones(len(ids), bool))
        return [encoded[id(r)] for r in records]


def reasoning_unrendered(conversation: Conversation, text: str, spans: list[tuple[int, int, int]]) -> bool:
    """Return whether an assistant turn among `spans` (`(message index, start, end)` in `text`) has
    reasoning that the chat template did not render inside its span (whitespace-only reasoning aside)."""
    for index, start, end in spans:
        reasoning = (conversation.messages[index].reasoning or "").strip()
        if reasoning and reasoning not in text[start:end]:
            return True
    return False


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
