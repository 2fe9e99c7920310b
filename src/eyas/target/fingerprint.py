"""Target fingerprints: content hashes that tie every artifact to the target it was made for."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from eyas.errors import EyasError
from eyas.files import sha256_file, sha256_text

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json",
)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


class TargetFingerprint(BaseModel):
    """Hashes of the parts of a target that change what eyas produces.

    `weights` hashes file names and sizes (not bytes: a 1T-parameter model cannot be hashed in
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


def read_model_config(target: Path) -> dict[str, Any]:
    """Return the parsed `config.json` of a model directory; refuses a missing or invalid one."""
    if not target.exists():
        raise EyasError(f"{target}: no such model directory (--target)")
    if not target.is_dir():
        raise EyasError(f"{target}: not a directory; --target takes a local Hugging Face model directory")
    path = target / "config.json"
    if not path.is_file():
        raise EyasError(f"{path}: not found; --target takes a local Hugging Face model directory")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise EyasError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg}") from None
    if not isinstance(config, dict):
        raise EyasError(f"{path}: expected a JSON object")
    return config


def config_vocab_size(target: Path, config: dict[str, Any]) -> int:
    """Return the target's vocabulary size (rows of its LM head) from its config."""
    for section in (config, config.get("text_config") or {}):
        size = section.get("vocab_size")
        if isinstance(size, int) and size > 0:
            return size
    raise EyasError(f"{target / 'config.json'}: vocab_size: missing (also looked in text_config)")


def target_fingerprint(target: Path, chat_template: str | None) -> TargetFingerprint:
    """Return the fingerprint of a local model directory and the chat template in effect."""
    config = read_model_config(target)
    tokenizer_parts = [(n, sha256_file(target / n)) for n in TOKENIZER_FILES if (target / n).is_file()]
    weight_parts = [
        (p.name, str(p.stat().st_size)) for p in sorted(target.iterdir()) if p.suffix in WEIGHT_SUFFIXES
    ] + [(p.name, sha256_file(p)) for p in sorted(target.glob("*.index.json"))]
    parts = {
        "config": sha256_text(json.dumps(config, sort_keys=True)),
        "tokenizer": _combined(tokenizer_parts),
        "chat_template": sha256_text(chat_template or ""),
        "weights": _combined(weight_parts),
        "vocab_size": config_vocab_size(target, config),
    }
    return TargetFingerprint(**parts, id=_combined([(k, str(v)) for k, v in parts.items()]))
