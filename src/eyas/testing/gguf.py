"""Tiny GGUF targets written from scratch with the `gguf` package (no downloads): a Llama with a
byte-level BPE tokenizer (llama.cpp's `gpt2` tokenizer model) and a Gemma-3 with a sentencepiece-style
vocabulary (llama.cpp's `llama` tokenizer model, byte fallback), both with random weights stored as
Q8_0 blocks (norms in float32), tensors under llama.cpp's names.

The weights come from a random transformers model of the same shapes, written as they are: how
llama.cpp's converter rearranges them (Llama's q/k row order, Gemma's norms stored plus one) does
not matter to tests that compare a loader against another loader of the same file.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Literal

import numpy as np

TinyGguf = Literal["llama", "gemma3"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<start_of_turn>' + message['role'] + '\\n' + message['content'] + '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)
_CONTROL, _NORMAL, _UNKNOWN, _UNUSED, _BYTE = 3, 1, 2, 5, 6  # llama.cpp token types
_SHAPES = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
           "head_dim": 32, "max_position_embeddings": 256, "rms_norm_eps": 1e-6}  # head_dim 32: vLLM's CPU minimum


def _byte_level_vocab() -> tuple[list[str], list[int], list[str], int]:
    """Return tokens, types and merges of a small trained byte-level BPE (padded to 64 rows), and its eos id."""
    import json
    import tempfile

    from eyas.testing.tiny import build_tiny_target

    with tempfile.TemporaryDirectory() as scratch:
        directory = build_tiny_target(Path(scratch) / "t", "chatml", vocab_size=320)
        model = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = sorted(model["model"]["vocab"].items(), key=lambda item: item[1])
    special = {token["content"] for token in model["added_tokens"] if token["special"]}
    tokens = [token for token, _ in vocab]
    types = [_CONTROL if token in special else _NORMAL for token in tokens]
    pad = -len(tokens) % 64
    tokens += [f"[PAD{i}]" for i in range(pad)]
    types += [_UNUSED] * pad
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in model["model"]["merges"]]
    return tokens, types, merges, tokens.index("<|im_end|>")


def _sentencepiece_vocab() -> tuple[list[str], list[int], list[float]]:
    """Return tokens, types and scores of a small sentencepiece-style vocabulary in Gemma's layout
    (`<pad>` 0, `<eos>` 1, `<bos>` 2, `<unk>` 3, `<mask>` 4, turn markers, 256 byte tokens, pieces), 448 rows."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
    pieces = ["▁"] + list(string.ascii_letters + string.digits + string.punctuation)
    words = ["▁t", "he", "▁the", "▁a", "in", "er", "▁s", "on", "re", "▁i", "▁o", "at", "en", "▁w", "▁d", "ed", "▁c",
             "is", "an", "▁b", "or", "▁f", "▁m", "es", "▁p", "ar", "▁to", "▁of", "▁and", "ing", "▁in", "▁is"]
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)] + pieces + words
    tokens += [f"<unused{i}>" for i in range(-len(tokens) % 64)]
    types = ([_CONTROL] * 3 + [_UNKNOWN] + [_CONTROL] * 3 + [_BYTE] * 256 + [_NORMAL] * (len(pieces) + len(words))
             + [_UNUSED] * (len(tokens) - len(specials) - 256 - len(pieces) - len(words)))
    scores = [0.0] * len(specials) + [0.0] * 256 + [-float(i) for i in range(len(tokens) - len(specials) - 256)]
    return tokens, types, scores


def _random_weights(model_type: str, vocab_size: int, num_layers: int, seed: int) -> dict[str, np.ndarray]:
    """Return the float32 state dict (HF name -> array) of a random transformers model of these shapes."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, vocab_size=vocab_size, num_hidden_layers=num_layers,
                                  tie_word_embeddings=True, **_SHAPES)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32)
    with torch.no_grad():
        for parameter in model.parameters():  # wider than the default init, so the layers matter to the logits
            parameter.normal_(0.0, 0.2 if parameter.dim() > 1 else 0.1)
    return {name: tensor.numpy() for name, tensor in model.state_dict().items() if name != "lm_head.weight"}


def write_tiny_gguf(path: Path, kind: TinyGguf = "llama", num_layers: int = 2, seed: int = 0,
                    chat_template: bool = True) -> Path:
    """Write a tiny GGUF target of `kind` to `path` and return `path` (a fraction of a MB, about a second)."""
    import gguf

    arch = {"llama": gguf.MODEL_ARCH.LLAMA, "gemma3": gguf.MODEL_ARCH.GEMMA3}[kind]
    writer = gguf.GGUFWriter(str(path), kind)
    writer.add_name(f"tiny-{kind}")
    if kind == "llama":
        tokens, types, merges, eos = _byte_level_vocab()
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("qwen2")
        writer.add_token_merges(merges)
        writer.add_bos_token_id(eos)
        writer.add_eos_token_id(eos)
        writer.add_pad_token_id(eos)
        writer.add_rope_dimension_count(_SHAPES["head_dim"])
        writer.add_rope_freq_base(100000.0)
    else:
        tokens, types, scores = _sentencepiece_vocab()
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_scores(scores)
        writer.add_bos_token_id(2)
        writer.add_eos_token_id(1)
        writer.add_pad_token_id(0)
        writer.add_unk_token_id(3)
        writer.add_add_bos_token(True)
        writer.add_key_length(_SHAPES["head_dim"])
        writer.add_value_length(_SHAPES["head_dim"])
        writer.add_sliding_window(16)
        writer.add_rope_freq_base(1000000.0)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if chat_template:
        writer.add_chat_template(CHAT_TEMPLATE)
    writer.add_context_length(_SHAPES["max_position_embeddings"])
    writer.add_embedding_length(_SHAPES["hidden_size"])
    writer.add_feed_forward_length(_SHAPES["intermediate_size"])
    writer.add_block_count(num_layers)
    writer.add_head_count(_SHAPES["num_attention_heads"])
    writer.add_head_count_kv(_SHAPES["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(_SHAPES["rms_norm_eps"])
    names = gguf.get_tensor_name_map(arch, num_layers)
    model_type = {"llama": "llama", "gemma3": "gemma3_text"}[kind]
    for name, array in _random_weights(model_type, len(tokens), num_layers, seed).items():
        stem, _, suffix = name.rpartition(".")
        gguf_name = f"{names.get_name(stem)}.{suffix}"
        if array.ndim == 2:  # [out, in] -> Q8_0 blocks of 32 along `in`
            blocks = gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(gguf_name, blocks, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(gguf_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
