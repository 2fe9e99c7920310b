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

from eyas.config import RegenerateConfig, write_resolved_config
from eyas.decode.prompts import chat_messages
from eyas.errors import EyasError
from eyas.files import LineLog, sha256_file, sha256_text, write_json_atomic, write_text_atomic
from eyas.outputs import claim_output_dir
from eyas.precision import choose_dtype
from eyas.progress import stage_progress
from eyas.target.fingerprint import target_fingerprint
from eyas.target.load import load_target, resolve_device
from eyas.target.tokenizer import load_tokenizer
from eyas.train.batches import group_under_budget

CONVERSATIONS = "conversations.jsonl"
REJECTED = "rejected.jsonl"
PROGRESS = "progress.json"
_OWN = (CONVERSATIONS, REJECTED, PROGRESS, "config.yaml")


@dataclass(frozen=True)
class Prompt:
    index: int
    messages: list[dict[str, str]]
    source: str
    ids: list[int]


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


def read_prompts(config: RegenerateConfig, tokenizer: Any) -> tuple[list[Prompt], list[dict[str, Any]]]:
    """Return the valid prompts in input order and the rejected records (only with `skip_invalid`)."""
    prompts: list[Prompt] = []
    rejected: list[dict[str, Any]] = []
    for file in _prompt_files(config.prompts):
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
            if config.limit is not None and len(prompts) >= config.limit:
                return prompts, rejected
            if not line.strip():
                continue
            where = f"{file}:{number}"
            try:
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise EyasError(f"{where}: expected a JSON object")
                messages = chat_messages(record, tokenizer, where, kinds=("prompt", "messages"))
                if messages[-1]["role"] != "user":
                    raise EyasError(f"{where}: messages: the last message must be the user's (the target answers it)")
                text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                if len(ids) + config.max_new_tokens > config.token_budget:
                    raise EyasError(f"{where}: prompt: {len(ids)} tokens + max_new_tokens exceed the token budget "
                                    f"({config.token_budget})")
            except json.JSONDecodeError as error:
                problem = f"{where}: not JSON ({error.msg})"
            except EyasError as error:
                problem = str(error)
            else:
                prompts.append(Prompt(len(prompts), messages, str(record.get("source") or where), list(ids)))
                continue
            if not config.skip_invalid:
                raise EyasError(problem)
            rejected.append({"where": where, "reason": problem.removeprefix(f"{where}: ")})
    return prompts, rejected


def plan_batches(prompts: list[Prompt], max_new_tokens: int, token_budget: int) -> list[list[Prompt]]:
    """Return consecutive prompts grouped while `rows x (longest prompt + max_new_tokens) <= token_budget`."""
    sizes = [len(p.ids) + max_new_tokens for p in prompts]
    return [[prompts[i] for i in group] for group in group_under_budget(sizes, token_budget)]


@torch.inference_mode()
def _answer(model: Any, tokenizer: Any, batch: list[Prompt], config: RegenerateConfig, seed: int) -> list[tuple[str, str, int]]:
    """Return (answer, finish reason, new tokens) per prompt of `batch`, generated left-padded in one call."""
    device = model.device
    width = max(len(p.ids) for p in batch)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.tensor([[pad] * (width - len(p.ids)) + p.ids for p in batch], device=device)  # [B, L] left-padded
    mask = torch.tensor([[0] * (width - len(p.ids)) + [1] * len(p.ids) for p in batch], device=device)
    torch.manual_seed(seed)
    sample = {"do_sample": True, "temperature": config.temperature, "top_p": config.top_p, "top_k": None} \
        if config.temperature > 0 else {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    out = model.generate(ids, attention_mask=mask, max_new_tokens=config.max_new_tokens, pad_token_id=pad, **sample)
    eos = set(model.generation_config.eos_token_id if isinstance(model.generation_config.eos_token_id, list)
              else [model.generation_config.eos_token_id, tokenizer.eos_token_id])
    answers = []
    for row in out[:, width:].tolist():
        stop = next((i for i, token in enumerate(row) if token in eos), None)
        tokens = row[:stop] if stop is not None else row
        answers.append((tokenizer.decode(tokens, skip_special_tokens=True).strip(), "eos" if stop is not None else "length",
                        len(tokens) + (stop is not None)))
    return answers


def _finished(path: Path, batches: list[list[Prompt]]) -> int:
    """Return how many leading batches `conversations.jsonl` holds whole; drop anything after them."""
    if not path.is_file():
        return 0
    lines = [line for line in path.read_text(encoding="utf-8").splitlines(keepends=True) if line.endswith("\n")]
    done, kept = 0, 0
    for batch in batches:
        if kept + len(batch) > len(lines):
            break
        kept += len(batch)
        done += 1
    write_text_atomic(path, "".join(lines[:kept]))
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
    decisive = {k: v for k, v in config.model_dump(mode="json").items() if k not in ("out", "overwrite", "device")}
    run_key = sha256_text(json.dumps({**decisive, "target": fingerprint.id, "inputs": inputs}, sort_keys=True))
    progress = config.out / PROGRESS
    existing = {json.loads(progress.read_text(encoding="utf-8"))["run_key"]} if progress.is_file() else set()
    claim_output_dir(config.out, run_key, existing, _OWN, config.overwrite, "an eyas regenerate output")
    write_json_atomic(progress, {"run_key": run_key, "prompts": len(prompts), "rejected": len(rejected),
                                 "precision": precision.record()})
    write_resolved_config(config, "regenerate", config.out, (precision.note("dtype"),))
    precision.announce("regenerate dtype")
    write_text_atomic(config.out / REJECTED, "".join(json.dumps(r) + "\n" for r in rejected))
    batches = plan_batches(prompts, config.max_new_tokens, config.token_budget)
    done = _finished(config.out / CONVERSATIONS, batches)
    new_tokens = 0
    if done < len(batches):
        parts = load_target(config.target, precision.torch_dtype, resolve_device(config.device), config.trust_remote_code)
        started = time.perf_counter()
        with LineLog(config.out / CONVERSATIONS) as handle, stage_progress() as bar:
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
