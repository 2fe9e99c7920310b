"""Parquet and Arrow files as `--data` inputs: rows as records with their row index, null columns absent,
inside directories (a datasets dir taken whole), corrupt files refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import chat, write_jsonl

from eyas.data.sources import count_records, expand_inputs, read_records
from eyas.errors import UnreadableInput

ROWS = [
    chat(("user", "Hello there"), ("assistant", "Hi! How can I help?")),
    {"text": "The quick brown fox jumps over the lazy dog."},
    {"prompt": "Write a short poem about the sea."},
]


def table() -> pa.Table:
    """ROWS as one table: every row has every column, null where the record lacks it (as Arrow stores them)."""
    columns = sorted({key for row in ROWS for key in row})
    return pa.Table.from_pylist([{key: row.get(key) for key in columns} for row in ROWS])


def write(path: Path) -> Path:
    if path.suffix == ".parquet":
        pq.write_table(table(), path, row_group_size=2)
    else:
        opener = pa.ipc.new_file if path.stem.endswith("file") else pa.ipc.new_stream
        with opener(path, table().schema) as writer:
            writer.write_table(table(), max_chunksize=2)
    return path


@pytest.mark.parametrize("name", ["rows.parquet", "rows-file.arrow", "rows-stream.arrow"])
def test_columnar_rows_are_records_with_their_row_index(tmp_path: Path, name: str) -> None:
    path = write(tmp_path / name)
    records = list(read_records(path))
    assert [r.source for r in records] == [f"{path}:row{i}" for i in range(3)]
    assert [r.value for r in records] == ROWS  # null columns left out, across batches and row groups
    assert count_records(path) == 3


def test_directories_take_columnar_files_and_datasets_dirs_whole(tmp_path: Path) -> None:
    import datasets  # a dev dependency: this test must run, not skip

    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    write(root / "b.parquet")
    write(root / "sub" / "c-stream.arrow")
    write_jsonl(root / "a.jsonl", ROWS[:1])
    datasets.Dataset.from_list([{"text": "row"}]).save_to_disk(str(root / "saved"))
    assert expand_inputs([root]) == [root / "a.jsonl", root / "b.parquet", root / "saved", root / "sub" / "c-stream.arrow"]


@pytest.mark.parametrize(("name", "content", "reason"), [
    ("bad.parquet", b"PAR1 not a parquet file", "not a readable Parquet file (Parquet magic bytes not found"),
    ("bad.arrow", b"ARROW1\0\0 not an arrow file", "not a readable Arrow file ("),
])
def test_a_corrupt_columnar_file_is_one_line(tmp_path: Path, run_cli, tiny_targets, name: str, content: bytes,
                                             reason: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(UnreadableInput, match="cannot read it"):
        list(read_records(path))
    result = run_cli("prepare", "--target", tiny_targets["chatml"], "--data", path, "--out", tmp_path / "ds", "--skip-invalid")
    assert result.code == 2 and result.err.startswith(f"eyas: error: {path}: cannot read it: {reason}") and len(result.err.strip().splitlines()) == 1


def test_a_truncated_arrow_stream_is_one_line(tmp_path: Path) -> None:
    path = write(tmp_path / "rows-stream.arrow")
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(UnreadableInput, match=r"rows-stream.arrow: cannot read it: not a readable Arrow file"):
        list(read_records(path))


def test_prepare_reads_parquet_like_jsonl_and_names_bad_rows(tmp_path: Path, run_cli, tiny_targets) -> None:
    parquet = write(tmp_path / "rows.parquet")
    jsonl = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    for name, path in (("p", parquet), ("j", jsonl)):
        assert run_cli("prepare", "--target", tiny_targets["chatml"], "--data", path, "--out", tmp_path / name).code == 0
    rows = {name: [r for shard in sorted((tmp_path / name).glob("data-*.parquet")) for r in pq.read_table(shard).to_pylist()]
            for name in ("p", "j")}
    assert [r["input_ids"] for r in rows["p"]] == [r["input_ids"] for r in rows["j"]]
    assert [r["loss_mask"] for r in rows["p"]] == [r["loss_mask"] for r in rows["j"]]
    assert [r["source"] for r in rows["p"]] == [f"{parquet}:row0", f"{parquet}:row1"]
    prompts = (tmp_path / "p" / "prompts-00000.jsonl").read_text().splitlines()
    assert [json.loads(line)["source"] for line in prompts] == [f"{parquet}:row2"]

    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": [{"role": "user", "content": "q"}, {"role": "wizard", "content": "a"}]}]), bad)
    result = run_cli("prepare", "--target", tiny_targets["chatml"], "--data", bad, "--out", tmp_path / "b")
    assert result.code == 2 and result.err.startswith(f"eyas: error: {bad}:row0: messages[1].role: unknown role 'wizard'")
