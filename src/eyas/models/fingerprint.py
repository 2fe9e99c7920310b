"""Target fingerprints: content hashes that tie every artifact to the target it was made for.

A GGUF file is fingerprinted from its own bytes (`eyas.models.gguf_file`): its tokenizer entries, its
architecture's hyper-parameters, the chat template in effect, a sample of the file; never from what
a transformers line builds out of it, which differs between lines (4.57, 5.19, 5.25). A directory
that `eyas materialise` wrote from a GGUF, while its files are as written, is the same target as
that GGUF: it takes the GGUF's tokenizer hash (so datasets carry over), and when materialised in
float32, whose weights equal the GGUF's as transformers dequantizes them, all of its fingerprint
(so feature stores and drafts carry over too).
"""

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
PROVENANCE = ".materialised"  # written last by `eyas materialise`: the GGUF's fingerprint and the files as written


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

    def same_file_otherwise_hashed(self, other: TargetFingerprint) -> bool:
        """Return True when `other` is the same files and template as this target but its tokenizer and
        config were hashed another way: an artifact made before eyas hashed GGUF files themselves, when
        their fingerprint was transformers' serialisation, which changes with the transformers line."""
        return ((self.weights, self.chat_template) == (other.weights, other.chat_template)
                and self.tokenizer != other.tokenizer and self.config != other.config)


OTHER_VERSION = "same file, other transformers/fingerprint version"  # the words for `same_file_otherwise_hashed`


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


def gguf_parts(target: Path) -> dict[str, Any]:
    """Return the config, tokenizer, weights and vocab_size parts of a GGUF file's fingerprint, from its bytes
    (read without transformers: the same under every transformers line); refuses a file that is not GGUF."""
    from eyas.models.gguf_file import read_gguf_metadata

    metadata = read_gguf_metadata(target)
    tokenizer = sorted((k, v) for k, v in metadata.entries.items()
                       if k.startswith("tokenizer.") and not k.startswith("tokenizer.chat_template"))
    config = sorted((k, v) for k, v in metadata.entries.items()
                    if k == "general.architecture" or k.startswith(f"{metadata.architecture}."))
    return {"config": _combined([(k, hashlib.sha256(v).hexdigest()) for k, v in config]),
            "tokenizer": _combined([(k, hashlib.sha256(v).hexdigest()) for k, v in tokenizer]),
            "weights": _combined([(target.name, weight_sample(target))]), "vocab_size": metadata.vocab_size}


def _file_digest(path: Path) -> str:
    """Return the digest a materialised directory records for one of its files (a sample for weights)."""
    return weight_sample(path) if path.suffix in WEIGHT_SUFFIXES else sha256_file(path)


def provenance(gguf: Path, directory: Path, dtype: str) -> dict[str, Any]:
    """Return the record `eyas materialise` writes last into `directory` made from `gguf` with weights in
    `dtype`: the GGUF's fingerprint parts, the dtype, and each file's digest as written."""
    return {"gguf": gguf.name, "dtype": dtype, "fingerprint": gguf_parts(gguf),
            "files": {p.name: _file_digest(p) for p in sorted(directory.iterdir()) if p.is_file() and p.name != PROVENANCE}}


def materialised_record(directory: Path) -> dict[str, Any] | None:
    """Return the provenance record of a directory `eyas materialise` finished, or None when it has none or
    any of its files differs from what was written (an unfinished, foreign or since edited directory)."""
    path = directory / PROVENANCE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        files = dict(record["files"])
        if not all((directory / name).is_file() and _file_digest(directory / name) == digest for name, digest in files.items()):
            return None
        return record if isinstance(record.get("fingerprint"), dict) else None
    except (ValueError, KeyError, TypeError, AttributeError, OSError):
        return None


def _adopted(target: Path) -> dict[str, Any]:
    """Return the GGUF fingerprint parts a materialised directory stands for: the tokenizer's, and all of
    them when its weights are float32 (equal to the GGUF's as transformers dequantizes them); none for
    any other directory."""
    record = materialised_record(target)
    if record is None:
        return {}
    parts = record["fingerprint"]
    return dict(parts) if record.get("dtype") == "float32" else {"tokenizer": parts["tokenizer"]}


def target_fingerprint(target: Path, tokenizer: Any) -> TargetFingerprint:
    """Return the fingerprint of a local model directory or GGUF file, with its loaded tokenizer (whose
    chat template, the one in effect, is hashed). A GGUF file is hashed from its own bytes."""
    if is_gguf(target):
        parts = gguf_parts(target)
    else:
        config = read_model_config(target)
        tokenizer_parts = [(n, sha256_file(target / n)) for n in TOKENIZER_FILES if (target / n).is_file()]
        weight_parts = [
            (p.name, weight_sample(p)) for p in sorted(target.iterdir()) if p.suffix in WEIGHT_SUFFIXES
        ] + [(p.name, sha256_file(p)) for p in sorted(target.glob("*.index.json"))]
        parts = {"config": sha256_text(json.dumps(config, sort_keys=True, default=str)),
                 "tokenizer": _combined(tokenizer_parts), "weights": _combined(weight_parts),
                 "vocab_size": config_vocab_size(target, config), **_adopted(target)}
    parts = {"config": parts["config"], "tokenizer": parts["tokenizer"],
             "chat_template": sha256_text(tokenizer.chat_template or ""), "weights": parts["weights"],
             "vocab_size": parts["vocab_size"]}
    return TargetFingerprint(**parts, id=_combined([(k, str(v)) for k, v in parts.items()]))
