"""The demo's prompts: 164 HumanEval problems and 96 chat instructions for evaluation, 2,400 distinct
training prompts derived offline (stdlib signatures and docstrings, eyas's general instructions),
disjoint from both."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from eyas.demo.prompts import (
    CHAT_TEMPLATES, CHAT_TOPICS, GENERAL_TEMPLATES, GENERAL_TOPICS, chat_prompts, humaneval_prompts, training_prompts,
    write_prompt_files,
)
from eyas.errors import EyasError


def test_training_prompts_are_many_distinct_and_disjoint_from_humaneval() -> None:
    train, held_out = training_prompts(), humaneval_prompts()
    assert len(held_out) == 164 and held_out[0]["task_id"] == "HumanEval/0"
    assert len(train) == 2400 and len({p["prompt"] for p in train}) == 2400
    entry_points = {p["entry_point"] for p in held_out}
    for prompt in train:
        named = set(re.findall(r"`(?:[\w.]+\.)?(\w+)\(", prompt["prompt"]))  # the function a prompt asks for
        assert not named & entry_points, prompt
        assert not any(f"def {name}(" in prompt["prompt"] for name in entry_points)
    sources = {p["source"].split(":")[0] for p in train}
    assert sources == {"stdlib", "eyas"}
    assert sum(p["source"].startswith("stdlib:") for p in train) > 1500


def test_the_same_seed_gives_the_same_prompts_and_files(tmp_path: Path) -> None:
    assert training_prompts(100, seed=3) == training_prompts(100, seed=3) != training_prompts(100, seed=4)
    train, evaluation, chat = write_prompt_files(tmp_path, count=50)
    assert [json.loads(line) for line in chat.read_text().splitlines()] == chat_prompts()
    assert len(train.read_text().splitlines()) == 50
    first = json.loads(evaluation.read_text().splitlines()[0])
    assert first["prompt"].startswith("Complete the following Python function.") and "def has_close_elements" in first["prompt"]


def test_the_chat_set_shares_no_template_and_no_topic_with_training() -> None:
    chat = chat_prompts()
    assert len(chat) == 96 and len({p["prompt"] for p in chat}) == 96
    assert not set(CHAT_TEMPLATES) & set(GENERAL_TEMPLATES)
    assert not {t.lower() for t in CHAT_TOPICS} & {t.lower() for t in GENERAL_TOPICS}
    training = [p["prompt"].lower() for p in training_prompts()]
    for topic in CHAT_TOPICS:
        assert not any(topic.lower() in prompt for prompt in training), topic
    for template in CHAT_TEMPLATES:
        stem = template.split("{topic}")[0].lower()
        assert not any(prompt.startswith(stem) for prompt in training), template


def test_a_general_share_draws_that_many_general_prompts() -> None:
    mixed = training_prompts(100, seed=0, general_share=0.5)
    assert len({p["prompt"] for p in mixed}) == 100
    assert sum(p["source"].startswith("eyas:general#") for p in mixed) == 50
    assert mixed[:10] != sorted(mixed[:10], key=lambda p: p["source"])  # the two kinds interleaved
    assert all(p["source"].startswith("stdlib:") for p in training_prompts(20, seed=0, general_share=0.0))
    general = len(GENERAL_TEMPLATES) * len(GENERAL_TOPICS)
    with pytest.raises(EyasError, match=f"only {general} general prompts can be derived here, {general + 20} asked for"):
        training_prompts(general + 20, seed=0, general_share=1.0)
