"""Record shapes detected per record, and the field each bad record is blamed on."""

from __future__ import annotations

import pytest

from eyas.data.records import Conversation, Document, Prompt, parse_record
from eyas.errors import InputError


def test_shapes_are_detected_per_record() -> None:
    sharegpt = parse_record("f:1", {"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q"},
                                                      {"from": "gpt", "value": "a"}]})
    assert isinstance(sharegpt, Conversation) and [m.role for m in sharegpt.messages] == ["system", "user", "assistant"]
    openai = parse_record("f:2", {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})
    assert isinstance(openai, Conversation) and openai.field == "messages"
    assert parse_record("f:3", {"text": "doc"}) == Document("f:3", "doc")
    assert parse_record("f:4", {"prompt": "p", "id": 7}) == Prompt("f:4", "p")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"messages": []}, "f:9: messages: empty conversation"),
        ({"messages": [{"role": "user", "content": "q"}]}, "f:9: messages: no assistant turn"),
        ({"messages": [{"role": "robot", "content": "q"}]}, "f:9: messages[0].role: unknown role 'robot'"),
        ({"messages": [{"role": "user", "content": 3}]}, "f:9: messages[0].content: expected a string, got int"),
        ({"messages": [{"role": "user", "content": None}]}, "f:9: messages[0].content: expected a string, got NoneType"),
        ({"messages": [{"role": "user"}]}, "f:9: messages[0].content: missing"),
        ({"conversations": [{"value": "q"}]}, "f:9: conversations[0].from: missing"),
        ({"conversations": "hi"}, "f:9: conversations: expected a list of turns, got str"),
        ({"conversations": ["hi"]}, "f:9: conversations[0]: expected an object, got str"),
        ({"text": ["a"]}, "f:9: text: expected a string, got list"),
        ({"text": "  "}, "f:9: text: empty document"),
        ({"prompt": ""}, "f:9: prompt: empty prompt"),
        ({"question": "q"}, "f:9: record: unrecognised shape (keys: question)"),
        ([1, 2], "f:9: record: expected a JSON object, got list"),
    ],
)
def test_bad_records_name_the_field(value: object, message: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_record("f:9", value)
    assert str(caught.value).startswith(message)
