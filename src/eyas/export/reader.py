"""Reading published EAGLE-3 drafts (EAGLE-3 HF format, speculators) into eyas's draft, and checking them.

P-EAGLE drafts and EAGLE-3.1's options are read as vLLM reads them: a draft is P-EAGLE when its speculators
type is `peagle` or it holds a `mask_hidden` tensor, its mask token is `mask_token_id` (or `pard_token`,
`ptd_token_id`), and `fc_norm` / `norm_output` are taken from the top level or the layer config.

Every problem found is collected (missing keys, missing, unexpected or misshaped tensors, a broken
vocabulary mapping, sizes or layer ids that do not fit the target) so a check reports them all at
once. The target is needed only to resolve default layer ids and to check against it.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eyas.draft.config import CONFIG_FILE, DraftConfig
from eyas.draft.model import Eagle3Draft, non_finite_problems
from eyas.errors import EyasError, UnreadableInput
from eyas.export.formats import HF_ARCHITECTURE, SPECULATORS_ARCHITECTURES, eyas_name
from eyas.files import read_json_object, read_tensors, reading
from eyas.models.fingerprint import TargetFingerprint
from eyas.models.layers import Convention, default_aux_layers, to_input_convention

LAYER_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")  # required integers
OPTIONAL_INTEGERS = ("num_key_value_heads", "head_dim", "num_hidden_layers", "max_position_embeddings")
OPTIONAL_NUMBERS = ("rms_norm_eps", "rope_theta")
TOP_INTEGERS = ("target_hidden_size", "draft_vocab_size")  # at the top of config.json in every format


@dataclass
class Published:
    """A published draft as read: its format, config, layer keys, tensors under eyas's names, and the config
    fields eyas cannot use (`field_problems`: no config can be built while there are any)."""

    path: Path
    kind: str  # "eagle3-hf" or "speculators"
    config: dict[str, Any]
    layer: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    ids: list[int] | None
    convention: Convention | None  # of `ids`, when the files say it
    problems: list[str] = field(default_factory=list)


def _weight_files(path: Path) -> list[Path]:
    safetensors = sorted(path.glob("*.safetensors"))
    return safetensors or sorted(path.glob("pytorch_model*.bin"))


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Return every tensor of the checkpoint (safetensors; `.bin` through torch's weights-only loader, no code runs);
    refuses a weights file that cannot be read (missing, truncated), in one line naming it."""
    files = _weight_files(path)
    if not files:
        raise EyasError(f"{path}: no *.safetensors or pytorch_model*.bin weights")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        loaded = read_tensors(file) if file.suffix == ".safetensors" else _load_bin(file)
        if not isinstance(loaded, dict):
            raise EyasError(f"{file}: expected a state dict")
        tensors.update(loaded)
    return tensors


def _load_bin(file: Path) -> object:
    """Return what a `pytorch_model*.bin` holds, through torch's weights-only loader; refuses a file torch cannot
    unpickle (truncated, not a checkpoint, or needing code to load) in one line naming it."""
    try:
        with reading(file):
            return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise UnreadableInput(file, "not a checkpoint of plain tensors (torch's weights-only loader refused it; eyas "
                                    "runs no code from a checkpoint)") from None
    except (RuntimeError, EOFError) as error:
        reason = str(error).split(". ")[0] or type(error).__name__
        raise UnreadableInput(file, f"not a readable PyTorch checkpoint ({reason})") from None


def read_published(path: Path) -> Published:
    """Return the published draft in directory `path`; refuses a directory that is no EAGLE-3 draft."""
    config_path = path / CONFIG_FILE
    config = read_json_object(config_path)
    architectures = config.get("architectures") or []
    provenance = config.get("eyas") if isinstance(config.get("eyas"), dict) else {}
    if config.get("speculators_model_type") in ("eagle3", "peagle") or set(architectures) & set(SPECULATORS_ARCHITECTURES):
        kind, layer = "speculators", config.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise EyasError(f"{config_path}: transformer_layer_config: missing (a speculators EAGLE-3 config has it)")
        ids, convention = config.get("eagle_aux_hidden_state_layer_ids"), "input"
    elif HF_ARCHITECTURE in architectures:
        kind, layer = "eagle3-hf", config
        eagle = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
        ids = eagle.get("eagle_aux_hidden_state_layer_ids", config.get("eagle_aux_hidden_state_layer_ids"))
        convention = provenance.get("layer_convention")
    else:
        raise EyasError(f"{config_path}: architectures: {architectures} is no EAGLE-3 draft "
                        f"({HF_ARCHITECTURE} or {'/'.join(SPECULATORS_ARCHITECTURES)})")
    if ids is not None and not (isinstance(ids, list) and all(type(i) is int for i in ids)):
        raise EyasError(f"{config_path}: eagle_aux_hidden_state_layer_ids: {ids!r} is no list of integers")
    published = Published(path, kind, config, layer, {}, list(ids) if ids else None, convention)
    published.problems += field_problems(config_path, config, layer)
    for name, tensor in _load_tensors(path).items():
        mapped = eyas_name(name)
        if mapped is not None:
            published.tensors[mapped] = tensor
    return published


