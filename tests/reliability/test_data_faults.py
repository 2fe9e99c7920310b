"""Faulty data inputs (probe of 2026-12, F5 F8-F11 F17): each is one line naming the file (and line and
field), exit 2, never a traceback; a bad record is skipped and counted under --skip-invalid, the good
ones kept; a symlinked sub-directory of --data is read and a symlink loop refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import chat, write_jsonl

from eyas.data.prompts import read_prompt_files
from eyas.decode.prompts import read_prompts
from eyas.errors import EyasError
from eyas.models.tokenizer import load_tokenizer

EYAS = str(Path(sys.executable).parent / "eyas")
GOOD = [chat(("user", f"question {i}"), ("assistant", f"answer number {i} is here")) for i in range(3)]
LATIN1_LINE = b'{"messages": [{"role": "user", "content": "caf\xe9"}, {"role": "assistant", "content": "ok"}]}'
DEEP_LINE = '{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}"
LONG_INTEGER_LINE = '{"text": "a", "id": ' + "9" * 5000 + "}"


def prepare(run_cli, target: Path, data: Path, out: Path, *extra: str):
    return run_cli("prepare", "--target", target, "--data", data, "--out", out, *extra)


def with_bad_line(path: Path, bad: bytes) -> Path:
    """Write GOOD[0], the `bad` line, GOOD[1] to `path` (the bad record is on line 2)."""
    good = [json.dumps(record).encode() for record in GOOD[:2]]
    path.write_bytes(b"\n".join([good[0], bad, good[1]]) + b"\n")
    return path


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def one_line(err: str) -> str:
    """Return the one line `err` holds (asserting it is one line and no traceback)."""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def assert_one_bad_record(run_cli, target: Path, data: Path, root: Path, message: str, reason: str) -> dict:
    """Prepare `data` (GOOD[0], a bad line 2, GOOD[1]) twice: without --skip-invalid it stops with the one
    line `FILE:2: message`; with it, the two good records are kept and the bad one counted under `reason`.
    Return the second dataset's manifest."""
    stopped = prepare(run_cli, target, data, root / "a")
    assert stopped.code == 2
    assert one_line(stopped.err) == f"eyas: error: {data}:2: {message}\n"
    skipped = prepare(run_cli, target, data, root / "b", "--skip-invalid")
    assert skipped.code == 0, skipped.err
    found = manifest(root / "b")
    assert found["counts"]["rows"] == 2 and found["skipped"] == {reason: 1}
    return found


def test_a_symlinked_sub_directory_is_read_and_a_loop_refused(tiny_targets, run_cli, tmp_path: Path) -> None:
    data, other = tmp_path / "d", tmp_path / "other"
    write_jsonl(data / "real" / "a.jsonl", GOOD[:2])
    write_jsonl(other / "b.jsonl", GOOD)
    (data / "linked").symlink_to(other, target_is_directory=True)
    result = prepare(run_cli, tiny_targets["chatml"], data, tmp_path / "ds")
    assert result.code == 0, result.err
    found = manifest(tmp_path / "ds")
    assert found["counts"]["records"] == found["counts"]["rows"] == 5
    assert [entry["path"] for entry in found["inputs"]] == [str(data / "linked" / "b.jsonl"), str(data / "real" / "a.jsonl")]

    (data / "real" / "loop").symlink_to(data, target_is_directory=True)
    looped = prepare(run_cli, tiny_targets["chatml"], data, tmp_path / "ds2")
    assert looped.code == 2
    assert one_line(looped.err) == f"eyas: error: {data / 'real' / 'loop'}: a symlink loop: it leads back to {data} (--data)\n"
    assert not (tmp_path / "ds2").exists()
    (data / "real" / "loop").unlink()
    (data / "self.jsonl").symlink_to("self.jsonl")
    itself = prepare(run_cli, tiny_targets["chatml"], data, tmp_path / "ds2")
    assert itself.code == 2
    assert one_line(itself.err) == f"eyas: error: {data / 'self.jsonl'}: cannot read it: Too many levels of symbolic links\n"
    (data / "self.jsonl").unlink()
    (data / "gone.jsonl").symlink_to(tmp_path / "moved.jsonl")
    broken = prepare(run_cli, tiny_targets["chatml"], data, tmp_path / "ds2")
    assert broken.code == 2
    assert one_line(broken.err) == (f"eyas: error: {data / 'gone.jsonl'}: a broken symlink (it points to "
                                    f"{tmp_path / 'moved.jsonl'}, which is not a file) (--data)\n")


