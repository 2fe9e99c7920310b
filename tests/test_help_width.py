"""`eyas VERB --help` at 80 columns names every flag in full (rich's tables cut them: `--trust-remote-co…`)."""

from __future__ import annotations

import pytest

from eyas.config import ExtractConfig, PrepareConfig


@pytest.mark.parametrize(("verb", "config_class"), [("prepare", PrepareConfig), ("extract", ExtractConfig)])
def test_every_flag_is_named_in_full_at_80_columns(verb: str, config_class, run_cli, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    result = run_cli(verb, "--help")
    assert result.code == 0 and "…" not in result.out
    assert max(map(len, result.out.splitlines())) <= 80
    for name in config_class.model_fields:
        assert f"--{name.replace('_', '-')}" in result.out
    assert "GGUF" in result.out  # --target takes a .gguf file too
