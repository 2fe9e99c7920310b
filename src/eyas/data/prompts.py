"""Prompts the target answers (`eyas regenerate`, `eyas eval`): read, rendered into its ids, and stopped.

A prompts file is JSONL, one record per line, with exactly one of the fields `"prompt"` (a user
message), `"messages"` (a non-empty list of `{role, content}`) or `"text"` (raw text), among those
the caller accepts; other fields are ignored but `"source"`, the prompt's origin (`eyas prepare`
writes it into a dataset's `prompts-*.jsonl`). Blank lines are skipped. A bad line stops the read
with one line naming file, line and field, or, when the caller skips bad records, is listed.

Every prompt becomes token ids through `ChatEncoder.prompt_ids`: the chat template `eyas prepare`
trains with, its `chat_template_kwargs` included, with the generation prompt; read as raw text
(`raw_text`, `eyas regenerate --mode text`), a `"prompt"` is tokenized as is, like `"text"`. The
target stops at `eos_ids` plus the `extra_stop_ids` a run asks for, and `generate_kwargs` are what
transformers' `generate` is told about stopping and sampling.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from eyas.data.chat_tokens import ChatEncoder
from eyas.data.records import Prompt, unicode_text
from eyas.data.sources import load_json_line, text_lines
from eyas.errors import EyasError

KINDS = ("prompt", "messages", "text")
CHAT_KINDS = ("prompt", "messages")


def _turns(value: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise EyasError(f"{where}: messages: expected a non-empty list of {{role, content}} objects")
    for i, message in enumerate(value):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise EyasError(f"{where}: messages[{i}]: expected {{\"role\": str, \"content\": str}}")
        for key in ("role", "content"):
            unicode_text(where, f"messages[{i}].{key}", message[key])
    return value


def parse_prompt(record: Any, where: str, kinds: tuple[str, ...] = KINDS) -> Prompt:
    """Return the prompt of one decoded JSONL value (its source: the record's `"source"`, else `where`).

    Refuses, naming `where` and the field: a value that is not an object, one without exactly one of
    the fields `kinds`, a non-string prompt or text, malformed messages, and text holding a lone
    surrogate.
    """
    if not isinstance(record, dict):
        raise EyasError(f"{where}: expected a JSON object")
    present = [k for k in KINDS if k in record]
    if len(present) != 1 or present[0] not in kinds:
        raise EyasError(f"{where}: expected exactly one of the fields {', '.join(kinds)}, found {present or 'none'}")
    kind, value, source = present[0], record[present[0]], str(record.get("source") or where)
    if kind == "messages":
        return Prompt(source, turns=_turns(value, where))
    if not isinstance(value, str):
        raise EyasError(f"{where}: {kind}: expected a string")
    unicode_text(where, kind, value)
    return Prompt(source, prompt=value) if kind == "prompt" else Prompt(source, text=value)


def _lines(files: list[Path]) -> Iterator[tuple[str, str]]:
    """Yield `(file:line, text)` for each non-blank line of `files`, in order (eyas.data.sources.text_lines)."""
    for file in files:
        for number, line in text_lines(file):
            yield f"{file}:{number}", line


def _read_one(line: str, where: str, encoder: ChatEncoder, kinds: tuple[str, ...],
              check: Callable[[Prompt], str | None], raw_text: bool) -> Prompt:
    try:
        record = load_json_line(where, line)
    except json.JSONDecodeError as error:
        raise EyasError(f"{where}: not JSON ({error.msg})") from None
    prompt = parse_prompt(record, where, kinds)
    if raw_text:
        prompt = _as_text(prompt, where)
    prompt = replace(prompt, ids=encoder.prompt_ids(prompt, where))
    problem = check(prompt)
    if problem is not None:
        raise EyasError(f"{where}: {problem}")
    return prompt


def _as_text(prompt: Prompt, where: str) -> Prompt:
    """Return `prompt` as raw text (a `"prompt"` becomes `"text"`); refuses a chat (`"messages"`)."""
    if prompt.turns is not None:
        raise EyasError(f"{where}: messages: a chat, and this run continues raw text (prompt or text records); "
                        "a chat needs a chat template (--chat-template FILE, --mode chat)")
    return prompt if prompt.text is not None else Prompt(prompt.source, text=prompt.prompt)


def read_prompt_files(files: list[Path], encoder: ChatEncoder, kinds: tuple[str, ...] = KINDS,
                      limit: int | None = None, skip_invalid: bool = False,
                      check: Callable[[Prompt], str | None] = lambda prompt: None, raw_text: bool = False,
                      ) -> tuple[list[Prompt], list[dict[str, str]]]:
    """Return the first `limit` (all when None) good prompts of `files`, in order, with their ids
    (`encoder.prompt_ids`), and the bad records as `{"where", "reason"}` (only with `skip_invalid`).
    With `raw_text` every prompt is raw text: a `"prompt"` is read as `"text"`, a `"messages"` is bad.

    A record is bad when it is not JSON (or not UTF-8, nested too deeply, holds too long an integer),
    `parse_prompt` or `encoder.prompt_ids` refuses it, or `check` returns a problem (`"field: reason"`)
    for the rendered prompt. Without `skip_invalid` the first bad record is refused as a one-line
    EyasError naming file, line and field; a file that cannot be read is refused whole (`UnreadableInput`).
    """
    prompts: list[Prompt] = []
    rejected: list[dict[str, str]] = []
    for where, line in _lines(files):
        if limit is not None and len(prompts) >= limit:
            break
        try:
            prompts.append(_read_one(line, where, encoder, kinds, check, raw_text))
        except EyasError as error:
            if not skip_invalid:
                raise
            rejected.append({"where": where, "reason": str(error).removeprefix(f"{where}: ")})
    return prompts, rejected


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """Return the ids the target stops at: its generation config's `eos_token_id` (an int or a list)
    and the tokenizer's EOS (an empty set when neither has one: generation stops at its length)."""
    return _stop_ids(model.generation_config, tokenizer)


def target_eos_ids(target: Path, tokenizer: Any, trust_remote_code: bool = False) -> set[int]:
    """Return `eos_ids` of a target without loading its weights: the generation config is read from
    `generation_config.json`, else derived from the model config (a GGUF file's too)."""
    from transformers import GenerationConfig

    from eyas.models.fingerprint import hf_location
    from eyas.models.load import load_config

    path, kwargs = hf_location(target)
    try:
        generation = GenerationConfig.from_pretrained(path, local_files_only=True, **kwargs)
    except OSError:  # no generation_config.json (GGUF files have none)
        generation = GenerationConfig.from_model_config(load_config(target, trust_remote_code))
    return _stop_ids(generation, tokenizer)


def _stop_ids(generation_config: Any, tokenizer: Any) -> set[int]:
    found = getattr(generation_config, "eos_token_id", None)  # a model that cannot generate has None
    listed = found if isinstance(found, list) else [] if found is None else [found]
    ids = {int(i) for i in listed}
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def extra_stop_ids(target: Path, tokenizer: Any, ids: list[int], tokens: str | None) -> set[int]:
    """Return the stop ids a run adds to the target's EOS ids: `ids` (`--stop-ids`) as given, and each of
    the comma-separated `tokens` (`--stop-tokens`, each stripped of surrounding spaces) as the tokenizer
    spells it: a vocabulary entry (`<end_of_turn>`), else text that encodes to exactly one token.

    Refuses, in one line naming the flag and the value, an id outside the target's vocabulary (its
    config's `vocab_size`) and a token the tokenizer does not have.
    """
    from eyas.models.fingerprint import config_vocab_size, read_model_config

    vocab_size = config_vocab_size(target, read_model_config(target))
    for token_id in ids:
        if not 0 <= token_id < vocab_size:
            raise EyasError(f"stop_ids: {token_id} is outside the vocabulary of {target} (ids 0..{vocab_size - 1})")
    found = set(ids)
    vocabulary = tokenizer.get_vocab()
    for token in (t.strip() for t in (tokens or "").split(",")):
        if not token:
            continue
        encoded = vocabulary.get(token)
        if encoded is None and len(single := tokenizer.encode(token, add_special_tokens=False)) == 1:
            encoded = single[0]
        if encoded is None:
            raise EyasError(f"stop_tokens: {token!r} is not one token of the tokenizer of {target} "
                            "(give the token as the tokenizer spells it, or its id with --stop-ids)")
        found.add(int(encoded))
    return found


def generate_kwargs(eos: set[int], temperature: float, top_p: float, top_k: int = 0,
                    pad: int | None = None) -> dict[str, Any]:
    """Return the keywords of transformers' `generate` that stop at `eos` and pad with `pad` (default:
    the smallest EOS id, else 0): greedy at temperature 0 (the sampling knobs None, so the target's
    own generation config cannot switch sampling back on), else sampling with `temperature`, `top_p`
    and `top_k` (0: no top-k)."""
    stops = {"eos_token_id": sorted(eos) or None, "pad_token_id": pad if pad is not None else min(eos, default=0)}
    if temperature == 0:
        return {**stops, "do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    return {**stops, "do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": top_k or None}