def test_a_line_that_is_not_utf8_is_one_bad_record(tiny_targets, run_cli, tmp_path: Path) -> None:
    data = with_bad_line(tmp_path / "latin1.jsonl", LATIN1_LINE)
    found = assert_one_bad_record(run_cli, tiny_targets["chatml"], data, tmp_path,
                                  "json: not UTF-8 text (byte 0xe9 at column 47)", "not UTF-8")
    assert found["skipped_examples"] == [f"{data}:2: json: not UTF-8 text (byte 0xe9 at column 47)"]


@pytest.mark.parametrize("skip", [False, True])
def test_a_json_document_that_is_not_utf8_is_refused_in_one_line(tiny_targets, run_cli, tmp_path: Path,
                                                                  skip: bool) -> None:
    data = tmp_path / "latin1.json"
    data.write_bytes(b"[\n" + LATIN1_LINE + b"\n]\n")
    result = prepare(run_cli, tiny_targets["chatml"], data, tmp_path / "ds", *(["--skip-invalid"] if skip else []))
    assert result.code == 2
    assert one_line(result.err).startswith(f"eyas: error: {data}: cannot read it: not UTF-8 text (byte 0xe9 ")


@pytest.mark.parametrize(("record", "field", "escaped"), [
    ({"messages": [{"role": "user", "content": "a \ud800 b"}, {"role": "assistant", "content": "ok"}]},
     "messages[0].content", "\\ud800"),
    ({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "\udfff"}]}, "conversations[1].value",
     "\\udfff"),
    ({"messages": [{"role": "user\ud800", "content": "hi"}, {"role": "assistant", "content": "ok"}]}, "messages[0].role",
     "\\ud800"),
    ({"text": "x \udc80"}, "text", "\\udc80"),
    ({"prompt": "\ud800 why?"}, "prompt", "\\ud800"),
])
def test_a_lone_surrogate_is_a_bad_record_naming_its_field(tiny_targets, run_cli, tmp_path: Path, record: dict,
                                                           field: str, escaped: str) -> None:
    data = with_bad_line(tmp_path / "in.jsonl", json.dumps(record).encode())  # the surrogate as its JSON escape
    assert_one_bad_record(run_cli, tiny_targets["chatml"], data, tmp_path,
                          f"{field}: holds a lone surrogate ({escaped}), not valid Unicode text", "lone surrogate")


@pytest.mark.parametrize(("line", "problem", "reason"), [
    (DEEP_LINE, "json: nested too deeply to parse", "nested too deeply"),
    (LONG_INTEGER_LINE, "json: an integer of more than 4300 digits", "integer too long"),
])
def test_a_line_python_cannot_parse_is_a_bad_record(tiny_targets, run_cli, tmp_path: Path, line: str, problem: str,
                                                    reason: str) -> None:
    data = with_bad_line(tmp_path / "in.jsonl", line.encode())
    assert_one_bad_record(run_cli, tiny_targets["chatml"], data, tmp_path, problem, reason)


def test_a_json_element_python_cannot_parse_ends_the_files_records(tiny_targets, run_cli, tmp_path: Path) -> None:
    data = tmp_path / "in.json"
    data.write_text("[\n" + json.dumps(GOOD[0]) + ",\n" + LONG_INTEGER_LINE + ",\n" + json.dumps(GOOD[1]) + "\n]\n")
    stopped = prepare(run_cli, tiny_targets["chatml"], data, tmp_path / "a")
    assert stopped.code == 2
    assert one_line(stopped.err) == (f"eyas: error: {data}:3: json: an integer of more than 4300 digits; "
                                     "rest of file unreadable\n")
    skipped = prepare(run_cli, tiny_targets["chatml"], data, tmp_path / "b", "--skip-invalid")
    assert skipped.code == 0, skipped.err
    assert manifest(tmp_path / "b")["counts"]["rows"] == 1 and manifest(tmp_path / "b")["skipped"] == {"integer too long": 1}


