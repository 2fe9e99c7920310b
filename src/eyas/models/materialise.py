"""A GGUF Llama target written out as a Hugging Face model directory that vLLM and transformers both load.

eyas writes the files itself rather than calling `save_pretrained`: transformers 5 refuses to save
a GGUF-loaded model, and what each transformers line would save differs (4.57 cannot read the
`TokenizersBackend` class 5.x names; 5.x's config spells rope as `rope_parameters`, which 4.57
ignores, silently falling back to its default base). The bytes still differ between the two lines
(CI found it), so the cache keeps one directory per transformers major line. The directory holds:

- `model.safetensors`: the dequantized float32 tensors under the Hugging Face Llama names; the LM
  head is tied to the embedding (as in the GGUF) and not stored;
- `config.json`: the Llama fields in the spelling both transformers lines and vLLM read
  (`rope_theta` at the top level, `torch_dtype`);
- `tokenizer.json`: the GGUF tokenizer's own serialization, with a byte-level decoder wherever the
  pre-tokenizer is byte-level (so no engine detokenizes `Ġ`/`Ċ` into text); `tokenizer_config.json`
  names `PreTrainedTokenizerFast`, which loads `tokenizer.json` unchanged, and the special tokens;
  `chat_template.jinja`;
- `generation_config.json`: bos/eos only, so no engine applies sampling defaults of its own.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from eyas.errors import EyasError
from eyas.files import write_atomic, write_json_atomic, write_text_atomic

WEIGHTS = "model.safetensors"
READY = ".materialised"  # written last: a directory without it is unfinished and rebuilt
LLAMA_FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
    "tie_word_embeddings", "attention_bias", "mlp_bias", "bos_token_id", "eos_token_id", "pad_token_id",
)


def _rope_theta(config: dict[str, Any]) -> float:
    """Return the rotary base of a transformers config dict of either line (4.57 `rope_theta`, 5.x `rope_parameters`)."""
    parameters = config.get("rope_parameters") or {}
    theta = parameters.get("rope_theta", config.get("rope_theta"))
    if not isinstance(theta, (int, float)) or parameters.get("rope_type", "default") != "default" or config.get("rope_scaling"):
        raise EyasError(f"rope: only plain rotary embeddings are materialised (got rope_parameters={parameters}, "
                        f"rope_scaling={config.get('rope_scaling')})")
    return float(theta)


def llama_config(config: dict[str, Any], source: Path) -> dict[str, Any]:
    """Return `config.json` for a Llama target from a transformers config dict of either line; refuses other architectures."""
    if config.get("model_type") != "llama":
        raise EyasError(f"{source}: model_type {config.get('model_type')!r}: only Llama GGUF targets are materialised")
    missing = [field for field in LLAMA_FIELDS if field not in config]
    if missing:
        raise EyasError(f"{source}: the GGUF's config lacks {', '.join(missing)}")
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **{f: config[f] for f in LLAMA_FIELDS},
            "rope_theta": _rope_theta(config), "torch_dtype": "float32"}


def tokenizer_files(tokenizer: Any) -> dict[str, str]:
    """Return the tokenizer files' texts (name -> text) of a tokenizer loaded from a GGUF file."""
    serialized = json.loads(tokenizer.backend_tokenizer.to_str())
    if (serialized.get("pre_tokenizer") or {}).get("type") == "ByteLevel" and not serialized.get("decoder"):
        serialized["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    special = {name: getattr(tokenizer, name) for name in ("bos_token", "eos_token", "unk_token", "pad_token")
               if getattr(tokenizer, name, None) is not None}
    files = {
        "tokenizer.json": json.dumps(serialized, ensure_ascii=False, sort_keys=True) + "\n",
        "tokenizer_config.json": json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                                             **special}, indent=2, sort_keys=True) + "\n",
    }
    if tokenizer.chat_template:
        files["chat_template.jinja"] = tokenizer.chat_template
    return files


def _write(gguf: Path, directory: Path) -> None:
    """Write the Hugging Face files of `gguf` into the (new, empty) `directory`."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eyas.models.fingerprint import read_model_config

    config = llama_config(read_model_config(gguf), gguf)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
                                                 local_files_only=True)
    tensors = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()
               if not (config["tie_word_embeddings"] and name == "lm_head.weight")}  # name -> float32 tensor
    write_atomic(directory / WEIGHTS, lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
    write_json_atomic(directory / "config.json", config)
    write_json_atomic(directory / "generation_config.json",
                      {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]})
    for name, text in tokenizer_files(tokenizer).items():
        write_text_atomic(directory / name, text)


def materialise_gguf(gguf: Path, directory: Path) -> Path:
    """Return `directory`, holding `gguf` as a Hugging Face model directory (written once; reused after).

    Written into a temporary sibling and renamed, so a crash or a second process at the same time
    never leaves a half-written directory that looks finished. Refuses a non-Llama GGUF.
    """
    if (directory / READY).is_file():
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    building = directory.with_name(f".{directory.name}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir()
    try:
        _write(gguf, building)
        write_text_atomic(building / READY, f"{gguf.name}\n")
        if directory.exists() and not (directory / READY).is_file():
            shutil.rmtree(directory, ignore_errors=True)  # an unfinished one from a crash
        try:
            os.rename(building, directory)
        except OSError:  # another process finished first
            if not (directory / READY).is_file():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return directory