def _type_problem(value: Any, integer: bool) -> str | None:
    """Return why a config value is not an integer (`integer`) or a number, as JSON spells it (None: it is)."""
    if type(value) is int or (not integer and type(value) is float):
        return None
    return f"expected {'an integer' if integer else 'a number'}, got {json.dumps(value)}"


def field_problems(config_path: Path, config: dict[str, Any], layer: dict[str, Any]) -> list[str]:
    """Return one problem per size or hyperparameter eyas reads from a published config that it cannot use:
    a required integer (`LAYER_KEYS`) missing, or any of them, given, of another type (`"64"` for 64).
    Values of the right type that are out of range are `checked_config`'s to refuse."""
    problems = [f"{config_path}: {key}: missing" for key in LAYER_KEYS if layer.get(key) is None]
    given = [(key, layer, True) for key in (*LAYER_KEYS, *OPTIONAL_INTEGERS)]
    given += [(key, layer, False) for key in OPTIONAL_NUMBERS] + [(key, config, True) for key in TOP_INTEGERS]
    for key, source, integer in given:
        if source.get(key) is not None and (problem := _type_problem(source[key], integer)):
            problems.append(f"{config_path}: {key}: {problem}")
    return problems


def draft_config_of(published: Published, aux_ids: list[int], target: TargetFingerprint | None) -> DraftConfig:
    """Return eyas's config for the published draft with `aux_ids` (input convention); raises pydantic's
    `ValidationError` for values out of range. Only for a draft without `field_problems`."""
    from eyas import __version__

    layer, config = published.layer, published.config
    hidden, heads = layer["hidden_size"], layer["num_attention_heads"]
    scaling = layer.get("rope_scaling")
    values = {
        "hidden_size": hidden, "target_hidden_size": config.get("target_hidden_size") or hidden,
        "intermediate_size": layer["intermediate_size"], "num_attention_heads": heads,
        "num_key_value_heads": layer.get("num_key_value_heads") or heads,
        "head_dim": layer.get("head_dim") or hidden // max(heads, 1),
        "num_hidden_layers": layer.get("num_hidden_layers") or 1, "rms_norm_eps": float(layer.get("rms_norm_eps") or 1e-6),
        "rope_theta": float(layer.get("rope_theta") or (scaling or {}).get("rope_theta") or 10000.0),
        "rope_scaling": {k: v for k, v in scaling.items() if k != "rope_theta"} if isinstance(scaling, dict)
        and scaling.get("rope_type", scaling.get("type", "default")) != "default" else None,
        "max_position_embeddings": layer.get("max_position_embeddings") or 4096,
        "vocab_size": layer["vocab_size"],
        "draft_vocab_size": config.get("draft_vocab_size") or layer["vocab_size"],
        "aux_layer_ids": aux_ids, "target": target, "eyas_version": __version__, **_family_of(published),
    }
    return DraftConfig.model_validate(values)


MASK_TOKEN_KEYS = ("mask_token_id", "pard_token", "ptd_token_id")


def _family_of(published: Published) -> dict[str, Any]:
    """Return the config's `family`, EAGLE-3.1 options and mask token as vLLM reads them (module docstring)."""
    config, layer = published.config, published.layer
    parallel = config.get("speculators_model_type") == "peagle" or "mask_hidden" in published.tensors
    options: dict[str, Any] = {name: bool(config.get(name, layer.get(name, False))) for name in ("fc_norm", "norm_output")}
    if parallel:
        options["family"] = "peagle"
        options["mask_token_id"] = next((source[key] for key in MASK_TOKEN_KEYS for source in (config, layer)
                                         if source.get(key) is not None), None)
    return options


