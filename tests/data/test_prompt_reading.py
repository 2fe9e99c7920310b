"""One reading, one rendering, one EOS set for prompts: `eyas regenerate` and `eyas eval` turn the same prompt
into the same ids, with the chat template and `chat_template_kwargs` `eyas prepare` trains with, and stop at
the target's generation-config EOS ids and the tokenizer's EOS alike."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import chat, write_jsonl

from eyas.config import RegenerateConfig
from eyas.data import regenerate
from eyas.data.chat_tokens import ChatEncoder
from eyas.data.prompts import eos_ids, generate_kwargs, parse_prompt
from eyas.data.records import Prompt, parse_record
from eyas.decode import prompts as eval_prompts
from eyas.errors import EyasError
from eyas.models.load import load_target
from eyas.models.tokenizer import load_tokenizer

QUESTION, ANSWER = "Explain why the sky is blue", "Rayleigh scattering."
SYSTEM_AND_USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]
# ChatML whose rendering depends on a template variable, as Qwen-3's `enable_thinking` does
THINKING_SWITCH = (
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<|im_start|>system\\n/no_think<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def regenerate_ids(target: Path, tokenizer: object, prompts: Path, **kwargs: object) -> list[list[int]]:
    config = RegenerateConfig(target=target, prompts=prompts, out=prompts.parent / "regen", chat_template_kwargs=kwargs)
    read, rejected = regenerate.read_prompts(config, tokenizer)
    assert rejected == []
    return [prompt.ids for prompt in read]


@pytest.mark.parametrize("style", ["chatml", "llama3", "qwen3", "mistral"])
def test_regenerate_and_eval_turn_a_prompt_into_the_same_ids(tiny_targets: dict[str, Path], tmp_path: Path,
                                                             style: str) -> None:
    tokenizer = load_tokenizer(tiny_targets[style])
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": QUESTION}, {"messages": SYSTEM_AND_USER}])
    regenerated = regenerate_ids(tiny_targets[style], tokenizer, prompts)
    assert regenerated == eval_prompts.read_prompts(prompts, tokenizer)
    for ids, messages in zip(regenerated, (SYSTEM_AND_USER[1:], SYSTEM_AND_USER)):
        own = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert ids == tokenizer(own, add_special_tokens=False)["input_ids"]


def test_chat_template_kwargs_shape_prepare_regenerate_and_eval_alike(tiny_targets: dict[str, Path],
                                                                      tmp_path: Path) -> None:
    tokenizer = load_tokenizer(tiny_targets["chatml"])
    tokenizer.chat_template = THINKING_SWITCH
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": QUESTION}])
    conversation = parse_record("t.jsonl:1", chat(("user", QUESTION), ("assistant", ANSWER)))
    rendered = {}
    for kwargs in ({}, {"enable_thinking": False}):
        trained = ChatEncoder(tokenizer, kwargs, False, "t").encode([conversation])[0]
        [regenerated] = regenerate_ids(tiny_targets["chatml"], tokenizer, prompts, **kwargs)
        [evaluated] = eval_prompts.read_prompts(prompts, tokenizer, template_kwargs=kwargs)
        assert regenerated == evaluated
        # the prompt is exactly what prepare leaves unmasked before the answer it trains on
        assert trained.input_ids[:len(regenerated)].tolist() == regenerated
        assert not trained.loss_mask[:len(regenerated)].any() and trained.loss_mask[len(regenerated)]
        rendered[bool(kwargs)] = tokenizer.decode(regenerated)
    assert "/no_think" in rendered[True] and "/no_think" not in rendered[False]


def test_the_generation_prompt_is_the_one_prepare_probes(tiny_targets: dict[str, Path], tmp_path: Path) -> None:
    tokenizer = load_tokenizer(tiny_targets["qwen3"])
    encoder = ChatEncoder(tokenizer, {"enable_thinking": False}, False, "t")
    ids = encoder.prompt_ids(Prompt("t:1", prompt=QUESTION), "t:1")
    assert tokenizer.decode(ids).endswith(encoder.markers.generation_prompt)
    assert encoder.markers.generation_prompt.endswith("<think>\n\n</think>\n\n")
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": QUESTION}])
    assert eval_prompts.read_prompts(prompts, tokenizer, template_kwargs={"enable_thinking": False}) == [ids]


def test_without_a_chat_template_a_prompt_is_raw_text_and_messages_are_refused(tiny_targets: dict[str, Path]) -> None:
    tokenizer = load_tokenizer(tiny_targets["notemplate"])
    encoder = ChatEncoder(tokenizer, {}, False, "t")
    assert encoder.prompt_ids(Prompt("t:1", prompt=QUESTION), "t:1") == tokenizer(QUESTION)["input_ids"]
    with pytest.raises(EyasError, match=r"^p:3: messages: the target's tokenizer has no chat template \(give one with --chat-template FILE\)$"):
        encoder.prompt_ids(Prompt("t:1", turns=SYSTEM_AND_USER), "p:3")


@pytest.mark.parametrize(("record", "kinds", "message"), [
    ({"text": "raw"}, ("prompt", "messages"), "p:1: expected exactly one of the fields prompt, messages, found ['text']"),
    ({"messages": []}, ("prompt", "messages", "text"), "p:1: messages: expected a non-empty list"),
    ({"text": 3}, ("prompt", "messages", "text"), "p:1: text: expected a string"),
    ("a string", ("prompt",), "p:1: expected a JSON object"),
])
def test_parse_prompt_refuses_naming_line_and_field(record: object, kinds: tuple[str, ...], message: str) -> None:
    with pytest.raises(EyasError) as refused:
        parse_prompt(record, "p:1", kinds)
    assert str(refused.value).startswith(message)


def test_parse_prompt_keeps_the_records_source() -> None:
    assert parse_prompt({"prompt": "hi", "source": "data.jsonl:7"}, "p:1") == Prompt("data.jsonl:7", prompt="hi")
    assert parse_prompt({"text": "raw"}, "p:2") == Prompt("p:2", text="raw")


@pytest.mark.parametrize(("configured", "expected_extra"), [([11, 12], {11, 12}), (11, {11}), (None, set())])
def test_eos_ids_hold_the_generation_config_and_the_tokenizer(weighted_target, configured: object,
                                                              expected_extra: set[int]) -> None:
    target = weighted_target("llama")
    tokenizer = load_tokenizer(target)
    parts = load_target(target, torch.float32, "cpu")
    parts.model.generation_config.eos_token_id = configured
    assert eos_ids(parts.model, tokenizer) == expected_extra | {tokenizer.eos_token_id}


def test_generate_kwargs_stop_at_every_eos_and_keep_greedy_greedy() -> None:
    greedy = generate_kwargs({7, 3}, 0.0, 0.9, 5)
    assert greedy == {"eos_token_id": [3, 7], "pad_token_id": 3, "do_sample": False, "temperature": None,
                      "top_p": None, "top_k": None}
    sampled = generate_kwargs({7}, 0.7, 0.9, 0, pad=1)
    assert sampled == {"eos_token_id": [7], "pad_token_id": 1, "do_sample": True, "temperature": 0.7, "top_p": 0.9,
                       "top_k": None}
    assert generate_kwargs(set(), 0.0, 1.0)["eos_token_id"] is None
