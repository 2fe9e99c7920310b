"""A tiny target trained as a language model and an EAGLE-3 draft trained on it, built offline in
about a minute on 2 CPU cores: the fixture of the learning and decoding tests and of bench/decode.py.

Random tiny targets predict near-uniform distributions, which no draft can learn; trained on
the tiny corpus they become peaked, so the draft reaches a real acceptance length.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from eyas.testing.tiny import CORPUS, build_tiny_target, train_tiny_target

EVAL_FRACTION = 0.1
TTT_STEPS = 3
DECODE_NEW_TOKENS = 32
DECODE_SHAPES = ((1, 1, 1, True), (3, 1, 3, True), (6, 1, 6, True), (3, 2, 5, False), (5, 4, 16, False),
                 (6, 8, 40, False))  # (depth, top-k, total, chain): chains 1, 3, 6 and three EAGLE-2 trees


def corpus_conversations(count: int, seed: int) -> list[list[dict[str, str]]]:
    """Return user/assistant conversations of sentences from the tiny corpus."""
    rng = random.Random(seed)
    sentences = [s for text in CORPUS for s in text.replace("\n", " ").split(". ") if s]
    return [[{"role": "user", "content": rng.choice(sentences)},
             {"role": "assistant", "content": " ".join(rng.choice(sentences) for _ in range(3))}] for _ in range(count)]


def build_learned_pair(root: Path, seed: int = 0, attention_heads: int = 4) -> dict[str, Path]:
    """Build under `root` and return `target` (LM-trained tiny chatml target), `store` (its features of
    400 conversations) and `run` (a draft trained 60 steps with 3 TTT steps, 10% held out; `run/final`).

    Everything runs in float32 whatever the CPU (`dtype: auto` would pick bfloat16 autocast on an
    AVX-512-BF16 one). `seed` draws the conversations and seeds the target's and the draft's training:
    other seeds give the spread of quality that the tests' thresholds allow for (bench/learned_spread.py).
    `attention_heads` 2 gives head_dim 32, which vLLM's CPU attention serves (the real-engine tests).
    """
    conversations = corpus_conversations(400, seed=seed)
    target = _trained_target(root, conversations, seed, attention_heads)
    data = root / "conversations.jsonl"
    data.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations), encoding="utf-8")
    return {"target": target, **_draft_of(root, target, data, seed)}


def build_on_policy_pair(root: Path, seed: int = 0, answer_tokens: int = 48) -> dict[str, Path]:
    """Build the learned pair as EAGLE-3 trains for real: the draft learns the target's own greedy answers
    (`eyas regenerate`) to 400 corpus prompts. Returns `target` (head_dim 32: vLLM's CPU attention serves
    it), `answers` (conversations.jsonl), `store`, `run`, and `prompts`: 30 prompts of the same kind for
    evaluation. Greedy decoding of such prompts then meets the draft on the text it was trained on, so
    training's implied tau estimates the tau of serving."""
    from eyas.config import RegenerateConfig
    from eyas.data.regenerate import run_regenerate

    target = _trained_target(root, corpus_conversations(400, seed=seed), seed, attention_heads=2)
    questions = root / "questions.jsonl"
    questions.write_text("".join(json.dumps({"messages": [c[0]]}) + "\n" for c in corpus_conversations(400, seed=seed + 1)),
                         encoding="utf-8")
    run_regenerate(RegenerateConfig(target=target, prompts=questions, out=root / "answers", max_new_tokens=answer_tokens,
                                    temperature=0.0, dtype="float32", device="cpu"))
    prompts = root / "eval-prompts.jsonl"
    prompts.write_text("".join(json.dumps({"messages": [c[0]]}) + "\n" for c in corpus_conversations(30, seed=123)),
                       encoding="utf-8")
    answers = root / "answers" / "conversations.jsonl"
    return {"target": target, "answers": answers, "prompts": prompts, **_draft_of(root, target, answers, seed)}


def _trained_target(root: Path, conversations: list[list[dict[str, str]]], seed: int, attention_heads: int) -> Path:
    return train_tiny_target(build_tiny_target(root / "target", "chatml", with_weights=True, seed=seed,
                                               attention_heads=attention_heads), conversations, steps=150, seed=seed)


def _draft_of(root: Path, target: Path, data: Path, seed: int) -> dict[str, Path]:
    """Prepare `data`, extract its features and train a draft on them, all in float32; return `store` and `run`."""
    from eyas.config import ExtractConfig, PrepareConfig
    from eyas.data.prepare import run_prepare
    from eyas.features.extract import run_extract

    run_prepare(PrepareConfig(target=target, data=[data], out=root / "dataset", draft_vocab_size=256))
    run_extract(ExtractConfig(target=target, data=root / "dataset", out=root / "store", dtype="float32",
                              storage_dtype="fp32", device="cpu"))
    train_draft(root / "store", root / "run", seed)
    return {"store": root / "store", "run": root / "run"}


