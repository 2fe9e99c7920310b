"""`eyas regenerate`: the target answers prompts, writing conversations for `eyas prepare`.

EAGLE-3 trains the draft on the target's own answers (on-policy data). Prompts come from a JSONL
file (`{"prompt": ...}` or `{"messages": [...]}` ending in a user turn) or from a prepared
dataset's `prompts-*.jsonl`. The batches are planned once, over all prompts, in input order under a
token budget (`rows x (longest prompt + max_new_tokens) <= token_budget`), and batch b samples with
seed `seed + b`; answers are appended to `conversations.jsonl` one whole batch at a time. A killed
run keeps its complete batches and redoes the rest, so it ends with the same file as an
uninterrupted run. A bad record stops the run naming file, line and field, unless
`--skip-invalid`, which lists each skipped record with its reason in `rejected.jsonl` and counts them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eyas.config import RegenerateConfig
from eyas.data.chat_tokens import ChatEncoder
from eyas.data.prompts import CHAT_KINDS, eos_ids, generate_kwargs, read_prompt_files
from eyas.data.records import Prompt
from eyas.errors import EyasError
from eyas.files import sha256_file, write_text_atomic
from eyas.precision import choose_dtype
from eyas.progress import stage_progress
from eyas.stage import JsonLines, Stage
from eyas.models.fingerprint import target_fingerprint
from eyas.models.load import load_target, resolve_device
from eyas.models.tokenizer import load_tokenizer
from eyas.data.budget import group_under_budget

CONVERSATIONS = "conversations.jsonl"
REJECTED = "rejected.jsonl"
PROGRESS = "progress.json"
REGENERATE = Stage("regenerate", "an eyas regenerate output", (CONVERSATIONS, REJECTED, PROGRESS), keyed=(PROGRESS,))


@dataclass
class RegenerateResult:
    out: Path
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


def _unanswerable(prompt: Prompt, config: RegenerateConfig) -> str | None:
    """Return why the target cannot answer the rendered `prompt` under `config` ("field: reason"), or None."""
    if prompt.messages[-1]["role"] != "user":
        return "messages: the last message must be the user's (the target answers it)"
    if len(prompt.ids) + config.max_new_tokens > config.token_budget:
        return f"prompt: {len(prompt.ids)} tokens + max_new_tokens exceed the token budget ({config.token_budget})"
    return None


def read_prompts(config: RegenerateConfig, tokenizer: Any) -> tuple[list[Prompt], list[dict[str, str]]]:
    """Return the answerable prompts in input order, rendered with `chat_template_kwargs`, and the rejected
    records (only with `skip_invalid`); refuses a bad record (eyas.data.prompts), one whose last message is
    not the user's, and one over the token budget with `max_new_tokens`."""
    encoder = ChatEncoder(tokenizer, config.chat_template_kwargs, False, str(config.target), masks=False)
    return read_prompt_files(_prompt_files(config.prompts), encoder, CHAT_KINDS, config.limit, config.skip_invalid,
                             lambda prompt: _unanswerable(prompt, config))


def plan_batches(prompts: list[Prompt], max_new_tokens: int, token_budget: int) -> list[list[Prompt]]:
    """Return consecutive prompts grouped while `rows x (longest prompt + max_new_tokens) <= token_budget`."""
    sizes = [len(p.ids) + max_new_tokens for p in prompts]
    return [[prompts[i] for i in group] for group in group_under_budget(sizes, token_budget)]


@torch.inference_mode()
def _answer(model: Any, tokenizer: Any, batch: list[Prompt], config: RegenerateConfig, seed: int) -> list[tuple[str, str, int]]:
    """Return (answer, finish reason, new tokens) per prompt of `batch`, generated left-padded in one call."""
    device = model.device
    width = max(len(p.ids) for p in batch)
    eos = eos_ids(model, tokenizer)
    keywords = generate_kwargs(eos, config.temperature, config.top_p, pad=tokenizer.pad_token_id)
    pad = keywords["pad_token_id"]
    ids = torch.tensor([[pad] * (width - len(p.ids)) + p.ids for p in batch], device=device)  # [B, L] left-padded
    mask = torch.tensor([[0] * (width - len(p.ids)) + [1] * len(p.ids) for p in batch], device=device)
    torch.manual_seed(seed)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=config.max_new_tokens, **keywords)
    answers = []
    for row in out[:, width:].tolist():
        stop = next((i for i, token in enumerate(row) if token in eos), None)
        tokens = row[:stop] if stop is not None else row
        answers.append((tokenizer.decode(tokens, skip_special_tokens=True).strip(), "eos" if stop is not None else "length",
                        len(tokens) + (stop is not None)))
    return answers


def _finished(conversations: JsonLines, batches: list[list[Prompt]]) -> int:
    """Return how many leading batches `conversations.jsonl` holds whole; drop anything after them."""
    lines, done, kept = len(conversations.read()), 0, 0
    for batch in batches:
        if kept + len(batch) > lines:
            break
        kept += len(batch)
        done += 1
    conversations.keep(kept)
    return done


def run_regenerate(config: RegenerateConfig) -> RegenerateResult:
    """Answer every prompt with the target (or finish a killed run); return what was written."""
    precision = choose_dtype(config.dtype, config.device)
    config = config.model_copy(update={"dtype": precision.dtype})
    tokenizer = load_tokenizer(config.target, config.trust_remote_code)
    if not tokenizer.chat_template:
        raise EyasError(f"{config.target}: the tokenizer has no chat template; regenerate answers chat prompts")
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
    done = _finished(run.lines(CONVERSATIONS), batches)
    new_tokens = 0
    if done < len(batches):
        parts = load_target(config.target, precision.torch_dtype, resolve_device(config.device), config.trust_remote_code)
        started = time.perf_counter()
        with run.lines(CONVERSATIONS).appender() as handle, stage_progress() as bar:
            task = bar.add_task("regenerate", total=len(prompts), completed=sum(len(b) for b in batches[:done]), rate="")
            for number in range(done, len(batches)):
                batch = batches[number]
                answers = _answer(parts.model, tokenizer, batch, config, config.seed + number)
                handle.append("\n".join(json.dumps({  # a batch's lines whole, or none of them
                    "messages": [*p.messages, {"role": "assistant", "content": answer}], "source": p.source,
                    "finish": finish}) for p, (answer, finish, _) in zip(batch, answers)))
                new_tokens += sum(count for _, _, count in answers)
                bar.update(task, advance=len(batch), rate=f"{new_tokens / (time.perf_counter() - started):,.0f} tok/s")
    return RegenerateResult(config.out, len(prompts), len(rejected), new_tokens, done == len(batches))
