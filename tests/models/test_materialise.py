"""The embedded GGUF target materialised as a Hugging Face directory: the same files from either
transformers line, the same tokens and logits as the GGUF itself, written once and never half."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eyas.errors import EyasError
from eyas.files import sha256_tree
from eyas.models.default import default_gguf, default_target
from eyas.models.fingerprint import target_fingerprint
from eyas.models.materialise import READY, llama_config, materialise_gguf, tokenizer_files
from eyas.models.tokenizer import load_tokenizer

LLAMA = {"model_type": "llama", "vocab_size": 100, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "hidden_act": "silu",
         "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "attention_bias": False,
         "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
TEXTS = ["def add(a, b):\n    return a + b\n", "  leading spaces, tabs\tand\nnewlines\n\n", "Ünïcödé ✓ — 東京 🦅",
         "<|im_start|>user\nHi<|im_end|>\n"]


def test_both_transformers_lines_spell_the_same_config() -> None:
    five = llama_config({**LLAMA, "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}, Path("x.gguf"))
    four = llama_config({**LLAMA, "rope_theta": 100000.0, "rope_scaling": None}, Path("x.gguf"))
    assert five == four and five["rope_theta"] == 100000.0 and five["architectures"] == ["LlamaForCausalLM"]
    assert "rope_parameters" not in five  # transformers 4.57 ignores it and would fall back to its default base


@pytest.mark.parametrize(("change", "message"), [
    ({"model_type": "qwen2"}, "model_type 'qwen2': only Llama GGUF targets are materialised"),
    ({"rope_parameters": {"rope_theta": 1e4, "rope_type": "yarn"}}, "only plain rotary embeddings"),
    ({"hidden_size": None}, None),
])
def test_other_architectures_and_scaled_rope_are_refused(change: dict, message: str | None) -> None:
    config = {**LLAMA, "rope_theta": 1e4, **change}
    if change.get("hidden_size", 0) is None:
        del config["hidden_size"]
        message = "lacks hidden_size"
    with pytest.raises(EyasError, match=message):
        llama_config(config, Path("x.gguf"))


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
