"""Input readers: JSONL and JSON arrays with line numbers, directories, HF datasets dirs."""

from __future__ import annotations

from pathlib import Path

import pytest

from eyas.data.sources import count_records, expand_inputs, read_records
from eyas.errors import EyasError, InputError


def test_jsonl_lines_are_numbered_and_blank_lines_skipped(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "a"}\n\n{"text": "b"}\n{bad\n', encoding="utf-8")
    records = list(read_records(path))
    assert [r.source for r in records] == [f"{path}:1", f"{path}:3", f"{path}:4"]
    assert records[1].value == {"text": "b"}
    assert isinstance(records[2].value, InputError) and "malformed JSON" in str(records[2].value)
    assert count_records(path) == 3


def test_json_array_elements_carry_the_line_they_start_on(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_text('[\n  {"text": "a"},\n  {"text":\n    "b"},\n\n  {"text": "c"}\n]\n', encoding="utf-8")
    assert [(r.source, r.value["text"]) for r in read_records(path)] == [
        (f"{path}:2", "a"), (f"{path}:3", "b"), (f"{path}:6", "c")]


def test_json_single_object_and_syntax_error(tmp_path: Path) -> None:
    single = tmp_path / "one.json"
    single.write_text('\n{"prompt": "p"}\n', encoding="utf-8")
    assert [(r.source, r.value) for r in read_records(single)] == [(f"{single}:2", {"prompt": "p"})]
    broken = tmp_path / "broken.json"
    broken.write_text('[\n {"text": "a"},\n {"text" "b"}\n]', encoding="utf-8")
    records = list(read_records(broken))
    assert records[0].value == {"text": "a"}
    assert isinstance(records[1].value, InputError) and records[1].source == f"{broken}:3"


def test_directories_are_walked_in_sorted_order(tmp_path: Path) -> None:
    (tmp_path / "d" / "sub").mkdir(parents=True)
    for name in ("d/b.jsonl", "d/a.json", "d/sub/c.jsonl", "d/notes.txt"):
        (tmp_path / name).write_text("[]" if name.endswith(".json") else "", encoding="utf-8")
    assert expand_inputs([tmp_path / "d"]) == [tmp_path / "d/a.json", tmp_path / "d/b.jsonl", tmp_path / "d/sub/c.jsonl"]


@pytest.mark.parametrize(("name", "message"), [
    ("missing.jsonl", "no such file or directory"),
    ("notes.txt", "unsupported data file"),
    ("empty_dir", "holds no .json/.jsonl files"),
])
def test_bad_paths_are_refused(tmp_path: Path, name: str, message: str) -> None:
    (tmp_path / "notes.txt").write_text("x", encoding="utf-8")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(EyasError, match=message):
        expand_inputs([tmp_path / name])


def test_datasets_dir_rows_are_read_with_row_locations(tmp_path: Path) -> None:
    import datasets  # a dev dependency: this test must run, not skip
    rows = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": f"a{i}"}]} for i in range(3)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    assert expand_inputs([tmp_path / "ds"]) == [tmp_path / "ds"]
    records = list(read_records(tmp_path / "ds"))
    assert [r.source for r in records] == [f"{tmp_path / 'ds'}:row{i}" for i in range(3)]
    assert records[2].value["messages"][1]["content"] == "a2"
    assert count_records(tmp_path / "ds") == 3
