"""The draft's configuration: sizes taken from the target, the draft vocabulary, and provenance.

Written as the draft directory's `config.json`. The keys engines read (`hidden_size`,
`draft_vocab_size`, `target_hidden_size`, `rope_theta`, `rope_scaling`, ...) are named as in the
EAGLE-3 Hugging Face format; the aux layer ids are stored in eyas's input convention and the
convention is recorded next to them (export converts them per engine).

`family` names the draft family (DESIGN 4b) that the weights belong to:

- `eagle3`: the autoregressive EAGLE-3 draft, trained with training-time test;
- `peagle`: P-EAGLE, the same layers drafting K tokens in one forward: the slots past the first read
  the token `mask_token_id` and the learned `mask_hidden` feature instead of the previous draft step;
- `dflash`: DFlash, `num_hidden_layers` Qwen3-style layers whose queries are a block of `block_size`
  tokens (the last committed token, then `mask_token_id`s) and whose keys and values also hold the
  target's features of the context (eyas.draft.dflash); it reads the target's whole vocabulary through
  the target's LM head.

EAGLE-3.1's options, for either family: `fc_norm` (an RMSNorm per aux feature before `fc`) and
`norm_output` (each draft step passes its post-norm output to the next, not its pre-norm one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, ValidationError, ValidationInfo, field_validator

from eyas.config import Family
from eyas.errors import EyasError
from eyas.files import read_json_object
from eyas.models.fingerprint import OTHER_VERSION, TargetFingerprint
from eyas.models.layers import layer_id_problems

ARCHITECTURE = "EyasEagle3Draft"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
MASKED: tuple[Family, ...] = ("peagle", "dflash")  # the families whose parallel slots read a mask token


class DraftConfig(BaseModel):
    """Everything needed to rebuild the draft and to check it belongs to a target and a store."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    architectures: list[str] = [ARCHITECTURE]
    hidden_size: PositiveInt
    target_hidden_size: PositiveInt
    intermediate_size: PositiveInt
    num_attention_heads: PositiveInt
    num_key_value_heads: PositiveInt
    head_dim: PositiveInt
    num_hidden_layers: PositiveInt = 1
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: PositiveInt = 4096
    vocab_size: PositiveInt
    draft_vocab_size: PositiveInt
    aux_layer_ids: list[int]
    layer_convention: Literal["input"] = "input"
    family: Family = "eagle3"
    fc_norm: bool = False
    norm_output: bool = False
    mask_token_id: NonNegativeInt | None = Field(None, validate_default=True)
    block_size: PositiveInt | None = Field(None, validate_default=True)
    target: TargetFingerprint | None = None
    eyas_version: str = ""

    @field_validator("mask_token_id")
    @classmethod
    def _mask_token_of_the_family(cls, value: int | None, info: ValidationInfo) -> int | None:
        family, vocab = info.data.get("family"), info.data.get("vocab_size")
        if (value is None) != (family not in MASKED):
            raise ValueError(f"{value}; a peagle or dflash draft needs one (the token its parallel slots read) and "
                             f"an {family} draft has none")
        if value is not None and vocab is not None and value >= vocab:
            raise ValueError(f"{value} is outside the {vocab}-token vocabulary")
        return value

    @field_validator("block_size")
    @classmethod
    def _block_of_dflash(cls, value: int | None, info: ValidationInfo) -> int | None:
        family = info.data.get("family")
        if (value is None) != (family != "dflash") or (value is not None and value < 2):
            raise ValueError(f"{value}; a dflash draft needs one of at least 2 (the last committed token and the "
                             f"masks it drafts) and an {family} draft has none")
        return value

    @property
    def num_aux(self) -> int:
        return len(self.aux_layer_ids)

    @property
    def parallel(self) -> bool:
        """Whether the draft proposes a block in one forward (P-EAGLE, DFlash) rather than token by token."""
        return self.family in MASKED


def _rope_of(target_config: Any) -> tuple[float, dict[str, Any] | None]:
    """Return `(rope_theta, rope_scaling)` of a transformers config, in the legacy (4.x) spelling."""
    params = getattr(target_config, "rope_parameters", None)
    if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):
        params = params["full_attention"]  # per-layer-type parameters (Gemma): global layers
    if isinstance(params, dict) and "rope_theta" in params:
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        return float(params["rope_theta"]), scaling if scaling.get("rope_type", "default") != "default" else None
    scaling = getattr(target_config, "rope_scaling", None)
    return float(getattr(target_config, "rope_theta", 10000.0)), dict(scaling) if scaling else None


def default_mask_token(target_config: Any) -> int:
    """Return the token a P-EAGLE draft's parallel slots read when none is given: the target's padding token
    where its config names one, else the last id of its vocabulary. Its (frozen) embedding only marks a slot
    as masked; the learned `mask_hidden` carries the rest."""
    text = getattr(target_config, "text_config", None) or target_config
    pad = getattr(text, "pad_token_id", None)
    return int(pad) if isinstance(pad, int) and 0 <= pad < int(text.vocab_size) else int(text.vocab_size) - 1


