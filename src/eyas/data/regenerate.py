"""`eyas regenerate`: the target answers prompts, writing conversations (or documents) for `eyas prepare`.

EAGLE-3 trains the draft on the target's own answers (on-policy data). Prompts come from a JSONL
file (`{"prompt": ...}` or `{"messages": [...]}` ending in a user turn) or from a prepared
dataset's `prompts-*.jsonl`. In chat mode each prompt is rendered through the chat template and its
answer written as a conversation to `conversations.jsonl`; in text mode (a base model: a target
without a chat template, or `--mode text`) each prompt's raw text (`{"prompt"}` or `{"text"}`) is
continued and written as a `{"text": prompt + continuation}` document to `documents.jsonl`, which
`eyas prepare` trains on in full. Generation stops at the target's EOS ids and the extra
`--stop-ids`/`--stop-tokens`. The batches are planned once, over all prompts, in input order under a
token budget (`rows x (longest prompt + max_new_tokens) <= token_budget`), and batch b samples with
seed `seed + b`; answers are appended to the output file one whole batch at a time. A killed
run keeps its complete batches and redoes the rest, so it ends with the same file as an
uninterrupted run. A bad record stops the run naming file, line and field, unless
`--skip-invalid`, which lists each skipped record with its reason in `rejected.jsonl` and counts them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from eyas.config import RegenerateConfig
from eyas.data.chat_tokens import ChatEncoder
from eyas.backends.vllm.contract import installed_vllm, not_installed
from eyas.data.prompts import CHAT_KINDS, KINDS, eos_ids, extra_stop_ids, generate_kwargs, read_prompt_files, target_eos_ids
from eyas.data.records import Prompt
from eyas.errors import CannotRun, EyasError
from eyas.files import sha256_file, write_text_atomic
from eyas.precision import Precision, choose_dtype
from eyas.progress import stage_progress
from eyas.stage import JsonLines, Stage
from eyas.models.fingerprint import target_fingerprint
from eyas.models.load import load_target, resolve_device
from eyas.models.tokenizer import load_tokenizer
from eyas.data.budget import group_under_budget

CONVERSATIONS = "conversations.jsonl"
DOCUMENTS = "documents.jsonl"
REJECTED = "rejected.jsonl"
PROGRESS = "progress.json"
REGENERATE = Stage("regenerate", "an eyas regenerate output", (CONVERSATIONS, DOCUMENTS, REJECTED, PROGRESS),
                   keyed=(PROGRESS,))
Mode = Literal["chat", "text"]
OUTPUT: dict[Mode, str] = {"chat": CONVERSATIONS, "text": DOCUMENTS}


@dataclass
class RegenerateResult:
    out: Path
    file: Path
    mode: Mode
    prompts: int
    rejected: int
    new_tokens: int
    reused: bool


def _prompt_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(path.glob("prompts-*.jsonl"))
        if not files:
            raise EyasError(f"{path}: no prompts-*.jsonl (is it a dataset written by `eyas prepare`?)")
        return files
    if not path.is_file():
        raise EyasError(f"{path}: prompts file not found (--prompts)")
    return [path]


def regenerate_mode(config: RegenerateConfig, tokenizer: Any) -> Mode:
    """Return the mode a run of `config` answers in: `config.mode`, or for "auto" chat when the tokenizer (its
    `--chat-template` applied) has a chat template, else text. Refuses chat without a chat template."""
    if config.mode == "auto":
        return "chat" if tokenizer.chat_template else "text"
    if config.mode == "chat" and not tokenizer.chat_template:
        raise EyasError(f"{config.target}: the tokenizer has no chat template; give one with --chat-template FILE, "
                        "or continue raw text with --mode text (a base model)")
    return config.mode


def _unanswerable(prompt: Prompt, config: RegenerateConfig) -> str | None:
    """Return why the target cannot answer the rendered `prompt` under `config` ("field: reason"), or None."""
    if prompt.text is None and prompt.messages[-1]["role"] != "user":
        return "messages: the last message must be the user's (the target answers it)"
    if len(prompt.ids) + config.max_new_tokens > config.token_budget:
        return f"prompt: {len(prompt.ids)} tokens + max_new_tokens exceed the token budget ({config.token_budget})"
    return None


def read_prompts(config: RegenerateConfig, tokenizer: Any) -> tuple[list[Prompt], list[dict[str, str]]]:
    """Return the answerable prompts in input order and the rejected records (only with `skip_invalid`):
    in chat mode (`regenerate_mode`) `{"prompt"}`/`{"messages"}` rendered with `chat_template_kwargs`, in
    text mode `{"prompt"}`/`{"text"}` as raw text. Refuses a bad record (eyas.data.prompts: a `{"text"}`
    in chat mode, a `{"messages"}` in text mode), a chat whose last message is not the user's, and a prompt
    over the token budget with `max_new_tokens`."""
    text = regenerate_mode(config, tokenizer) == "text"
    encoder = ChatEncoder(tokenizer, config.chat_template_kwargs, False, str(config.target), masks=False)
    return read_prompt_files(_prompt_files(config.prompts), encoder, KINDS if text else CHAT_KINDS,
                             config.limit, config.skip_invalid, lambda prompt: _unanswerable(prompt, config), text)


def plan_batches(prompts: list[Prompt], max_new_tokens: int, token_budget: int) -> list[list[Prompt]]:
    """Return consecutive prompts grouped while `rows x (longest prompt + max_new_tokens) <= token_budget`."""
    sizes = [len(p.ids) + max_new_tokens for p in prompts]
    return [[prompts[i] for i in group] for group in group_under_budget(sizes, token_budget)]


def _stopped(tokens: list[int], eos: set[int]) -> tuple[list[int], str, int]:
    """Return (tokens before the first stop token, finish reason, new tokens generated) of one generated row."""
    stop = next((i for i, token in enumerate(tokens) if token in eos), None)
    kept = tokens[:stop] if stop is not None else tokens
    return kept, "eos" if stop is not None else "length", len(kept) + (stop is not None)


def continuation_text(tokenizer: Any, prompt_ids: list[int], new: list[int]) -> str:
    """Return the text `new` tokens add after `prompt_ids`: the decoded whole less the decoded prompt (so a
    token that begins a word keeps its space), or `new` decoded alone where the whole does not start with
    the prompt's text. Special tokens are left out."""
    whole = tokenizer.decode(prompt_ids + new, skip_special_tokens=True)
    head = tokenizer.decode(prompt_ids, skip_special_tokens=True)
    return whole[len(head):] if whole.startswith(head) else tokenizer.decode(new, skip_special_tokens=True)


