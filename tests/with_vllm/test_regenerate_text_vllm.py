"""`eyas regenerate --backend vllm --mode text`: raw-text continuations (a base model's on-policy data) and extra
stop tokens through vLLM, in the HF backend's documents to the byte; the HF backend's own oracle is transformers'
`generate` (tests/data/test_base_models.py)."""

from __future__ import annotations

import json
from pathlib import Path

TEXTS = ["The capital of France is", "def reverse(s):", "Once upon a time, a hawk"]


def test_greedy_continuations_with_a_stop_token_are_the_hf_backends(smollm2: Path, eyas_process, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"text": text}) + "\n" for text in TEXTS), encoding="utf-8")
    written = {}
    for backend in ("vllm", "hf"):
        done = eyas_process("regenerate", "--target", smollm2, "--prompts", prompts, "--out", tmp_path / backend,
                            "--backend", backend, "--mode", "text", "--stop-tokens", ".", "--max-new-tokens", "24",
                            "--temperature", "0", "--dtype", "float32", "--device", "cpu")
        assert done.returncode == 0, done.stderr[-3000:]
        written[backend] = (tmp_path / backend / "documents.jsonl").read_text(encoding="utf-8")
    assert written["vllm"] == written["hf"]
    documents = [json.loads(line) for line in written["vllm"].splitlines()]
    assert [d["text"][:len(t)] for d, t in zip(documents, TEXTS)] == TEXTS
    assert any(d["finish"] == "eos" for d in documents)  # stopped at "." (SmolLM2's EOS is another token)