def train_draft(store: Path, out: Path, seed: int = 0, **family: Any) -> Path:
    """Train the learned pair's draft on `store` into `out` (60 steps, TTT_STEPS steps, float32) and return `out`;
    `family` sets the draft family and its options (TrainConfig's `family`, `fc_norm`, `norm_output`, ...)."""
    from eyas.config import TrainConfig
    from eyas.train.loop import run_train

    run_train(TrainConfig(features=store, out=out, max_steps=60, lr=3e-3, ttt_steps=TTT_STEPS, token_budget=2048,
                          device="cpu", eval_fraction=EVAL_FRACTION, row_tokens=512, eval_every=30, seed=seed,
                          dtype="float32", target_dtype="float32", **family))
    return out


def greedy_rounds(target: Path, draft_dir: Path, shape: tuple[int, int, int, bool],
                  draft_weights: bool = True) -> list[int]:
    """Return the accepted draft tokens of every verification round of greedy speculative decoding of
    `decode_prompts` (DECODE_NEW_TOKENS each), target and draft in float64 as the decoding tests run
    them; with `draft_weights=False` the draft keeps its random initialisation (an untrained draft)."""
    import torch

    from eyas.decode.decoder import Decoder
    from eyas.decode.shapes import TreeShape
    from eyas.decode.sampling import Sampling
    from eyas.draft.model import Eagle3Draft, load_draft, set_embedding
    from eyas.models.load import load_target

    parts = load_target(target, torch.float64, "cpu")
    draft = load_draft(draft_dir, parts.embed.weight.detach())
    if not draft_weights:
        torch.manual_seed(0)
        fresh = Eagle3Draft(draft.config)
        fresh.d2t.copy_(draft.d2t)
        fresh.t2d.copy_(draft.t2d)
        set_embedding(fresh, parts.embed.weight.detach().float())
        draft = fresh
    draft = draft.double().eval()
    decoder = Decoder(parts, draft, TreeShape(*shape), Sampling(), set())
    return [a for prompt in decode_prompts(target) for a in decoder.generate(prompt, DECODE_NEW_TOKENS).accepted]


def decode_prompts(target: Path) -> list[list[int]]:
    """Return the 10 prompt id lists the decoding tests and the spread bench run: 7 chat prompts of the
    corpus's sentences (another draw than the training one) and 3 raw texts."""
    from eyas.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(target)
    chats = [tokenizer(tokenizer.apply_chat_template([c[0]], tokenize=False, add_generation_prompt=True),
                       add_special_tokens=False)["input_ids"] for c in corpus_conversations(7, seed=123)]
    raw = [tokenizer(text)["input_ids"] for text in ("The quick brown", "def add(a, b):", "Hello! How")]
    return chats + raw


def draft_accuracy(pair: dict[str, Path]) -> tuple[float, float]:
    """Return `(accuracy, unigram)` on the held-out samples of `pair`: the share of loss positions where the
    final draft's step-0 guess (through d2t) equals the target model's own argmax (a full forward of the
    model, not the stored teacher), and the share the most frequent training-split argmax gets."""
    from collections import Counter

    import torch
    from transformers import AutoModelForCausalLM

    from eyas.draft.attention import EagerTTTAttention
    from eyas.draft.model import load_draft
    from eyas.features.store import read_store_manifest
    from eyas.train.batches import split_indices
    from eyas.train.sources import StoreSource

    model = AutoModelForCausalLM.from_pretrained(str(pair["target"]), dtype=torch.float32).eval()
    draft = load_draft(pair["run"] / "final", model.get_input_embeddings().weight).eval()
    source = StoreSource(pair["store"], read_store_manifest(pair["store"]))
    train_ids, eval_ids = split_indices(len(source.lengths()), EVAL_FRACTION, seed=0)

    def scored(index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (target argmax, draft step-0 guess as target ids) at the loss positions of one sample."""
        sample = source.samples([index])[index]
        ids = sample["input_ids"].long()[None]  # [1, T]
        with torch.no_grad():
            target_argmax = model(input_ids=ids).logits.argmax(-1)[0]  # [T]
            doc = torch.zeros_like(ids)
            hidden = draft.step(draft.fuse(sample["aux"][None]), torch.roll(ids, -1, 1), torch.arange(ids.shape[1])[None],
                                draft.new_kv(), EagerTTTAttention(doc))
            guess = draft.to_target_ids(draft.logits(hidden).argmax(-1))[0]  # [T]: guess for position t+1
        anchors = sample["loss_mask"][1:].bool()  # anchor t predicts position t+1
        return target_argmax[1:][anchors], guess[:-1][anchors]

    train_truth = torch.cat([scored(int(i))[0] for i in train_ids[:120]])
    unigram = Counter(train_truth.tolist()).most_common(1)[0][0]
    truth, guess = map(torch.cat, zip(*(scored(int(i)) for i in eval_ids)))
    return (guess == truth).float().mean().item(), (truth == unigram).float().mean().item()
