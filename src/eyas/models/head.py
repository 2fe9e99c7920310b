"""The few target tensors training needs besides the features: input embedding, final norm, LM head
(and, for `train.init_layer`, one decoder layer).

Offline training must not load a whole target to get them (a 1T-parameter model for three
tensors). The model is built on the meta device from its config, the parameter names of those
three modules are looked up, and only those tensors are read from the safetensors files. Files
that name the tensors differently are refused, not loaded whole; a target stored otherwise
(GGUF, .bin) can only be loaded whole, which is said on stderr.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from eyas.errors import EyasError
from eyas.models.fingerprint import is_gguf
from eyas.models.load import build_meta_target, load_config, load_target
from eyas.models.parts import TargetParts

INDEX_FILE = "model.safetensors.index.json"


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
    index = target / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        return {name: target / file for name, file in weight_map.items()}
    files: dict[str, Path] = {}
    for path in sorted(target.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            files.update({name: path for name in handle.keys()})
    return files


def _names_of(model: nn.Module, modules: list[nn.Module]) -> list[dict[str, str]]:
    """Return, per module, its parameter names relative to the module -> full names in `model`, by the
    module's own path (a tied LM head is `lm_head.weight`, not the embedding's name it shares a tensor with)."""
    paths = {id(m): name for name, m in model.named_modules(remove_duplicate=False)}
    return [{local: f"{paths[id(module)]}.{local}".lstrip(".") for local, _ in module.named_parameters()}
            for module in modules]


def _load_whole(target: Path, dtype: torch.dtype, device: str, trust_remote_code: bool, why: str) -> TargetHead:
    """Return the head of the whole target, loaded, after saying so (and `why`) in one line on stderr."""
    print(f"eyas: {target}: {why}: loading the whole target for its embedding, final norm and LM head", file=sys.stderr)
    return head_of(load_target(target, dtype, device, trust_remote_code))


def _read_tensors(files: dict[str, Path], names: list[str], dtype: torch.dtype, device: str) -> dict[str, torch.Tensor]:
    """Return the tensors `names` read from their safetensors `files`, in `dtype` on `device`."""
    read = {}
    for name in names:
        with safe_open(str(files[name]), framework="pt", device="cpu") as handle:
            read[name] = handle.get_tensor(name).to(device=device, dtype=dtype)
    return read


def load_target_layer(target: Path, index: int, dtype: torch.dtype, trust_remote_code: bool = False) -> dict[str, torch.Tensor]:
    """Return the weights of the target's decoder layer `index` (negative counts from the last), by their
    names inside the layer (`self_attn.q_proj.weight`, ...), on the CPU in `dtype`.

    From a safetensors directory only that layer's tensors are read; a GGUF or `.bin` target is loaded
    whole (said on stderr). Refuses an index outside the target's layers and safetensors files that lack
    a tensor of the layer, naming it.
    """
    config = load_config(target, trust_remote_code)
    meta = build_meta_target(config, dtype)
    count = meta.num_layers
    if not -count <= index < count:
        raise EyasError(f"init_layer: {index}: the target has {count} decoder layers (0..{count - 1}, or -1 for the last)")
    if is_gguf(target) or not any(target.glob("*.safetensors")):
        print(f"eyas: {target}: no safetensors weights to read tensors from: loading the whole target for its "
              f"decoder layer {index}", file=sys.stderr)
        layer = load_target(target, dtype, "cpu", trust_remote_code).layers[index]
        return {name: tensor.detach() for name, tensor in layer.state_dict().items()}
    files = _tensor_files(target)
    (names,) = _names_of(meta.model, [meta.layers[index]])
    missing = [full for full in names.values() if full not in files]
    if missing:
        raise EyasError(f"{target}: no tensor {', '.join(missing)} (decoder layer {index} of {type(meta.model).__name__})")
    read = _read_tensors(files, list(names.values()), dtype, "cpu")
    return {local: read[full] for local, full in names.items()}


def load_target_head(target: Path, dtype: torch.dtype, device: str, trust_remote_code: bool = False) -> TargetHead:
    """Return the target's embedding, final norm and LM head with their weights.

    From a safetensors directory only those tensors are read. Refuses one whose files do not hold
    them under the names the model's modules give, naming the files and the names looked for: it
    never loads a whole target (hundreds of GB for a large one) just because names differ. A GGUF
    or `.bin` target, or a final norm with buffers, cannot be read tensor by tensor: that target
    is loaded whole, said in one line on stderr.
    """
    if is_gguf(target):
        return _load_whole(target, dtype, device, trust_remote_code, "a GGUF file cannot be read tensor by tensor "
                           "(`eyas materialise` writes one as a directory that can, the same target at float32)")
    if not any(target.glob("*.safetensors")):
        return _load_whole(target, dtype, device, trust_remote_code, "no safetensors weights to read tensors from")
    config = load_config(target, trust_remote_code)
    meta = build_meta_target(config, dtype)
    if list(meta.final_norm.buffers()):
        why = f"its final norm ({type(meta.final_norm).__name__}) has buffers, which only a built model holds"
        return _load_whole(target, dtype, device, trust_remote_code, why)
    files = _tensor_files(target)
    embed_names, norm_names, head_names = _names_of(meta.model, [meta.embed, meta.final_norm, meta.lm_head])
    head_name = head_names["weight"]
    if head_name not in files and getattr(config, "tie_word_embeddings", False):
        head_name = embed_names["weight"]
    wanted = [embed_names["weight"], head_name, *norm_names.values()]
    missing = [name for name in wanted if name not in files]
    if missing:
        index = target / INDEX_FILE
        source = index if index.is_file() else target / "*.safetensors"
        raise EyasError(f"{source}: no tensor {', '.join(missing)} (looked for {', '.join(wanted)}, the names "
                        f"{type(meta.model).__name__} gives its embedding, final norm and LM head); eyas reads only "
                        "these, it does not load a whole target to find them")
    read = _read_tensors(files, wanted, dtype, device)
    norm = meta.final_norm.to_empty(device=device)
    norm.load_state_dict({local: read[full] for local, full in norm_names.items()})
    softcap = getattr(config, "final_logit_softcapping", None)
    return TargetHead(read[embed_names["weight"]], norm.eval(), read[head_name], softcap)
