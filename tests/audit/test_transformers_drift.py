"""Real-world drift: a client module written against transformers 4.57.x, audited against 5.x
(both wheels come from the package index: `pip download --no-deps`, read as source, never imported),
with the findings pinned — and nothing else reported. Also: eyas's own engine-facing modules audit
clean against the installed transformers (what `eyas preflight` runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eyas.audit.contract import engine_api_problems
from eyas.audit.run import run_audit

BASELINE, TARGET = "transformers==4.57.6", "transformers==5.18.0"

CLIENT = '''\
from transformers import DynamicCache, TFAutoModel  # <- tf
from transformers.cache_utils import DynamicCache as Cache
from transformers.tokenization_utils_base import PreTrainedTokenizerBase


def legacy(past):
    return DynamicCache.from_legacy_cache(past)  # <- legacy


def trim(cache: Cache, n: int):
    cache.crop(max_length=n)  # <- crop
    seen = cache.get_seq_length()
    return cache.to_legacy_cache(), seen  # <- to_legacy


def encode(tokenizer: PreTrainedTokenizerBase, texts: list[str]):
    single = tokenizer(texts[0])
    return single, tokenizer.decode([1, 2], skip_special_tokens=True)
'''


def line_of(marker: str) -> int:
    return next(i for i, line in enumerate(CLIENT.splitlines(), 1) if line.endswith(f"# <- {marker}"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("eyas-cache")


def test_client_written_for_4_57_against_5_x(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EYAS_CACHE", str(cache))
    client = tmp_path / "client.py"
    client.write_text(CLIENT)
    result = run_audit([client], TARGET, BASELINE)
    got = {(f.kind, f.symbol, f.line, f.severity) for f in result.findings}
    assert got == {
        ("unresolved-import", "transformers.TFAutoModel", line_of("tf"), "error"),
        ("missing-attribute", "transformers.DynamicCache.from_legacy_cache", line_of("legacy"), "error"),
        ("call-mismatch", "transformers.cache_utils.DynamicCache.crop", line_of("crop"), "error"),
        ("missing-attribute", "transformers.cache_utils.DynamicCache.to_legacy_cache", line_of("to_legacy"), "error"),
    }
    crop = next(f for f in result.findings if f.kind == "call-mismatch")
    assert "unexpected keyword argument 'max_length'" in crop.message
    assert crop.baseline_signature == "crop(self, max_length: int)"
    assert crop.target_signature == "crop(self, tokens_to_remove: int) -> None"
    assert result.summary["against"] == TARGET and result.summary["baseline"] == BASELINE


def test_the_same_client_is_clean_against_its_own_version(cache: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EYAS_CACHE", str(cache))
    client = tmp_path / "client.py"
    client.write_text(CLIENT)
    assert run_audit([client], BASELINE).findings == []


def test_eyas_engine_contract_is_clean_against_the_installed_transformers() -> None:
    problems, facts = engine_api_problems()
    assert problems == []
    assert any(key.startswith("engine API (transformers==") for key in facts)


@pytest.mark.slow
def test_peft_0_17_1_against_transformers_5(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real project's published source (peft 0.17.1, ~41k lines, from PyPI) against two real transformers
    releases: the three breaks that make it fail on 5.x, and none of its version-gated compatibility code."""
    import subprocess
    import sys
    import zipfile

    monkeypatch.setenv("EYAS_CACHE", str(cache))
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(tmp_path), "peft==0.17.1"],
                   check=True)
    with zipfile.ZipFile(next(tmp_path.glob("peft-0.17.1-*.whl"))) as wheel:
        wheel.extractall(tmp_path / "peft-src")
    result = run_audit([tmp_path / "peft-src" / "peft"], TARGET, BASELINE)
    got = {(f.kind, f.symbol, Path(f.path).name) for f in result.findings}
    assert got == {
        ("unresolved-import", "transformers.HybridCache", "peft_model.py"),
        ("missing-attribute", "transformers.DynamicCache.from_legacy_cache", "peft_model.py"),
        ("missing-attribute", "transformers.EncoderDecoderCache.from_legacy_cache", "peft_model.py"),
    }
    assert result.summary["files"] > 150
    alone = run_audit([tmp_path / "peft-src" / "peft"], TARGET)  # no baseline: the same errors, no more
    assert {(f.kind, f.symbol, Path(f.path).name) for f in alone.findings} == got