def _record(prompt: Prompt, new: list[int], finish: str, mode: Mode, tokenizer: Any) -> dict[str, Any]:
    """Return the output line of one answered prompt: a conversation ending in the answer (chat), or the
    prompt's text with its continuation as one document (text)."""
    if mode == "text":
        assert prompt.text is not None  # text mode reads raw text only
        body: dict[str, Any] = {"text": prompt.text + continuation_text(tokenizer, prompt.ids, new)}
    else:
        answer = tokenizer.decode(new, skip_special_tokens=True).strip()
        body = {"messages": [*prompt.messages, {"role": "assistant", "content": answer}]}
    return {**body, "source": prompt.source, "finish": finish}


@torch.inference_mode()
def _generate_hf(model: Any, batch: list[Prompt], config: RegenerateConfig, eos: set[int], pad: int | None,
                 seed: int) -> list[list[int]]:
    """Return the new tokens per prompt of `batch`, generated by transformers left-padded in one call."""
    device = model.device
    width = max(len(p.ids) for p in batch)
    keywords = generate_kwargs(eos, config.temperature, config.top_p, pad=pad)
    pad = keywords["pad_token_id"]
    ids = torch.tensor([[pad] * (width - len(p.ids)) + p.ids for p in batch], device=device)  # [B, L] left-padded
    mask = torch.tensor([[0] * (width - len(p.ids)) + [1] * len(p.ids) for p in batch], device=device)
    torch.manual_seed(seed)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=config.max_new_tokens, **keywords)
    return out[:, width:].tolist()


