"""Load a target's tokenizer from a local model directory, offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eyas.errors import EyasError
from eyas.models.fingerprint import config_source, config_vocab_size, hf_location, read_model_config


def load_tokenizer(target: Path, trust_remote_code: bool = False) -> Any:
    """Return the fast tokenizer of a model directory or GGUF file `target` (never downloads).

    Refuses a directory without config.json, a tokenizer that fails to load, and a tokenizer
    with more tokens than the model's vocabulary.
    """
    vocab_size = config_vocab_size(target, read_model_config(target))
    from transformers import AutoTokenizer

    path, kwargs = hf_location(target)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code, **kwargs)
    except Exception as exc:  # transformers raises many types here (OSError, ValueError, ...)
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EyasError(f"{target}: cannot load the tokenizer: {first_line}") from None
    if len(tokenizer) > vocab_size:
        raise EyasError(
            f"{config_source(target)}: vocab_size: {vocab_size} is smaller than the tokenizer's {len(tokenizer)} tokens"
        )
    return tokenizer
