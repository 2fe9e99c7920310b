"""`eyas preflight` audits eyas's engine-facing modules against the installed transformers: clean
today, and a module calling an API the installed version lacks fails it (exit 1, the finding named)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eyas.audit import contract


def test_preflight_is_clean_and_names_what_it_audited(run_cli) -> None:
    result = run_cli("preflight")
    assert result.code == 0, result.out
    assert "engine API (transformers==" in result.out and "preflight ok" in result.out


def test_preflight_fails_on_a_broken_engine_call(run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "capture.py"
    broken.write_text("from transformers import TFAutoModelGone\nfrom transformers import DynamicCache\n\n"
                      "cache = DynamicCache()\ncache.no_such_method_anywhere()\n")
    monkeypatch.setattr(contract, "engine_modules", lambda: [broken])
    result = run_cli("preflight")
    assert result.code == 1
    assert f"engine API: {broken}:1: transformers.TFAutoModelGone cannot be imported" in result.out
    assert f"engine API: {broken}:5: DynamicCache has no attribute no_such_method_anywhere" in result.out
    assert "2 problem(s)" in result.out
