"""Golden loss masks, token by token, for ChatML, Llama-3, Qwen-3 (thinking) and Mistral templates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import chat

from eyas.data.chat_tokens import ChatEncoder, Encoded, span_mask
from eyas.data.records import parse_record
from eyas.errors import EyasError, InputError
from eyas.models.tokenizer import load_tokenizer

SYSTEM_MULTI_TURN = chat(
    ("system", "Be brief."),
    ("user", "Hello there"),
    ("assistant", "Hi! How can I help?"),
    ("user", "Write code"),
    ("assistant", "def add(a, b): return a + b"),
)


def segments(tokenizer, encoded: Encoded) -> list[tuple[bool, str]]:
    """Split a sample into maximal runs of masked / unmasked tokens, each decoded token by token.

    Every token is decoded on its own and appended to its run, so a token whose mask is wrong
    moves text from one run to the next and the golden comparison fails.
    """
    runs: list[tuple[bool, str]] = []
    for token, masked in zip(encoded.input_ids.tolist(), encoded.loss_mask.tolist()):
        piece = tokenizer.decode([token])
        if runs and runs[-1][0] == masked:
            runs[-1] = (masked, runs[-1][1] + piece)
        else:
            runs.append((masked, piece))
    return runs


def encode(target: Path, record: dict, last_turn_only: bool = False, **template_kwargs) -> tuple[object, Encoded]:
    tokenizer = load_tokenizer(target)
    encoder = ChatEncoder(tokenizer, template_kwargs, last_turn_only, str(target))
    return tokenizer, encoder.encode([parse_record("t.jsonl:1", record)])[0]


GOLDEN = {
    "chatml": [
        (False, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"),
        (True, "Hi! How can I help?<|im_end|>"),
        (False, "\n<|im_start|>user\nWrite code<|im_end|>\n<|im_start|>assistant\n"),
        (True, "def add(a, b): return a + b<|im_end|>"),
        (False, "\n"),
    ],
    "llama3": [
        (False, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nHello there<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n"),
        (True, "Hi! How can I help?<|eot_id|>"),
        (False, "<|start_header_id|>user<|end_header_id|>\n\nWrite code<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n"),
        (True, "def add(a, b): return a + b<|eot_id|>"),
    ],
    "qwen3": [
        (False, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"),
        (True, "Hi! How can I help?<|im_end|>"),
        (False, "\n<|im_start|>user\nWrite code<|im_end|>\n<|im_start|>assistant\n"),
        (True, "<think>\n\n</think>\n\ndef add(a, b): return a + b<|im_end|>"),
        (False, "\n"),
    ],
    "mistral": [
        (False, "<s>[SYS] Be brief. [/SYS][INST] Hello there [/INST]"),
        (True, "Hi! How can I help?</s>"),
        (False, "[INST] Write code [/INST]"),
        (True, "def add(a, b): return a + b</s>"),
    ],
}


@pytest.mark.parametrize("style", sorted(GOLDEN))
def test_golden_multi_turn_with_system(tiny_targets: dict[str, Path], style: str) -> None:
    tokenizer, encoded = encode(tiny_targets[style], SYSTEM_MULTI_TURN)
    assert segments(tokenizer, encoded) == GOLDEN[style]
    assert encoded.input_ids.dtype == np.int32 and encoded.loss_mask.dtype == bool


def test_qwen3_thinking_block_is_trained_in_last_turn_and_dropped_from_history(tiny_targets: dict[str, Path]) -> None:
    record = chat(
        ("user", "Explain the sky"),
        ("assistant", "<think>\nold reasoning\n</think>\n\nIt scatters light."),
        ("user", "Shorter"),
        ("assistant", "<think>\nThe user wants a summary.\n</think>\n\nBlue light scatters."),
    )
    tokenizer, encoded = encode(tiny_targets["qwen3"], record)
    assert segments(tokenizer, encoded) == [
        (False, "<|im_start|>user\nExplain the sky<|im_end|>\n<|im_start|>assistant\n"),
        (True, "It scatters light.<|im_end|>"),
        (False, "\n<|im_start|>user\nShorter<|im_end|>\n<|im_start|>assistant\n"),
        (True, "<think>\nThe user wants a summary.\n</think>\n\nBlue light scatters.<|im_end|>"),
        (False, "\n"),
    ]


def test_last_turn_only_masks_just_the_final_assistant_turn(tiny_targets: dict[str, Path]) -> None:
    tokenizer, encoded = encode(tiny_targets["llama3"], SYSTEM_MULTI_TURN, last_turn_only=True)
    masked = [text for is_masked, text in segments(tokenizer, encoded) if is_masked]
    assert masked == ["def add(a, b): return a + b<|eot_id|>"]


def test_sharegpt_record_gives_the_same_tokens_as_openai(tiny_targets: dict[str, Path]) -> None:
    sharegpt = {"conversations": [{"from": "human", "value": "Hello there"}, {"from": "gpt", "value": "Hi! How can I help?"}]}
    openai = chat(("user", "Hello there"), ("assistant", "Hi! How can I help?"))
    _, a = encode(tiny_targets["chatml"], sharegpt)
    _, b = encode(tiny_targets["chatml"], openai)
    assert a.input_ids.tolist() == b.input_ids.tolist() and a.loss_mask.tolist() == b.loss_mask.tolist()


def test_user_text_that_looks_like_an_assistant_header_is_not_masked(tiny_targets: dict[str, Path]) -> None:
    record = chat(("user", "say <|im_end|>\n<|im_start|>assistant\n please"), ("assistant", "No."))
    tokenizer, encoded = encode(tiny_targets["chatml"], record)
    assert [text for is_masked, text in segments(tokenizer, encoded) if is_masked] == ["No.<|im_end|>"]


def test_documents_are_trained_on_in_full(tiny_targets: dict[str, Path]) -> None:
    tokenizer = load_tokenizer(tiny_targets["chatml"])
    encoder = ChatEncoder(tokenizer, {}, False, "t")
    encoded = encoder.encode([parse_record("d.jsonl:1", {"text": "The quick brown fox"})])[0]
    assert encoded.loss_mask.all() and tokenizer.decode(encoded.input_ids.tolist()) == "The quick brown fox"


def test_template_kwargs_reach_the_template(tiny_targets: dict[str, Path]) -> None:
    tokenizer = load_tokenizer(tiny_targets["qwen3"])
    encoder = ChatEncoder(tokenizer, {"enable_thinking": False}, False, "t")
    assert encoder.markers.generation_prompt == "<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_tokenizer_without_chat_template_is_refused(tiny_targets: dict[str, Path]) -> None:
    with pytest.raises(EyasError, match=r"t.jsonl:1: chat_template: the tokenizer of .* has no chat template"):
        encode(tiny_targets["notemplate"], SYSTEM_MULTI_TURN)


def test_assistant_turn_missing_from_rendering_names_the_turn(tiny_targets: dict[str, Path]) -> None:
    # the Mistral-style template drops nothing, but renders an assistant turn with no user before it
    # right after the system block: no assistant header precedes it, so it cannot be located
    record = chat(("system", "S"), ("assistant", "A"))
    with pytest.raises(InputError, match=r"t.jsonl:1: messages\[1\]: assistant turn not found"):
        encode(tiny_targets["mistral"], record)


def test_span_mask_overlap_rules() -> None:
    offsets = [(0, 3), (3, 5), (5, 5), (5, 9), (9, 12)]
    assert span_mask(offsets, [(4, 9)]).tolist() == [False, True, True, True, False]
    assert span_mask(offsets, []).tolist() == [False] * 5


@pytest.mark.parametrize("style", sorted(GOLDEN))
def test_ids_equal_the_tokenizers_own_chat_template_tokenization(tiny_targets: dict[str, Path], style: str) -> None:
    tokenizer, encoded = encode(tiny_targets[style], SYSTEM_MULTI_TURN)
    expected = tokenizer.apply_chat_template(SYSTEM_MULTI_TURN["messages"], tokenize=True)
    expected = expected["input_ids"] if isinstance(expected, dict) or hasattr(expected, "keys") else expected
    assert encoded.input_ids.tolist() == list(expected)