def _expected_shapes(config: DraftConfig) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        return {name: tuple(t.shape) for name, t in Eagle3Draft(config).trainable_state().items()}


def vocab_problems(d2t: torch.Tensor, t2d: torch.Tensor | None, vocab: int) -> list[str]:
    """Return what is wrong with a draft->target mapping `d2t [N]` (and `t2d [V]` when present)."""
    if d2t.dtype not in (torch.int64, torch.int32):
        return [f"d2t: dtype {d2t.dtype}, expected int64 offsets"]
    ids = torch.arange(len(d2t)) + d2t.long()
    problems = []
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        problems.append(f"d2t: maps draft ids to target ids outside [0, {vocab})")
    elif len(ids) > 1 and not bool((ids[1:] > ids[:-1]).all()):
        problems.append("d2t: target ids are not strictly increasing (offsets, not ids? duplicated tokens?)")
    if t2d is not None and not problems:
        if t2d.dtype != torch.bool or t2d.shape != (vocab,):
            problems.append(f"t2d: {t2d.dtype} {list(t2d.shape)}, expected bool [{vocab}]")
        elif int(t2d.sum()) != len(ids) or not bool(t2d[ids].all()):
            problems.append("t2d: does not mark exactly the target ids of d2t")
    return problems


def tensor_problems(published: Published, config: DraftConfig) -> list[str]:
    """Return missing, unexpected and misshaped tensors, vocabulary-mapping problems and tensors holding NaN or
    Inf (`eyas.draft.model.non_finite_problems`)."""
    expected = _expected_shapes(config)
    tensors = published.tensors
    problems = []
    if "norm.weight" in tensors and tensors["norm.weight"].shape != (config.hidden_size,):
        problems.append(f"hidden_size: {config.hidden_size} in {CONFIG_FILE}, the weights are "
                        f"{tensors['norm.weight'].shape[0]} wide (norm.weight)")
    problems += [f"{name}: missing" for name in expected if name not in tensors and name not in ("d2t", "t2d")]
    problems += [f"{name}: unexpected tensor" for name in tensors if name not in expected]
    problems += [f"{name}: shape {list(tensors[name].shape)}, config implies {list(shape)}"
                 for name, shape in expected.items() if name in tensors and tuple(tensors[name].shape) != shape]
    if "d2t" in tensors:
        problems += vocab_problems(tensors["d2t"], tensors.get("t2d"), config.vocab_size)
    elif config.draft_vocab_size != config.vocab_size:
        problems.append(f"d2t: missing, and the draft vocabulary ({config.draft_vocab_size}) is not the target's "
                        f"({config.vocab_size})")
    return problems + non_finite_problems(tensors)


def _ids_field(published: Published) -> str:
    """Return the file and key the published draft's aux layer ids are read from, for messages."""
    return f"{published.path / CONFIG_FILE}: eagle_aux_hidden_state_layer_ids"


def _written_convention(published: Published, convention: Convention | None) -> Convention:
    """Return the convention the published ids count in: the files' word, else `convention`; refuses
    the two disagreeing, or neither saying."""
    where = _ids_field(published)
    if published.convention and convention and published.convention != convention:
        raise EyasError(f"{where}: written in the {published.convention} convention, --layer-convention says {convention}")
    known = published.convention or convention
    if known is None:
        raise EyasError(f"{where}: {published.ids} could count inputs of layers (vLLM-made drafts) or outputs "
                        "(SGLang, SpecForge, ModelOpt); pass --layer-convention input|output")
    return known


def resolve_ids(published: Published, convention: Convention | None, num_layers: int | None) -> list[int]:
    """Return the aux layer ids in eyas's input convention (EAGLE-3's defaults for a `num_layers`-layer
    target when the files give none); refuses ids whose convention is unknown, and ids that
    `eyas.models.layers.check_layer_ids` refuses for an engine (in range only when `num_layers` is known)."""
    where = _ids_field(published)
    if published.ids is None:
        if num_layers is None:
            raise EyasError(f"{where}: not given (EAGLE-3's defaults depend on the target: pass --target)")
        try:
            return default_aux_layers(num_layers, "write the ids there")
        except EyasError as error:
            raise EyasError(f"{where}: not given, and the target's {error}") from None
    return to_input_convention(published.ids, _written_convention(published, convention), num_layers, where, engine=True)
