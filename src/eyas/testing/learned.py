"""A tiny target trained as a language model and an EAGLE-3 draft trained on it, built offline in
about a minute on 2 CPU cores: the fixture of the learning and decoding tests and of bench/decode.py.

Random tiny targets predict near-uniform distributions, which no draft can learn; trained on
the tiny corpus they become peaked, so the draft reaches a real acceptance length.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from eyas.testing.tiny import CORPUS, build_tiny_target, train_tiny_target

EVAL_FRACTION = 0.1
TTT_STEPS = 3


def corpus_conversations(count: int, seed: int) -> list[list[dict[str, str]]]:
    """Return user/assistant conversations of sentences from the tiny corpus."""
    rng = random.Random(seed)
    sentences = [s for text in CORPUS for s in text.replace("\n", " ").split(". ") if s]
    return [[{"role": "user", "content": rng.choice(sentences)},
             {"role": "assistant", "content": " ".join(rng.choice(sentences) for _ in range(3))}] for _ in range(count)]


def build_learned_pair(root: Path) -> dict[str, Path]:
    """Build under `root` and return `target` (LM-trained tiny chatml target), `store` (its features of
    400 conversations) and `run` (a draft trained 60 steps with 3 TTT steps, 10% held out; `run/final`)."""
    from eyas.config import ExtractConfig, PrepareConfig, TrainConfig
    from eyas.data.prepare import run_prepare
    from eyas.features.extract import run_extract
    from eyas.train.loop import run_train

    conversations = corpus_conversations(400, seed=0)
    target = train_tiny_target(build_tiny_target(root / "target", "chatml", with_weights=True), conversations,
                               steps=150)
    data = root / "conversations.jsonl"
    data.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations), encoding="utf-8")
    run_prepare(PrepareConfig(target=target, data=[data], out=root / "dataset", draft_vocab_size=256))
    run_extract(ExtractConfig(target=target, data=root / "dataset", out=root / "store", dtype="float32",
                              storage_dtype="fp32", device="cpu"))
    run_train(TrainConfig(features=root / "store", out=root / "run", max_steps=60, lr=3e-3, ttt_steps=TTT_STEPS,
                          token_budget=2048, device="cpu", eval_fraction=EVAL_FRACTION, row_tokens=512, eval_every=30))
    return {"target": target, "store": root / "store", "run": root / "run"}
