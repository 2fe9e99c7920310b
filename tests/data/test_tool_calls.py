"""Tool-calling conversations and reasoning fields: rendered by the target's own template, tool calls and
reasoning in the loss, tool results out of it, checked against transformers' `{% generation %}` assistant
mask and against the template's own generation prompt (prefix by prefix)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import write_jsonl

from eyas.data.chat_tokens import ChatEncoder, Encoded
from eyas.data.records import parse_record
from eyas.errors import EyasError, InputError
from eyas.models.tokenizer import load_tokenizer

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"name": "get_time", "description": "Local time", "parameters": {"type": "object", "properties": {}}}


def call(name: str, arguments: Any, call_id: str | None = None) -> dict[str, Any]:
    return {"type": "function", **({"id": call_id} if call_id else {}), "function": {"name": name, "arguments": arguments}}


# one user question, a call (with reasoning, no content), its result, two parallel calls, their results, the
# answer; then a second question answered directly
TOOL_CHAT = {"tools": [WEATHER, CLOCK], "messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None, "reasoning_content": "I should call the weather tool.",
     "tool_calls": [call("get_weather", '{"city": "Paris"}', "call00001")]},
    {"role": "tool", "content": "18 degrees, sunny", "tool_call_id": "call00001", "name": "get_weather"},
    {"role": "assistant", "content": "Let me also check the time and Rome.",
     "tool_calls": [call("get_time", {}, "call00002"), call("get_weather", {"city": "Rome"}, "call00003")]},
    {"role": "tool", "content": "14:05", "tool_call_id": "call00002"},
    {"role": "tool", "content": "25 degrees, clear", "tool_call_id": "call00003"},
    {"role": "assistant", "content": "Paris: 18 degrees and sunny at 14:05. Rome: 25 degrees."},
    {"role": "user", "content": "Thanks!"},
    {"role": "assistant", "content": "You are welcome.", "thinking": "A short reply will do."},
]}
RESULTS = ("18 degrees, sunny", "14:05", "25 degrees, clear")


def encoder_for(target: Path, last_turn_only: bool = False) -> tuple[Any, ChatEncoder]:
    tokenizer = load_tokenizer(target)
    return tokenizer, ChatEncoder(tokenizer, {}, last_turn_only, str(target))


def encode(encoder: ChatEncoder, record: dict) -> Encoded:
    return encoder.encode([parse_record("t.jsonl:1", record)])[0]


def masked_text(tokenizer: Any, encoded: Encoded) -> list[str]:
    """Return the runs of loss-masked tokens, each decoded token by token."""
    runs: list[str] = []
    previous = False
    for token, masked in zip(encoded.input_ids.tolist(), encoded.loss_mask.tolist()):
        if masked:
            piece = tokenizer.decode([token])
            runs[-1:] = [runs[-1] + piece] if previous else [*runs[-1:], piece]
        previous = masked
    return runs


def transformers_assistant_mask(tokenizer: Any, record: dict) -> list[int]:
    """The oracle: transformers' assistant mask from the template's `{% generation %}` markers."""
    conversation = parse_record("t.jsonl:1", record)
    out = tokenizer.apply_chat_template([m.template_dict() for m in conversation.messages],
                                        tools=list(conversation.tools) or None, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
    return list(out["assistant_masks"])


def test_tool_calls_and_reasoning_are_trained_and_tool_results_are_not(tiny_targets: dict[str, Path]) -> None:
    tokenizer, encoder = encoder_for(tiny_targets["hermes"])
    encoded = encode(encoder, TOOL_CHAT)
    assert masked_text(tokenizer, encoded) == [  # the template keeps reasoning after the last user turn only
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
        'Let me also check the time and Rome.\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>',
        "Paris: 18 degrees and sunny at 14:05. Rome: 25 degrees.<|im_end|>",
        "<think>\nA short reply will do.\n</think>\n\nYou are welcome.<|im_end|>",
    ]
    text = tokenizer.decode(encoded.input_ids.tolist())
    assert all(result in text for result in RESULTS) and '"name": "get_time"' in text  # rendered, tools listed
    assert encoded.unrendered_reasoning  # the first call's reasoning, dropped from history by the template


def conversations() -> list[dict]:
    """Tool-calling conversations of several shapes, for the oracle comparisons."""
    plain = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}
    offered_not_called = {"tools": [WEATHER], **plain}
    chained = {"tools": json.dumps([WEATHER]), "messages": [
        {"role": "user", "content": "Weather in Oslo, then in Bergen?"},
        {"role": "assistant", "tool_calls": [call("get_weather", '{"city": "Oslo"}')]},
        {"role": "tool", "content": "-3 degrees"},
        {"role": "assistant", "content": "", "reasoning": "Now Bergen.", "tool_calls": [call("get_weather", {"city": "Bergen"})]},
        {"role": "tool", "content": "4 degrees, rain"},
        {"role": "assistant", "content": "Oslo -3, Bergen 4 and rain."},
    ]}
    bare_calls = {"tools": [CLOCK], "messages": [
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [{"name": "get_time", "arguments": ""}]},
        {"role": "tool", "content": "09:00", "name": "get_time"},
        {"role": "assistant", "content": "It is nine."},
    ]}
    one_question = {"tools": TOOL_CHAT["tools"], "messages": TOOL_CHAT["messages"][:-2]}
    return [TOOL_CHAT, plain, offered_not_called, chained, bare_calls, one_question]


@pytest.mark.parametrize("index", range(6))
def test_the_loss_mask_equals_transformers_generation_mask(tiny_targets: dict[str, Path], index: int) -> None:
    record = conversations()[index]
    tokenizer, encoder = encoder_for(tiny_targets["hermes"])
    encoded = encode(encoder, record)
    oracle = transformers_assistant_mask(tokenizer, record)
    assert encoded.loss_mask.astype(int).tolist() == oracle and sum(oracle) > 0


@pytest.mark.parametrize("index", range(1, 6))
def test_every_trained_turn_starts_where_the_generation_prompt_ends(tiny_targets: dict[str, Path], index: int) -> None:
    """Prefix by prefix: rendering the turns before an assistant turn with the generation prompt gives the text
    the server sends, so the turn's span (what the model writes) starts exactly where that text ends. (Not for
    TOOL_CHAT: its template drops reasoning from turns before a later user turn, so no prefix renders alike.)"""
    record = conversations()[index]
    tokenizer, encoder = encoder_for(tiny_targets["hermes"])
    conversation = parse_record("t.jsonl:1", record)
    text = encoder.render([conversation])[0]
    messages = [m.template_dict() for m in conversation.messages]
    prompts = [tokenizer.apply_chat_template(messages[:i], tools=list(conversation.tools) or None, tokenize=False,
                                             add_generation_prompt=True)
               for i, m in enumerate(messages) if m["role"] == "assistant"]
    spans = encoder.assistant_spans(conversation, text)
    assert len(spans) == len(prompts)
    for (start, _), prompt in zip(spans, prompts):
        assert text.startswith(prompt) and start == len(prompt)


def test_string_and_object_arguments_render_the_same_tokens(tiny_targets: dict[str, Path]) -> None:
    _, encoder = encoder_for(tiny_targets["hermes"])
    as_text = {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Paris?"}, {"role": "assistant", "tool_calls": [call("get_weather", '{"city":"Paris"}')]},
        {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "Sunny."}]}
    as_object = json.loads(json.dumps(as_text))
    as_object["messages"][1]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}
    a, b = encode(encoder, as_text), encode(encoder, as_object)
    assert a.input_ids.tolist() == b.input_ids.tolist() and a.loss_mask.tolist() == b.loss_mask.tolist()


# test-local templates of two other families, with `{% generation %}` markers as the oracle:
# Llama-3.1-like (a call ends with <|eom_id|>, results in an `ipython` turn) and Mistral-like (no header after
# a tool result, `[/INST]` before a call but `[/INST] ` before an answer)
LLAMA_LIKE = (
    "{{- bos_token }}{%- if tools %}{{- '<|start_header_id|>system<|end_header_id|>\\n\\nTools:' }}"
    "{%- for t in tools %}{{- ' ' + (t | tojson) }}{%- endfor %}{{- '<|eot_id|>' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- generation %}"
    "{%- if m.tool_calls %}{%- for c in m.tool_calls %}{{- '{\"name\": \"' + c.function.name + '\", \"parameters\": '"
    " + (c.function.arguments | tojson) + '}' }}{%- endfor %}{{- '<|eom_id|>' }}"
    "{%- else %}{{- m.content + '<|eot_id|>' }}{%- endif %}{%- endgeneration %}"
    "{%- elif m.role == 'tool' %}{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' }}"
    "{%- else %}{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
MISTRAL_LIKE = (
    "{{- bos_token }}{%- if tools %}{{- '[AVAILABLE_TOOLS]' + (tools | tojson) + '[/AVAILABLE_TOOLS]' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}{{- '[INST] ' + m.content + ' [/INST]' }}"
    "{%- elif m.role == 'assistant' and m.tool_calls %}{%- generation %}{{- '[TOOL_CALLS]' }}"
    "{{- m.tool_calls | map(attribute='function') | list | tojson }}{{- '</s>' }}{%- endgeneration %}"
    "{%- elif m.role == 'assistant' %}{%- generation %}{{- ' ' + m.content + '</s>' }}{%- endgeneration %}"
    "{%- elif m.role == 'tool' %}{{- '[TOOL_RESULTS]{\"call_id\": \"' + m.tool_call_id + '\", \"content\": '"
    " + (m.content | tojson) + '}[/TOOL_RESULTS]' }}"
    "{%- endif %}{%- endfor %}"
)
FAMILIES = {
    "llama": ("llama3", LLAMA_LIKE, ["<|eom_id|>"]),
    "mistral": ("mistral", MISTRAL_LIKE, ["[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[TOOL_RESULTS]",
                                          "[/TOOL_RESULTS]", "[INST]", "[/INST]"]),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_other_template_families_match_their_generation_mask(tiny_targets: dict[str, Path], family: str) -> None:
    style, template, specials = FAMILIES[family]
    tokenizer = load_tokenizer(tiny_targets[style])
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    tokenizer.chat_template = template
    encoder = ChatEncoder(tokenizer, {}, False, family)
    record = {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Paris"}, "call00001")]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "And Rome?"},
        {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Rome"}, "call00002")]},
        {"role": "tool", "content": "clear", "tool_call_id": "call00002"},
        {"role": "assistant", "content": "Clear."},
    ]}
    encoded = encode(encoder, record)
    assert encoded.loss_mask.astype(int).tolist() == transformers_assistant_mask(tokenizer, record)
    masked = "".join(masked_text(tokenizer, encoded))
    assert "sunny" in masked and "clear" not in masked.replace("Clear", "")  # the answer, not the tool result


def test_reasoning_a_template_ignores_is_counted_not_silently_dropped(tiny_targets: dict[str, Path]) -> None:
    record = {"messages": [{"role": "user", "content": "Sky?"},
                           {"role": "assistant", "content": "Blue.", "reasoning_content": "Rayleigh scattering."}]}
    tokenizer, encoder = encoder_for(tiny_targets["qwen3"])  # reads <think> from the content, not the field
    ignored = encode(encoder, record)
    assert ignored.unrendered_reasoning and "Rayleigh" not in tokenizer.decode(ignored.input_ids.tolist())
    tokenizer, encoder = encoder_for(tiny_targets["hermes"])
    rendered = encode(encoder, record)
    assert not rendered.unrendered_reasoning and "Rayleigh scattering." in "".join(masked_text(tokenizer, rendered))


def test_reasoning_the_template_drops_from_history_counts_only_when_trained(tiny_targets: dict[str, Path]) -> None:
    record = {"messages": [{"role": "user", "content": "One?"},
                           {"role": "assistant", "content": "1.", "reasoning_content": "Count once."},
                           {"role": "user", "content": "Two?"}, {"role": "assistant", "content": "2."}]}
    _, every_turn = encoder_for(tiny_targets["hermes"])
    _, last_turn = encoder_for(tiny_targets["hermes"], last_turn_only=True)
    assert encode(every_turn, record).unrendered_reasoning  # the template keeps reasoning after the last user turn only
    assert not encode(last_turn, record).unrendered_reasoning


def test_a_template_that_cannot_render_tool_calls_stops_naming_the_turn(tiny_targets: dict[str, Path]) -> None:
    _, encoder = encoder_for(tiny_targets["chatml"])  # renders role and content only
    with pytest.raises(EyasError, match=r"^t.jsonl:1: messages\[2\].tool_calls: the chat template of .* does not "
                                        r"render tool calls and tool results") as caught:
        encode(encoder, TOOL_CHAT)
    assert not isinstance(caught.value, InputError)  # a target-level problem: --skip-invalid does not skip it


@pytest.mark.parametrize(("value", "message"), [
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"type": "function", "function": {}}]}]},
     "f:12: messages[1].tool_calls[0].function.name: missing"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [call("f", "{city: 1}")]}]},
     "f:12: messages[1].tool_calls[0].function.arguments: malformed JSON: Expecting property name"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [call("f", "[1]")]}]},
     "f:12: messages[1].tool_calls[0].function.arguments: expected a JSON object, got list"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"type": "code", "function": {"name": "f"}}]}]},
     "f:12: messages[1].tool_calls[0].type: unsupported tool call type 'code'"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": {"name": "f"}}]},
     "f:12: messages[1].tool_calls: expected a list of tool calls, got dict"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": ["f"]}]},
     "f:12: messages[1].tool_calls[0]: expected an object, got str"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None}]},
     "f:12: messages[1].content: expected a string, got NoneType"),
    ({"messages": [{"role": "user", "content": "q", "tool_calls": [call("f", {})]}, {"role": "assistant", "content": "a"}]},
     "f:12: messages[0].tool_calls: only assistant turns have tool_calls"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "x", "thinking": "y"}]},
     "f:12: messages[1]: reasoning_content and thinking differ"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "thinking": 3}]},
     "f:12: messages[1].thinking: expected a string, got int"),
    ({"messages": [{"role": "tool", "content": {"temp": 3}}, {"role": "assistant", "content": "a"}]},
     "f:12: messages[0].content: expected a string, got dict"),
    ({"messages": [{"role": "tool", "content": "r", "tool_call_id": 7}, {"role": "assistant", "content": "a"}]},
     "f:12: messages[0].tool_call_id: expected a string, got int"),
    ({"tools": {"name": "f"}, "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
     "f:12: tools: expected a list of function specs, got dict"),
    ({"tools": "[{]", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
     "f:12: tools: malformed JSON"),
    ({"tools": [{"type": "function", "function": {"description": "d"}}], "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
     "f:12: tools[0].function.name: missing"),
    ({"tools": [WEATHER], "text": "a document"}, "f:12: tools: only conversations (messages, conversations) take tools"),
])
def test_bad_tool_records_name_file_record_and_field(value: dict, message: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_record("f:12", value)
    assert str(caught.value).startswith(message)


def test_prepare_trains_tool_calls_from_parquet_and_counts_unrendered_reasoning(tiny_targets, run_cli, tmp_path: Path) -> None:
    """The CLI end to end: a tool-calling record and a reasoning record on a target that renders tools but (the
    qwen3 style) ignores `reasoning_content`: the tool conversation is refused there, so it runs on hermes."""
    import pyarrow as pa

    rows = [{"tools": json.dumps([WEATHER]), "messages": json.loads(json.dumps(conversations()[3]["messages"]))}]
    for row in rows:  # a JSON-string arguments column, as datasets store tool calls
        for message in row["messages"]:
            for tool_call in message.get("tool_calls") or []:
                arguments = tool_call["function"]["arguments"]
                tool_call["function"]["arguments"] = arguments if isinstance(arguments, str) else json.dumps(arguments)
    data = tmp_path / "tools.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    jsonl = write_jsonl(tmp_path / "tools.jsonl", [conversations()[3]])
    outs = {}
    for name, path in (("parquet", data), ("jsonl", jsonl)):
        outs[name] = tmp_path / name
        result = run_cli("prepare", "--target", tiny_targets["hermes"], "--data", path, "--out", outs[name])
        assert result.code == 0, result.err
    a, b = (pq.read_table(next(out.glob("data-*.parquet"))).to_pylist() for out in outs.values())
    assert a[0]["source"] == f"{data}:row0"
    assert a[0]["input_ids"] == b[0]["input_ids"] and a[0]["loss_mask"] == b[0]["loss_mask"] and sum(a[0]["loss_mask"]) > 0
    reasoning = write_jsonl(tmp_path / "r.jsonl", [{"messages": [
        {"role": "user", "content": "Sky?"}, {"role": "assistant", "content": "Blue.", "reasoning_content": "Scattering."}]}])
    result = run_cli("prepare", "--target", tiny_targets["qwen3"], "--data", reasoning, "--out", tmp_path / "q")
    assert result.code == 0, result.err
    assert json.loads((tmp_path / "q" / "manifest.json").read_text())["counts"]["reasoning_not_rendered"] == 1
    assert "reasoning not rendered by the chat template" in result.out
    refused = run_cli("prepare", "--target", tiny_targets["chatml"], "--data", jsonl, "--out", tmp_path / "c", "--skip-invalid")
    assert refused.code == 2 and f"{jsonl}:1: messages[1].tool_calls: the chat template of" in refused.err
    assert len(refused.err.strip().splitlines()) == 1


def test_encoded_masks_are_bool_and_aligned(tiny_targets: dict[str, Path]) -> None:
    _, encoder = encoder_for(tiny_targets["hermes"])
    encoded = encode(encoder, TOOL_CHAT)
    assert encoded.loss_mask.dtype == bool and encoded.input_ids.dtype == np.int32
    assert encoded.loss_mask.shape == encoded.input_ids.shape
