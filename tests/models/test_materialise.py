"""The embedded GGUF target materialised as a Hugging Face directory: the same files from either
transformers line, the same tokens and logits as the GGUF itself, written once and never half."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eyas.files import sha256_tree
from eyas.models.default import default_gguf, default_target
from eyas.models.fingerprint import target_fingerprint
from eyas.models.materialise import READY, materialise_gguf, tokenizer_files
from eyas.models.tokenizer import load_tokenizer

TEXTS = ["def add(a, b):\n    return a + b\n", "  leading spaces, tabs\tand\nnewlines\n\n", "Ünïcödé ✓ — 東京 🦅",
         "<|im_start|>user\nHi<|im_end|>\n"]


def test_a_byte_level_tokenizer_without_a_decoder_gets_one(tiny_targets) -> None:
    tokenizer = load_tokenizer(tiny_targets["chatml"])
    tokenizer.backend_tokenizer.decoder = None
    files = tokenizer_files(tokenizer)
    assert json.loads(files["tokenizer.json"])["decoder"]["type"] == "ByteLevel"
    assert json.loads(files["tokenizer_config.json"])["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert files["chat_template.jinja"] == tokenizer.chat_template


@pytest.mark.slow
def test_the_embedded_target_is_a_directory_with_the_ggufs_tokens_and_logits(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    directory, gguf = default_target(), default_gguf()
    assert (directory / READY).is_file() and directory == default_target()
    ours, theirs = load_tokenizer(directory), load_tokenizer(gguf)
    for text in TEXTS:
        ids = ours(text, add_special_tokens=False)["input_ids"]
        assert ids == theirs(text, add_special_tokens=False)["input_ids"]
        assert ours.decode(ids) == text  # byte-level symbols never leak into text
    chat = [{"role": "user", "content": TEXTS[0]}]
    assert ours.apply_chat_template(chat, tokenize=False) == theirs.apply_chat_template(chat, tokenize=False)
    assert target_fingerprint(directory, ours) == target_fingerprint(directory, load_tokenizer(directory))
    ids = torch.tensor([ours(TEXTS[0])["input_ids"]])
    with torch.no_grad():
        mine = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)(input_ids=ids).logits
        reference = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                         dtype=torch.float32)(input_ids=ids).logits
    assert torch.equal(mine, reference)
    again = materialise_gguf(gguf, tmp_path / "again")  # deterministic: the same bytes a second time
    assert sha256_tree(again) == sha256_tree(directory)
