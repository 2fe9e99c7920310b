"""`eyas prepare` through the CLI: outputs, provenance, vocabulary, bad input, skip counts, reuse."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import chat, write_jsonl
from safetensors.numpy import load_file

GOOD = [
    chat(("system", "Be brief."), ("user", "Hello there"), ("assistant", "Hi! How can I help?")),
    {"conversations": [{"from": "human", "value": "Write code"}, {"from": "gpt", "value": "def add(a, b): return a + b"}]},
    {"text": "The quick brown fox jumps over the lazy dog."},
    {"prompt": "Write a short poem about the sea."},
]


def prepare_args(target: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return ["prepare", "--target", str(target), "--data", str(data), "--out", str(out), *extra]


def read_rows(out: Path) -> list[dict]:
    rows = []
    for shard in sorted(out.glob("data-*.parquet")):
        rows.extend(pq.read_table(shard).to_pylist())
    return rows


def test_prepare_writes_rows_prompts_counts_vocab_and_manifest(tiny_targets, run_cli, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "in.jsonl", GOOD)
    out = tmp_path / "ds"
    result = run_cli(*prepare_args(tiny_targets["chatml"], data, out, "--draft-vocab-size", "40"))
    assert result.code == 0, result.err
    rows = read_rows(out)
    assert [r["source"] for r in rows] == [f"{data}:1", f"{data}:2", f"{data}:3"]
    assert all(len(r["input_ids"]) == len(r["loss_mask"]) for r in rows)
    assert all(rows[2]["loss_mask"]) and not all(rows[0]["loss_mask"]) and any(rows[0]["loss_mask"])
    prompts = [json.loads(line) for line in (out / "prompts-00000.jsonl").read_text().splitlines()]
    assert prompts == [{"prompt": "Write a short poem about the sea.", "source": f"{data}:4"}]

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["records"] == 4 and manifest["counts"]["rows"] == 3 and manifest["counts"]["prompts"] == 1
    assert manifest["counts"]["skipped"] == 0 and manifest["skipped"] == {}
    assert manifest["counts"]["loss_tokens"] == sum(sum(r["loss_mask"]) for r in rows)
    assert set(manifest["target"]) >= {"config", "tokenizer", "chat_template", "weights", "vocab_size", "id"}
    assert manifest["eyas_version"] and manifest["fingerprint"]
    assert manifest["shards"][0]["data_sha256"] and manifest["vocab"]["size"] == 40

    counts = load_file(str(out / "token_counts.safetensors"))["counts"]
    expected = np.zeros_like(counts)
    for row in rows:
        np.add.at(expected, np.asarray(row["input_ids"])[np.asarray(row["loss_mask"])], 1)
    assert counts.tolist() == expected.tolist()
    assert len(counts) == manifest["target"]["vocab_size"]

    vocab = load_file(str(out / "vocab.safetensors"))
    assert int(vocab["t2d"].sum()) == 40 and len(vocab["t2d"]) == len(counts)
    assert "coverage" in result.out and "samples written" in result.out
    assert (out / "config.yaml").is_file() and not (out / "progress.json").exists()


def test_rerun_reuses_the_dataset_and_only_builds_a_new_vocab(tiny_targets, run_cli, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "in.jsonl", GOOD)
    out = tmp_path / "ds"
    assert run_cli(*prepare_args(tiny_targets["chatml"], data, out, "--draft-vocab-size", "40")).code == 0
    shard_bytes = (out / "data-00000.parquet").read_bytes()
    again = run_cli(*prepare_args(tiny_targets["chatml"], data, out, "--draft-vocab-size", "20"))
    assert again.code == 0 and "already prepared" in again.out
    assert (out / "data-00000.parquet").read_bytes() == shard_bytes
    assert int(load_file(str(out / "vocab.safetensors"))["t2d"].sum()) == 20


def test_changed_inputs_refuse_the_old_output_unless_overwritten(tiny_targets, run_cli, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "in.jsonl", GOOD)
    out = tmp_path / "ds"
    assert run_cli(*prepare_args(tiny_targets["chatml"], data, out, "--draft-vocab-size", "30")).code == 0
    old_vocab = load_file(str(out / "vocab.safetensors"))["d2t"].tolist()
    write_jsonl(data, GOOD[:1] * 3)
    refused = run_cli(*prepare_args(tiny_targets["chatml"], data, out))
    assert refused.code == 2 and "holds an eyas dataset made from other inputs or settings; use another --out or --overwrite" in refused.err
    redone = run_cli(*prepare_args(tiny_targets["chatml"], data, out, "--overwrite", "--draft-vocab-size", "30"))
    assert redone.code == 0 and len(read_rows(out)) == 3
    assert load_file(str(out / "vocab.safetensors"))["d2t"].tolist() != old_vocab  # cache not reused


def test_max_length_truncates_and_counts(tiny_targets, run_cli, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "in.jsonl", GOOD[:3])
    out = tmp_path / "ds"
    assert run_cli(*prepare_args(tiny_targets["llama3"], data, out, "--max-length", "30")).code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    rows = read_rows(out)
    assert all(len(r["input_ids"]) <= 30 for r in rows)
    # the system+user header of record 1 is longer than 30 tokens: no assistant token survives
    assert manifest["counts"]["dropped_no_loss"] == 1 and manifest["counts"]["truncated"] >= 1
    assert manifest["counts"]["rows"] == len(rows) == 2


BAD_CASES = [
    ("{not json", "json: malformed JSON"),
    ({"messages": [{"role": "wizard", "content": "x"}, {"role": "assistant", "content": "y"}]},
     "messages[0].role: unknown role 'wizard'"),
    ({"messages": []}, "messages: empty conversation"),
    ({"messages": [{"role": "user", "content": ["x"]}, {"role": "assistant", "content": "y"}]},
     "messages[0].content: expected a string, got list"),
    ({"conversations": [{"from": "human", "value": "only a question"}]}, "conversations: no assistant turn"),
]


@pytest.mark.parametrize(("bad", "message"), BAD_CASES)
def test_bad_record_is_one_line_naming_file_line_and_field(tiny_targets, run_cli, tmp_path: Path, bad, message) -> None:
    data = write_jsonl(tmp_path / "in.jsonl", [GOOD[0], bad, GOOD[1]])
    result = run_cli(*prepare_args(tiny_targets["chatml"], data, tmp_path / "ds"))
    assert result.code == 2
    assert result.err == f"eyas: error: {data}:2: {message}" + result.err.split(message, 1)[1]
    assert result.err.count("\n") == 1 and "Traceback" not in result.err


def test_skip_invalid_skips_counts_and_reports_why(tiny_targets, run_cli, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "in.jsonl", [GOOD[0], *(bad for bad, _ in BAD_CASES), GOOD[1]])
    out = tmp_path / "ds"
    result = run_cli(*prepare_args(tiny_targets["chatml"], data, out, "--skip-invalid"))
    assert result.code == 0, result.err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["skipped"] == 5 and manifest["counts"]["rows"] == 2
    assert manifest["skipped"] == {"empty conversation": 1, "malformed JSON": 1, "no assistant turn": 1,
                                   "non-string field": 1, "unknown role": 1}
    assert manifest["skipped_examples"][0].startswith(f"{data}:2: json: malformed JSON")
    assert "skipped: unknown role" in result.out


def test_tokenizer_without_chat_template(tiny_targets, run_cli, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "in.jsonl", [GOOD[2], GOOD[0]])
    result = run_cli(*prepare_args(tiny_targets["notemplate"], data, tmp_path / "ds"))
    assert result.code == 2
    assert result.err.startswith(f"eyas: error: {data}:2: chat_template: the tokenizer of ")
    assert result.err.count("\n") == 1


@pytest.mark.parametrize(("what", "message"), [
    ("data", "missing.jsonl: no such file or directory (--data)"),
    ("target", "no_model: no such model directory or GGUF file (--target)"),
    ("target_file", "not a directory; --target takes a local Hugging Face model directory"),
    ("target_no_config", "config.json: not found"),
])
def test_missing_paths(tiny_targets, run_cli, tmp_path: Path, what: str, message: str) -> None:
    data = write_jsonl(tmp_path / "in.jsonl", GOOD)
    target = tiny_targets["chatml"]
    if what == "data":
        data = tmp_path / "missing.jsonl"
    elif what == "target":
        target = tmp_path / "no_model"
    elif what == "target_file":
        target = data
    else:
        target = tmp_path / "empty_model"
        target.mkdir()
    result = run_cli(*prepare_args(target, data, tmp_path / "ds"))
    assert result.code == 2 and message in result.err and result.err.count("\n") == 1


def test_out_dir_with_foreign_files_is_not_clobbered(tiny_targets, run_cli, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    data = write_jsonl(tmp_path / "in.jsonl", GOOD)
    result = run_cli(*prepare_args(tiny_targets["chatml"], data, out))
    assert result.code == 2 and "holds files that are not an eyas dataset; use another --out or --overwrite" in result.err
    assert (out / "precious.txt").read_text() == "keep me"


def test_config_file_and_overrides_drive_the_stage(tiny_targets, run_cli, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "in.jsonl", GOOD)
    config = tmp_path / "eyas.yaml"
    config.write_text(f"prepare:\n  target: {tiny_targets['chatml']}\n  data: [{data}]\n  out: {tmp_path / 'ds'}\n")
    result = run_cli("prepare", "--config", config, "prepare.last_turn_only=true", "draft_vocab_size=16")
    assert result.code == 0, result.err
    resolved = (tmp_path / "ds" / "config.yaml").read_text()
    assert "last_turn_only: true" in resolved and "draft_vocab_size: 16" in resolved
    bad = run_cli("prepare", "--config", config, "prepare.max_lenght=3")
    assert bad.code == 2 and "prepare.max_lenght: unknown key" in bad.err


def test_datasets_dir_input(tiny_targets, run_cli, tmp_path: Path) -> None:
    import datasets  # a dev dependency: this test must run, not skip

    datasets.Dataset.from_list([GOOD[0], GOOD[0]]).save_to_disk(str(tmp_path / "hf"))
    result = run_cli(*prepare_args(tiny_targets["qwen3"], tmp_path / "hf", tmp_path / "ds"))
    assert result.code == 0, result.err
    assert [r["source"] for r in read_rows(tmp_path / "ds")] == [f"{tmp_path / 'hf'}:row0", f"{tmp_path / 'hf'}:row1"]


def test_leftovers_of_a_run_killed_before_its_first_progress_are_cleared(tiny_targets, run_cli, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    out.mkdir()
    (out / "data-00000.parquet").write_bytes(b"half a shard")
    (out / ".data-00001.parquet.tmp-123").write_bytes(b"partial")
    data = write_jsonl(tmp_path / "in.jsonl", GOOD)
    result = run_cli(*prepare_args(tiny_targets["chatml"], data, out))
    assert result.code == 0, result.err
    assert len(read_rows(out)) == 3 and not list(out.glob(".*tmp*"))
