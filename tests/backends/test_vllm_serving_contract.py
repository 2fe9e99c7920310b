"""What eyas reads of vLLM's serving, tested without vLLM: its speculative-decoding counters, and the
one-line refusals of every vLLM verb where vLLM is not installed (exit 3 before any weight loads)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eyas.backends.vllm.contract import SERVING_MODULES, VLLM_PATHS, contract_files, installed_vllm
from eyas.backends.vllm.metrics import PREFIX, SpecCounters
from eyas.errors import EyasError

pytestmark = pytest.mark.skipif(installed_vllm() is not None, reason="these refusals are for a Python without vLLM")


def snapshot(drafts: int, accepted: int, per_position: list[int]) -> dict[str, float | list[float]]:
    return {PREFIX + "num_drafts": drafts, PREFIX + "num_draft_tokens": drafts * 3,
            PREFIX + "num_accepted_tokens": accepted, PREFIX + "num_accepted_tokens_per_pos": per_position,
            "vllm:prompt_tokens": 999}


def test_counters_give_eyas_tau_and_acceptance_over_the_timed_pass() -> None:
    before = SpecCounters.read(snapshot(4, 3, [3, 0, 0]), 3)  # the warm-up request
    after = SpecCounters.read(snapshot(104, 156, [83, 50, 23]), 3)
    timed = after.minus(before)
    assert (timed.drafts, timed.accepted, timed.per_position) == (100, 153, (80, 50, 23))
    assert timed.tau == pytest.approx(2.53) and timed.acceptance == pytest.approx([0.8, 0.5, 0.23])
    assert sum(timed.per_position) == timed.accepted  # a chain: position i accepted only after 0..i-1


def test_counters_not_yet_counted_are_zero_and_a_wrong_kind_is_refused() -> None:
    empty = SpecCounters.read({}, 4)
    assert empty.drafts == 0 and empty.tau == 0.0 and empty.acceptance == [0.0] * 4
    assert SpecCounters.read(snapshot(2, 1, [1]), 3).per_position == (1, 0, 0)
    with pytest.raises(EyasError, match="expected a counter"):
        SpecCounters.read({PREFIX + "num_drafts": [1.0]}, 3)


def test_every_path_audits_the_serving_modules_too() -> None:
    for path in VLLM_PATHS:
        names = [f.name for f in contract_files(path)]
        assert set(SERVING_MODULES) <= set(names) and len(names) == len(set(names))


@pytest.mark.parametrize("verb", ["eval", "regenerate"])
def test_vllm_verbs_refuse_in_one_line_where_vllm_is_missing(verb: str, tiny_targets, run_cli, tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    arguments = (["--draft", tmp_path, "--engine", "vllm", "--chain", "2"] if verb == "eval" else ["--backend", "vllm"])
    result = run_cli(verb, "--target", tiny_targets["chatml"], "--prompts", prompts, "--out", tmp_path / "out", *arguments)
    assert result.code == 3 and result.err.count("\n") == 1 and "make setup-vllm" in result.err, result.err
    assert not (tmp_path / "out").exists()


def test_the_demo_with_vllm_on_refuses_without_it_and_reroots_with_it(tmp_path: Path) -> None:
    from eyas.config import DemoConfig, PrepareConfig
    from eyas.demo.run import _vllm_engine, rerooted
    from eyas.errors import CannotRun

    with pytest.raises(CannotRun, match="demo.vllm: on: vLLM is not installed in this Python"):
        _vllm_engine(DemoConfig(out=tmp_path, vllm="on"))
    assert not _vllm_engine(DemoConfig(out=tmp_path)) and not _vllm_engine(DemoConfig(out=tmp_path, vllm="off"))
    config = PrepareConfig(target=Path("/models/t"), data=[Path("runs/demo/regenerated/c.jsonl"), Path("other.jsonl")],
                           out=Path("runs/demo/dataset"))
    moved = rerooted(config, Path("runs/demo"), Path("runs/demo-vllm"))
    assert moved.data == [Path("runs/demo-vllm/regenerated/c.jsonl"), Path("other.jsonl")]
    assert moved.out == Path("runs/demo-vllm/dataset") and moved.target == Path("/models/t")