def test_an_unreadable_file_in_a_data_directory_is_one_line(tiny_targets, tmp_path: Path) -> None:
    data = tmp_path / "d"
    write_jsonl(data / "a.jsonl", GOOD)
    locked = write_jsonl(data / "b.jsonl", GOOD)
    locked.chmod(0)
    command = [EYAS, "prepare", "--target", str(tiny_targets["chatml"]), "--data", str(data), "--out",
               str(tmp_path / "ds"), "--skip-invalid"]
    if os.geteuid() == 0:  # root reads any file: run without the capabilities that let it
        if shutil.which("setpriv") is None:
            pytest.fail("as root, this test needs `setpriv` (util-linux) to drop CAP_DAC_OVERRIDE")
        command = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert one_line(done.stderr) == f"eyas: error: {locked}: cannot read it: Permission denied\n"


def test_a_file_failing_with_an_io_error_is_one_line(tiny_targets, run_cli, tmp_path: Path) -> None:
    data = tmp_path / "d"
    write_jsonl(data / "a.jsonl", GOOD)
    failing = data / "b.jsonl"
    failing.symlink_to("/proc/self/mem")  # a regular file whose first page read fails with EIO
    result = prepare(run_cli, tiny_targets["chatml"], data, tmp_path / "ds", "--skip-invalid")
    assert result.code == 2
    assert one_line(result.err) == f"eyas: error: {failing}: cannot read it: Input/output error\n"


def test_no_usable_record_says_how_many_were_dropped_and_why(tiny_targets, run_cli, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "in.jsonl", GOOD)
    result = prepare(run_cli, tiny_targets["chatml"], data, tmp_path / "ds", "--max-length", "1")
    assert result.code == 2
    assert one_line(result.err) == (f"eyas: error: {tmp_path / 'ds'}: no usable records in the inputs (3 read: 0 "
                                    "skipped as invalid; 3 dropped: no loss token within --max-length 1)\n")


def test_regenerate_refuses_a_prompt_with_a_lone_surrogate(tiny_targets, run_cli, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello"}\n{"messages": [{"role": "user", "content": "a \\ud800 b"}]}\n')
    result = run_cli("regenerate", "--target", tiny_targets["chatml"], "--prompts", prompts, "--out", tmp_path / "r",
                     "--device", "cpu", "regenerate.dtype=float32")
    assert result.code == 2
    assert one_line(result.err) == (f"eyas: error: {prompts}:2: messages[0].content: holds a lone surrogate (\\ud800), "
                                    "not valid Unicode text\n")


def test_eval_prompts_refuse_bad_lines_naming_them_and_skip_them_when_asked(tiny_targets, tmp_path: Path) -> None:
    from eyas.data.chat_tokens import ChatEncoder

    tokenizer = load_tokenizer(tiny_targets["chatml"])
    prompts = tmp_path / "prompts.jsonl"
    lines = [b'{"prompt": "hello"}', b'{"prompt": "a \\ud800 b"}', b'{"prompt": "caf\xe9"}',
             DEEP_LINE.replace("messages", "prompt").encode(), LONG_INTEGER_LINE.replace("text", "prompt").encode(),
             b'{"text": "bye"}']
    prompts.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(EyasError) as refused:
        read_prompts(prompts, tokenizer)
    assert str(refused.value) == f"{prompts}:2: prompt: holds a lone surrogate (\\ud800), not valid Unicode text"
    encoder = ChatEncoder(tokenizer, {}, False, str(tiny_targets["chatml"]), masks=False)
    kept, rejected = read_prompt_files([prompts], encoder, skip_invalid=True)
    assert [prompt.source for prompt in kept] == [f"{prompts}:1", f"{prompts}:6"]
    assert rejected == [
        {"where": f"{prompts}:2", "reason": "prompt: holds a lone surrogate (\\ud800), not valid Unicode text"},
        {"where": f"{prompts}:3", "reason": "json: not UTF-8 text (byte 0xe9 at column 16)"},
        {"where": f"{prompts}:4", "reason": "json: nested too deeply to parse"},
        {"where": f"{prompts}:5", "reason": "json: an integer of more than 4300 digits"},
    ]