class _Generator:
    """The backend that answers: `rows(batch, number, first)` returns the new tokens per prompt of batch `number`,
    whose first prompt is prompt `first` of the run."""

    def __init__(self, config: RegenerateConfig, precision: Precision, tokenizer: Any, longest: int,
                 extra_stops: set[int]) -> None:
        self.config, self.engine, self.model = config, None, None
        if config.backend == "vllm":
            from eyas.backends.vllm.serve import VllmEngine

            installed = installed_vllm()
            assert installed is not None  # checked before the run was claimed
            self.engine = VllmEngine(config.target, precision.dtype, installed.device, longest, config.trust_remote_code,
                                     seed=config.seed, model_impl=config.model_impl)
            self.eos = target_eos_ids(config.target, tokenizer, config.trust_remote_code) | extra_stops
        else:
            parts = load_target(config.target, precision.torch_dtype, resolve_device(config.device), config.trust_remote_code)
            self.model, self.eos = parts.model, eos_ids(parts.model, tokenizer) | extra_stops
        self.pad = tokenizer.pad_token_id

    def rows(self, batch: list[Prompt], number: int, first: int) -> list[list[int]]:
        config = self.config
        if self.engine is not None:
            completions = self.engine.generate([p.ids for p in batch], config.max_new_tokens, config.temperature,
                                               config.top_p, 0, self.eos,
                                               [config.seed + first + i for i in range(len(batch))])
            return [c.token_ids for c in completions]
        return _generate_hf(self.model, batch, config, self.eos, self.pad, config.seed + number)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


def _finished(written: JsonLines, batches: list[list[Prompt]]) -> int:
    """Return how many leading batches the output file holds whole; drop anything after them."""
    lines, done, kept = len(written.read()), 0, 0
    for batch in batches:
        if kept + len(batch) > lines:
            break
        kept += len(batch)
        done += 1
    written.keep(kept)
    return done


def run_regenerate(config: RegenerateConfig) -> RegenerateResult:
    """Answer (chat) or continue (text) every prompt with the target, or finish a killed run; return what
    was written. Refuses, before any weight loads, a chat run without a chat template, a bad `--chat-template`,
    `--stop-ids`/`--stop-tokens` the target's vocabulary lacks, and bad prompts."""
    if config.backend == "vllm" and installed_vllm() is None:
        raise CannotRun(not_installed("--backend vllm", "run .venv-vllm/bin/eyas regenerate ..."))
    precision = choose_dtype(config.dtype, config.device, config.target)
    config = config.model_copy(update={"dtype": precision.dtype})
    tokenizer = load_tokenizer(config.target, config.trust_remote_code, config.chat_template)
    mode = regenerate_mode(config, tokenizer)
    config = config.model_copy(update={"mode": mode})
    extra_stops = extra_stop_ids(config.target, tokenizer, config.stop_ids, config.stop_tokens)
    prompts, rejected = read_prompts(config, tokenizer)
    if not prompts:
        raise EyasError(f"{config.prompts}: no prompts to answer")
    fingerprint = target_fingerprint(config.target, tokenizer)
    inputs = [sha256_file(f) for f in _prompt_files(config.prompts)]
    run = REGENERATE.claim(config, {"target": fingerprint.id, "inputs": inputs}, (precision.note("dtype"),))
    run.write_progress({"run_key": run.key, "prompts": len(prompts), "rejected": len(rejected),
                        "precision": precision.record()})
    precision.announce("regenerate dtype")
    write_text_atomic(config.out / REJECTED, "".join(json.dumps(r) + "\n" for r in rejected))
    batches = plan_batches(prompts, config.max_new_tokens, config.token_budget)
    output = OUTPUT[mode]
    done = _finished(run.lines(output), batches)
    new_tokens = 0
    if done < len(batches):
        generator = _Generator(config, precision, tokenizer, max(len(p.ids) for p in prompts) + config.max_new_tokens,
                               extra_stops)
        started = time.perf_counter()
        try:
            with run.lines(output).appender() as handle, stage_progress() as bar:
                first = sum(len(b) for b in batches[:done])
                task = bar.add_task("regenerate", total=len(prompts), completed=first, rate="")
                for number in range(done, len(batches)):
                    batch = batches[number]
                    answers = [_stopped(row, generator.eos) for row in generator.rows(batch, number, first)]
                    handle.append("\n".join(  # a batch's lines whole, or none of them
                        json.dumps(_record(p, new, finish, mode, tokenizer)) for p, (new, finish, _) in zip(batch, answers)))
                    first += len(batch)
                    new_tokens += sum(count for _, _, count in answers)
                    bar.update(task, advance=len(batch), rate=f"{new_tokens / (time.perf_counter() - started):,.0f} tok/s")
        finally:
            generator.close()
    return RegenerateResult(config.out, config.out / output, mode, len(prompts), len(rejected), new_tokens,
                            done == len(batches))
