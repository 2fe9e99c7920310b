"""The few target tensors training needs besides the features: input embedding, final norm, LM head.

Offline training must not load a whole target to get them (a 1T-parameter model for three
tensors). The model is built on the meta device from its config, the parameter names of those
three modules are looked up, and only those tensors are read from the safetensors files. A
target stored otherwise (GGUF, .bin) or whose files name the tensors differently is loaded whole.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from eyas.target.fingerprint import is_gguf
from eyas.target.load import build_meta_target, load_config, load_target
from eyas.target.parts import TargetParts


@dataclass
class TargetHead:
    """`embed [V, H]`, the final norm module, `lm_head [V, H]` and Gemma's final-logit softcap (or None)."""

    embed: torch.Tensor
    final_norm: nn.Module
    lm_head: torch.Tensor
    softcap: float | None


def head_of(parts: TargetParts) -> TargetHead:
    """Return the head tensors of a loaded target (shared with it, not copied)."""
    softcap = getattr(parts.model.config, "final_logit_softcapping", None)
    return TargetHead(parts.embed.weight, parts.final_norm, parts.lm_head.weight, softcap)


def _tensor_files(target: Path) -> dict[str, Path]:
    """Return tensor name -> safetensors file of a local model dir (index or a scan of the files)."""
    index = target / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        return {name: target / file for name, file in weight_map.items()}
    files: dict[str, Path] = {}
    for path in sorted(target.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            files.update({name: path for name in handle.keys()})
    return files


def _names_of(model: nn.Module, modules: list[nn.Module]) -> list[dict[str, str]]:
    """Return, per module, its parameter names relative to the module -> full names in `model`."""
    full = {id(p): name for name, p in model.named_parameters(remove_duplicate=False)}
    return [{local: full[id(p)] for local, p in module.named_parameters()} for module in modules]


def load_target_head(target: Path, dtype: torch.dtype, device: str, trust_remote_code: bool = False) -> TargetHead:
    """Return the target's embedding, final norm and LM head with their weights, reading nothing else
    when the target is a safetensors directory; otherwise the whole target is loaded."""
    if not is_gguf(target):
        config = load_config(target, trust_remote_code)
        meta = build_meta_target(config, dtype)
        files = _tensor_files(target)
        embed_names, norm_names, head_names = _names_of(meta.model, [meta.embed, meta.final_norm, meta.lm_head])
        head_name = head_names["weight"]
        if head_name not in files and getattr(config, "tie_word_embeddings", False):
            head_name = embed_names["weight"]
        wanted = [embed_names["weight"], head_name, *norm_names.values()]
        if all(name in files for name in wanted) and not list(meta.final_norm.buffers()):
            read = {}
            for name in wanted:
                with safe_open(str(files[name]), framework="pt", device="cpu") as handle:
                    read[name] = handle.get_tensor(name).to(device=device, dtype=dtype)
            norm = meta.final_norm.to_empty(device=device)
            norm.load_state_dict({local: read[full] for local, full in norm_names.items()})
            softcap = getattr(config, "final_logit_softcapping", None)
            return TargetHead(read[embed_names["weight"]], norm.eval(), read[head_name], softcap)
    return head_of(load_target(target, dtype, device, trust_remote_code))
