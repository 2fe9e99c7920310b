"""Target fingerprints: content hashes that tie every artifact to the target it was made for."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from eyas.errors import EyasError
from eyas.files import read_json_object, sha256_file, sha256_text

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json",
)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


class TargetFingerprint(BaseModel):
    """Hashes of the parts of a target that change what eyas produces.

    `weights` hashes file names, sizes and the first and last MiB of each weight file (not all bytes:
    a 1T-parameter model cannot be hashed in
    seconds), plus any shard index. `id` hashes all the others.
    """

    model_config = ConfigDict(frozen=True)

    config: str
    tokenizer: str
    chat_template: str
    weights: str
    vocab_size: int
    id: str

    def tokenization_matches(self, other: TargetFingerprint) -> bool:
        """Return True when both targets turn text into the same token ids with the same template."""
        return (self.tokenizer, self.chat_template, self.vocab_size) == (
            other.tokenizer, other.chat_template, other.vocab_size)


def _combined(parts: list[tuple[str, str]]) -> str:
    digest = hashlib.sha256()
    for name, value in parts:
        digest.update(f"{name}\0{value}\n".encode())
    return digest.hexdigest()


def is_gguf(target: Path) -> bool:
    """Return True when the target is a single GGUF file (read through transformers' gguf support)."""
    return target.suffix == ".gguf"


def hf_location(target: Path) -> tuple[str, dict[str, str]]:
    """Return the `(path, extra kwargs)` that transformers' `from_pretrained` takes for this target."""
    return (str(target.parent), {"gguf_file": target.name}) if is_gguf(target) else (str(target), {})


def config_source(target: Path) -> Path:
    """Return the file a target's config comes from (for error messages)."""
    return target if is_gguf(target) else target / "config.json"


@functools.lru_cache(maxsize=4)
def _gguf_config(target: Path) -> dict[str, Any]:
    if importlib.util.find_spec("gguf") is None:
        raise EyasError(f"{target}: GGUF targets need the `gguf` package: pip install 'eyas[gguf]'")
    from transformers import AutoConfig

    path, kwargs = hf_location(target)
    try:
        return AutoConfig.from_pretrained(path, local_files_only=True, **kwargs).to_dict()
    except Exception as exc:  # unsupported GGUF architecture or a corrupt file
        raise EyasError(f"{target}: transformers cannot read this GGUF file: {str(exc).strip().splitlines()[0]}") from None


def read_model_config(target: Path) -> dict[str, Any]:
    """Return the config of a model directory (`config.json`) or GGUF file; refuses a missing or invalid one."""
    if not target.exists():
        raise EyasError(f"{target}: no such model directory or GGUF file (--target)")
    if target.is_file() and is_gguf(target):
        return _gguf_config(target.absolute())
    if not target.is_dir():
        raise EyasError(f"{target}: not a directory; --target takes a local Hugging Face model directory or a .gguf file")
    return read_json_object(target / "config.json", "--target takes a local Hugging Face model directory")


def config_vocab_size(target: Path, config: dict[str, Any]) -> int:
    """Return the target's vocabulary size (rows of its LM head) from its config."""
    for section in (config, config.get("text_config") or {}):
        size = section.get("vocab_size")
        if isinstance(size, int) and size > 0:
            return size
    raise EyasError(f"{config_source(target)}: vocab_size: missing (also looked in text_config)")


def weight_sample(path: Path, sample: int = 1 << 20) -> str:
    """Return `SIZE:SHA256` of a weight file's size and its first and last `sample` bytes: retrained
    weights of the same shapes differ there, and a terabyte of shards is not read."""
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        digest.update(handle.read(sample))
        if size > sample:
            handle.seek(max(sample, size - sample))
            digest.update(handle.read(sample))
    return f"{size}:{digest.hexdigest()}"


def target_fingerprint(target: Path, tokenizer: Any) -> TargetFingerprint:
    """Return the fingerprint of a local model directory or GGUF file, with its loaded tokenizer."""
    config = read_model_config(target)
    if is_gguf(target):  # the tokenizer lives inside the file: hash its full serialization
        tokenizer_parts = [("tokenizer.json", sha256_text(tokenizer.backend_tokenizer.to_str()))]
        weight_parts = [(target.name, weight_sample(target))]
    else:
        tokenizer_parts = [(n, sha256_file(target / n)) for n in TOKENIZER_FILES if (target / n).is_file()]
        weight_parts = [
            (p.name, weight_sample(p)) for p in sorted(target.iterdir()) if p.suffix in WEIGHT_SUFFIXES
        ] + [(p.name, sha256_file(p)) for p in sorted(target.glob("*.index.json"))]
    parts = {
        "config": sha256_text(json.dumps(config, sort_keys=True, default=str)),
        "tokenizer": _combined(tokenizer_parts),
        "chat_template": sha256_text(tokenizer.chat_template or ""),
        "weights": _combined(weight_parts),
        "vocab_size": config_vocab_size(target, config),
    }
    return TargetFingerprint(**parts, id=_combined([(k, str(v)) for k, v in parts.items()]))
