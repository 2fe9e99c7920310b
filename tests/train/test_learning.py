"""The draft learns: a tiny target trained as a language model, then prepare -> extract -> train.

Checked independently of the trainer's own metrics: step-0 accuracy of the final draft against
the target model's own argmax (a full forward of the model, not the stored teacher), through the
draft's d2t mapping, versus the best unigram guess. Broken teacher targets (e.g. no final norm),
a broken d2t/t2d mapping or a broken TTT unroll make it fail (the last through the implied
acceptance length, which needs steps 1 and 2 to be right too).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch

from eyas.draft.attention import EagerTTTAttention
from eyas.draft.model import load_draft
from eyas.testing.learned import EVAL_FRACTION
from eyas.features.store import read_store_manifest
from eyas.train.batches import split_indices
from eyas.train.sources import StoreSource


def test_draft_beats_unigram_and_implies_a_long_acceptance(learned: dict[str, Path]) -> None:
    """`learned` trained the draft (60 steps, `eyas train`'s code path); check it against the model."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(learned["target"]), dtype=torch.float32).eval()
    draft = load_draft(learned["run"] / "final", model.get_input_embeddings().weight).eval()
    source = StoreSource(learned["store"], read_store_manifest(learned["store"]))
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
    accuracy = (guess == truth).float().mean().item()
    baseline = (truth == unigram).float().mean().item()
    assert accuracy >= 0.6 and accuracy >= baseline + 0.4, (accuracy, baseline)

    held_out = [json.loads(line) for line in (learned["run"] / "metrics.jsonl").read_text().splitlines()]
    final_eval = [m for m in held_out if m["split"] == "eval"][-1]
    assert abs(final_eval["acc_0"] - accuracy) < 0.05  # the trainer's teacher agrees with the model's logits
    assert final_eval["implied_tau"] >= 2.4, final_eval  # chain of 3: at most 4
