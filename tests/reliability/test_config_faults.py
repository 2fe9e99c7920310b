"""Faulty `--config` files (probe of 2026-12, F3 F16): a key or section given twice, a file that is not
UTF-8, an integer Python cannot convert: one line naming the file (and line and key), exit 2, and nothing
run; a YAML merge key may still be overridden."""

from __future__ import annotations

from pathlib import Path

import pytest

from eyas.config import load_yaml


def one_line(err: str) -> str:
    """Return the one line `err` holds (asserting it is one line and no traceback)."""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(("text", "line", "key", "first"), [
    ("prepare:\n  target: {target}\n  max_length: 64\nprepare:\n  out: {out}\n", 4, "prepare", 1),
    ("prepare:\n  target: {target}\n  out: {out}\n  max_length: 64\n  max_length: 32\n", 5, "max_length", 4),
    ("prepare:\n  target: {target}\n  out: {out}\n  chat_template_kwargs: {{a: 1, a: 2}}\n", 4, "a", 4),
])
def test_a_key_given_twice_is_refused_naming_file_line_and_key(tiny_targets, run_cli, tmp_path: Path, text: str,
                                                               line: int, key: str, first: int) -> None:
    config = tmp_path / "dup.yaml"
    config.write_text(text.format(target=tiny_targets["chatml"], out=tmp_path / "ds"))
    result = run_cli("prepare", "--config", config, "--data", tmp_path / "in.jsonl")
    assert result.code == 2
    assert one_line(result.err) == f"eyas: error: {config}:{line}: invalid YAML: duplicate key {key!r} (first on line {first})\n"
    assert not (tmp_path / "ds").exists()


def test_a_key_given_twice_in_an_override_is_refused(tiny_targets, run_cli, tmp_path: Path) -> None:
    override = "prepare.chat_template_kwargs={enable_thinking: false, enable_thinking: true}"
    result = run_cli("prepare", "--target", tiny_targets["chatml"], "--data", tmp_path / "in.jsonl", "--out",
                     tmp_path / "ds", override)
    assert result.code == 2
    assert one_line(result.err) == f"eyas: error: override {override!r}: duplicate key 'enable_thinking'\n"


def test_a_merge_key_may_be_overridden() -> None:
    assert load_yaml("base: &b {x: 1, y: 2}\nprepare:\n  <<: *b\n  x: 3\n") == {"base": {"x": 1, "y": 2},
                                                                             "prepare": {"x": 3, "y": 2}}


def test_a_config_that_is_not_utf8_is_refused_in_one_line(tiny_targets, run_cli, tmp_path: Path) -> None:
    config = tmp_path / "latin1.yaml"
    config.write_bytes(b"# r\xe9glages\nprepare:\n  max_length: 64\n")
    result = run_cli("prepare", "--config", config, "--target", tiny_targets["chatml"], "--data",
                     tmp_path / "in.jsonl", "--out", tmp_path / "ds")
    assert result.code == 2
    assert one_line(result.err).startswith(f"eyas: error: {config}: cannot read it: not UTF-8 text (byte 0xe9 ")
    assert not (tmp_path / "ds").exists()


def test_an_integer_python_cannot_convert_is_refused_naming_its_line(run_cli, tmp_path: Path) -> None:
    config = tmp_path / "long.yaml"
    config.write_text("prepare:\n  max_length: " + "9" * 5000 + "\n")
    result = run_cli("prepare", "--config", config)
    assert result.code == 2
    assert one_line(result.err) == f"eyas: error: {config}:2: invalid YAML: an integer of more than 4300 digits\n"