def draft_config_for_target(target_config: Any, aux_layer_ids: list[int], draft_vocab_size: int,
                            target: TargetFingerprint | None, overrides: dict[str, Any] | None = None) -> DraftConfig:
    """Return the draft config whose sizes, heads and rope are the target's, updated with `overrides`
    (a `peagle` or `dflash` family without a `mask_token_id` gets `default_mask_token`).

    Refuses a hidden size different from the target's: the draft reads the target's (frozen)
    embedding, so both must have the same width.
    """
    from eyas import __version__

    text = getattr(target_config, "text_config", None) or target_config
    hidden = int(text.hidden_size)
    heads = int(text.num_attention_heads)
    theta, scaling = _rope_of(text)
    values: dict[str, Any] = {
        "hidden_size": hidden, "target_hidden_size": hidden,
        "intermediate_size": int(getattr(text, "intermediate_size", None) or 4 * hidden),
        "num_attention_heads": heads,
        "num_key_value_heads": int(getattr(text, "num_key_value_heads", None) or heads),
        "head_dim": int(getattr(text, "head_dim", None) or hidden // heads),
        "rms_norm_eps": float(getattr(text, "rms_norm_eps", None) or getattr(text, "layer_norm_eps", None) or 1e-6),
        "rope_theta": theta, "rope_scaling": scaling,
        "max_position_embeddings": int(getattr(text, "max_position_embeddings", None) or 4096),
        "vocab_size": int(text.vocab_size), "draft_vocab_size": draft_vocab_size, "aux_layer_ids": list(aux_layer_ids),
        "target": target, "eyas_version": __version__,
    }
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    if values.get("family") in MASKED and values.get("mask_token_id") is None:
        values["mask_token_id"] = default_mask_token(target_config)
    if values["hidden_size"] != hidden:
        raise EyasError(f"draft hidden_size: {values['hidden_size']} differs from the target's {hidden}; "
                        "the draft shares the target's embedding, so they must match")
    try:
        return DraftConfig.model_validate(values)
    except ValidationError as exc:
        raise EyasError(f"draft config: {str(exc).splitlines()[0]}: {exc.errors()[0]['msg']}") from None


def read_draft_config(draft_dir: Path) -> DraftConfig:
    """Return the config of a draft directory written by eyas; refuses a missing or foreign one."""
    path = draft_dir / CONFIG_FILE
    raw = read_json_object(path, f"is {draft_dir} a draft written by `eyas train`?")
    if raw.get("architectures") != [ARCHITECTURE]:
        raise EyasError(f"{path}: architectures: {raw.get('architectures')} is not an eyas draft "
                        f"({ARCHITECTURE}); published drafts are read by `eyas import`")
    try:
        return DraftConfig.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(map(str, error["loc"])) or "config"
        raise EyasError(f"{path}: {field}: {error['msg']}") from None


def _fingerprint_problems(trained_for: TargetFingerprint | None, fingerprint: TargetFingerprint | None) -> list[str]:
    """Return how the target a draft was trained for differs from `fingerprint` (empty when the same,
    or when either is unknown)."""
    if trained_for is None or fingerprint is None or trained_for.id == fingerprint.id:
        return []
    differs = [k for k in ("config", "tokenizer", "chat_template", "weights")
               if getattr(trained_for, k) != getattr(fingerprint, k)]
    which = ", ".join(differs) or "vocab size"
    if trained_for.same_file_otherwise_hashed(fingerprint):
        which += f" differ: {OTHER_VERSION}; the draft likely fits, but eyas cannot tell: rerun `eyas train` with this eyas"
    else:
        which += " differ"
    return [f"target: trained for fingerprint {trained_for.id[:12]}, this target is {fingerprint.id[:12]} ({which})"]


def target_problems(config: DraftConfig, fingerprint: TargetFingerprint | None, target_config: Any,
                    layer_ids: bool = True) -> list[str]:
    """Return why a draft cannot run with a target (empty when it can), one line each: another
    fingerprint (when both the draft and `fingerprint` name one), a hidden size or vocabulary size
    other than the target's, or (with `layer_ids`) aux layer ids the target cannot give
    (`eyas.models.layers`; `eyas check-draft` checks them in the engine's convention itself). Needs
    no weights. `eyas eval`, `eyas check-draft`, `eyas import --target` and warm starts all check here."""
    text = getattr(target_config, "text_config", None) or target_config
    hidden, layers, vocab = int(text.hidden_size), int(text.num_hidden_layers), int(text.vocab_size)
    problems = _fingerprint_problems(config.target, fingerprint)
    if config.target_hidden_size != hidden:
        problems.append(f"target_hidden_size: {config.target_hidden_size}, the target's hidden size is {hidden}")
    if config.hidden_size != hidden:
        problems.append(f"hidden_size: {config.hidden_size}, the target's (whose embedding the draft reads) is {hidden}")
    if config.vocab_size != vocab:
        problems.append(f"vocab_size: {config.vocab_size}, the target's vocabulary has {vocab} tokens")
    id_problems = layer_id_problems(config.aux_layer_ids, config.layer_convention, layers) if layer_ids else []
    if id_problems:
        problems.append(f"aux_layer_ids: {config.aux_layer_ids}, the target has {layers} layers: "
                        + "; ".join(id_problems))
    return problems
