"""A GGUF target written out as a Hugging Face model directory that vLLM and transformers both load
(`eyas materialise GGUF DIR`, and the embedded default target), for any architecture transformers
reads from GGUF.

eyas writes the files itself rather than calling `save_pretrained`: transformers 5 refuses to save
a GGUF-loaded model, and what each transformers line would save differs (4.57 cannot read the
`TokenizersBackend` class 5.x names). The bytes still differ between the two lines (CI found it),
so the default target's cache keeps one directory per transformers major line. The directory holds:

- `model.safetensors`: the tensors transformers dequantizes from the GGUF, under their Hugging Face
  names, in the dtype asked (float32 by default: bit-equal to what transformers computes with from
  the GGUF, so the directory is the same target as the file, `eyas.models.fingerprint`; bfloat16
  halves the size and rounds every weight); a tied LM head is not stored;
- `config.json`: transformers' config of the GGUF with `architectures` named, `dtype` recorded, the
  GGUF `quantization_config` dropped (vLLM refuses `gguf` as a quantization method), and a 5.x
  `rope_parameters` also spelled the 4.57 way (`rope_theta`, `rope_local_base_freq`, `rope_scaling`),
  which 4.57 reads instead, silently falling back to its default base otherwise;
- `tokenizer.json`: the GGUF tokenizer's own serialization, with a byte-level decoder wherever the
  pre-tokenizer is byte-level (so no engine detokenizes `Ġ`/`Ċ` into text); `tokenizer_config.json`
  names `PreTrainedTokenizerFast`, which loads `tokenizer.json` unchanged, and the special tokens;
  `chat_template.jinja`;
- `generation_config.json`: bos/eos only, so no engine applies sampling defaults of its own;
- `.materialised`, written last: the GGUF's fingerprint and every file's digest (a directory
  without it is unfinished). The whole directory is built in a hidden sibling and renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Literal

from eyas.errors import EyasError
from eyas.files import write_atomic, write_json_atomic, write_text_atomic
from eyas.models.fingerprint import PROVENANCE, gguf_parts, materialised_record, provenance

WEIGHTS = "model.safetensors"
READY = PROVENANCE
WeightDtype = Literal["float32", "bfloat16", "float16"]
_DROPPED = ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version")


def _legacy_rope(config: dict[str, Any]) -> dict[str, Any]:
    """Return the rotary fields of a 5.x `rope_parameters` (one set, or one per layer type) as 4.57 spells them."""
    parameters = config.get("rope_parameters")
    if not isinstance(parameters, dict):
        return {}
    full = parameters if "rope_theta" in parameters else parameters.get("full_attention") or {}
    legacy: dict[str, Any] = {"rope_theta": full.get("rope_theta")}
    if full.get("rope_type", "default") != "default":
        legacy["rope_scaling"] = full
    if "sliding_attention" in parameters:
        legacy["rope_local_base_freq"] = parameters["sliding_attention"].get("rope_theta")
    return {key: value for key, value in legacy.items() if value is not None and key not in config}


def hf_config(config: dict[str, Any], architecture: str, dtype: WeightDtype) -> dict[str, Any]:
    """Return `config.json` for a model of class `architecture` with weights in `dtype`, from transformers'
    config dict of a GGUF (either line): the GGUF's quantization_config and the loader's paths dropped."""
    kept = {key: value for key, value in config.items() if key not in _DROPPED}
    return {**kept, **_legacy_rope(kept), "architectures": [architecture], "dtype": dtype, "torch_dtype": dtype}


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


def _dequantizing() -> dict[str, Any]:
    """Return the `from_pretrained` kwargs that make transformers unpack every GGUF weight into a plain
    tensor: 5.x can keep some architectures' weights packed in GGUF blocks (`GgufConfig(dequantize=...)`);
    4.57 always unpacks."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _write(gguf: Path, directory: Path, dtype: WeightDtype) -> None:
    """Write the Hugging Face files of `gguf` with weights in `dtype` into the (new, empty) `directory`."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from eyas.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(gguf)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
                                                     local_files_only=True, **_dequantizing())
    except Exception as exc:  # an architecture transformers has no model class for, a corrupt tensor, ...
        raise EyasError(f"{gguf}: transformers cannot load its weights: {str(exc).strip().splitlines()[0]}") from None
    config = hf_config(model.config.to_dict(), type(model).__name__, dtype)
    tied = bool(getattr(model.config.get_text_config(), "tie_word_embeddings", False))
    tensors = {name: tensor.detach().to(getattr(torch, dtype)).contiguous()  # name -> [*shape] in `dtype`
               for name, tensor in model.state_dict().items() if not (tied and name == "lm_head.weight")}
    write_atomic(directory / WEIGHTS, lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
    write_json_atomic(directory / "config.json", config)
    write_json_atomic(directory / "generation_config.json",
                      {"bos_token_id": config.get("bos_token_id"), "eos_token_id": config.get("eos_token_id")})
    for name, text in tokenizer_files(tokenizer).items():
        write_text_atomic(directory / name, text)


def _is_this(directory: Path, gguf: Path, dtype: WeightDtype) -> bool:
    """Return whether `directory` is a finished, intact materialisation of `gguf` in `dtype`."""
    record = materialised_record(directory)
    return record is not None and record.get("dtype") == dtype and record["fingerprint"] == gguf_parts(gguf)


def _remove_abandoned(directory: Path) -> None:
    """Remove the building siblings of `directory` whose process is gone (killed mid-write)."""
    for building in directory.parent.glob(f".{directory.name}.building-*"):
        pid = building.name.rpartition("-")[2]
        try:
            os.kill(int(pid), 0)
        except (ValueError, ProcessLookupError):
            shutil.rmtree(building, ignore_errors=True)
        except PermissionError:  # another user's live process
            continue


def materialise_gguf(gguf: Path, directory: Path, dtype: WeightDtype = "float32") -> Path:
    """Return `directory`, holding `gguf` as a Hugging Face model directory with weights in `dtype`
    (written once; an intact earlier one is reused).

    Written into a hidden sibling and renamed, so a crash or a second process at the same time never
    leaves a half-written directory that looks finished. Refuses a file that is not GGUF, an
    architecture transformers cannot read from GGUF, and a `directory` holding anything else
    (another GGUF's or dtype's materialisation, or other files).
    """
    from eyas.models.gguf_file import is_gguf_file

    if not gguf.is_file() or not is_gguf_file(gguf):
        raise EyasError(f"{gguf}: not a GGUF file (no GGUF magic bytes); `eyas materialise` reads .gguf files")
    if directory.exists() and _is_this(directory, gguf, dtype):
        return directory
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        other = materialised_record(directory) if directory.is_dir() else None
        held = ("is not a directory" if not directory.is_dir() else "is not empty" if other is None
                else f"holds {other['gguf']} materialised in {other['dtype']}")
        raise EyasError(f"{directory}: {held}; give a new or empty directory")
    from eyas.models.fingerprint import read_model_config

    read_model_config(gguf)  # refuses an architecture transformers cannot read from GGUF, before any weight loads
    directory.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(directory)
    building = directory.with_name(f".{directory.name}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir()
    try:
        _write(gguf, building, dtype)
        write_json_atomic(building / READY, provenance(gguf, building, dtype))
        if directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
        try:
            os.rename(building, directory)
        except OSError:  # another process finished first
            if not _is_this(directory, gguf, dtype):
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return directory
