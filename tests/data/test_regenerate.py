"""`eyas regenerate`: the target answers prompts in token-budget batches; the output feeds `eyas prepare`;
a killed run ends with the same file as an uninterrupted one; bad records stop the run (file:line) or,
with --skip-invalid, are listed in rejected.jsonl; a prepared dataset's prompts can be the input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import write_jsonl

from eyas.config import PrepareConfig
from eyas.data.prepare import run_prepare

PROMPTS = [{"prompt": "The quick brown fox"}, {"messages": [{"role": "user", "content": "Write a short poem"}]},
           {"prompt": "Explain why the sky is blue"}, {"prompt": "def add(a, b):"}, {"prompt": "Hello!"}]


def args(target: Path, prompts: Path, out: Path, *extra: str) -> list[str | Path]:
    return ["regenerate", "--target", target, "--prompts", prompts, "--out", out, "--max-new-tokens", "8",
            "--token-budget", "80", "--device", "cpu", "regenerate.dtype=float32", *extra]


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_answers_feed_prepare_and_a_killed_run_ends_the_same(weighted_target, run_cli, tmp_path: Path) -> None:
    target = weighted_target("llama")
    prompts = write_jsonl(tmp_path / "prompts.jsonl", PROMPTS)
    out = tmp_path / "regen"
    result = run_cli(*args(target, prompts, out))
    assert result.code == 0, result.err
    assert "5 prompts answered" in result.out
    written = lines(out / "conversations.jsonl")
    assert [c["source"] for c in written] == [f"{prompts}:{i}" for i in range(1, 6)]
    assert all(c["messages"][-1]["role"] == "assistant" and c["finish"] in ("eos", "length") for c in written)
    assert written[1]["messages"][0] == {"role": "user", "content": "Write a short poem"}
    manifest = run_prepare(PrepareConfig(target=target, data=[out / "conversations.jsonl"], out=tmp_path / "ds"))[0]
    assert manifest.counts["rows"] == 5

    complete = (out / "conversations.jsonl").read_text()
    first_batch = complete.splitlines(keepends=True)[:1]
    (out / "conversations.jsonl").write_text("".join(first_batch) + '{"messages": [{"role": "us')  # killed mid-batch
    again = run_cli(*args(target, prompts, out))
    assert again.code == 0, again.err
    assert (out / "conversations.jsonl").read_text() == complete  # seeds per planned batch: same answers
    reused = run_cli(*args(target, prompts, out))
    assert reused.code == 0 and "already done; reused" in reused.out


def test_bad_records_stop_the_run_or_are_listed(weighted_target, run_cli, tmp_path: Path) -> None:
    target = weighted_target("llama")
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [PROMPTS[0], "{oops", {"text": "raw"}, PROMPTS[2],
                                                       {"messages": [{"role": "assistant", "content": "hi"}]}])
    stopped = run_cli(*args(target, prompts, tmp_path / "a"))
    assert stopped.code == 2 and f"{prompts}:2: not JSON" in stopped.err and stopped.err.count("\n") == 1
    skipped = run_cli(*args(target, prompts, tmp_path / "b", "--skip-invalid"))
    assert skipped.code == 0, skipped.err
    assert "2 prompts answered" in skipped.out and "3 bad record(s) listed in rejected.jsonl" in skipped.out
    rejected = lines(tmp_path / "b" / "rejected.jsonl")
    assert [r["where"] for r in rejected] == [f"{prompts}:2", f"{prompts}:3", f"{prompts}:5"]
    assert "expected exactly one of the fields prompt, messages" in rejected[1]["reason"]
    assert "the last message must be the user's" in rejected[2]["reason"]


def test_a_prepared_datasets_prompts_are_answered(weighted_target, run_cli, tmp_path: Path) -> None:
    target = weighted_target("llama")
    data = write_jsonl(tmp_path / "mixed.jsonl", [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
        {"prompt": "Only a prompt"}])
    run_prepare(PrepareConfig(target=target, data=[data], out=tmp_path / "ds"))
    result = run_cli(*args(target, tmp_path / "ds", tmp_path / "regen"))
    assert result.code == 0, result.err
    assert [c["messages"][0]["content"] for c in lines(tmp_path / "regen" / "conversations.jsonl")] == ["Only a prompt"]


@pytest.mark.parametrize("missing", ["nothing-here.jsonl", "empty-dir"])
def test_missing_prompts_are_refused(weighted_target, run_cli, tmp_path: Path, missing: str) -> None:
    (tmp_path / "empty-dir").mkdir()
    result = run_cli(*args(weighted_target("llama"), tmp_path / missing, tmp_path / "out"))
    assert result.code == 2 and result.err.count("\n") == 1
