"""`eyas export`: an eyas draft directory written in the format an engine loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from eyas.config import ExportConfig
from eyas.draft.config import CONFIG_FILE, WEIGHTS_FILE, DraftConfig, read_draft_config
from eyas.draft.model import load_draft
from eyas.errors import EyasError
from eyas.export.formats import CONVENTION_OF, HF_ARCHITECTURE, Format, engine_name
from eyas.files import sha256_file, write_atomic, write_json_atomic
from eyas.stage import Stage
from eyas.models.layers import to_engine_ids

PROVENANCE = "eyas"
EXPORT = Stage("export", "an eyas export", (CONFIG_FILE, WEIGHTS_FILE))


def _layer_config(config: DraftConfig) -> dict[str, Any]:
    """Return the Llama-style keys describing the draft's decoder layer(s)."""
    return {
        "model_type": "llama", "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim, "num_hidden_layers": config.num_hidden_layers, "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta, "rope_scaling": config.rope_scaling,
        "max_position_embeddings": config.max_position_embeddings, "vocab_size": config.vocab_size,
        "hidden_act": "silu", "tie_word_embeddings": False,
    }


def _option_keys(config: DraftConfig) -> dict[str, bool]:
    """Return the keys vLLM reads for the EAGLE-3.1 options the draft has (none for a plain EAGLE-3 draft, whose
    config stays as before)."""
    return {name: True for name in ("fc_norm", "norm_output") if getattr(config, name)}


def _mask_key(config: DraftConfig) -> dict[str, int]:
    """Return P-EAGLE's `mask_token_id` key (none for an EAGLE-3 draft)."""
    return {"mask_token_id": config.mask_token_id} if config.mask_token_id is not None else {}


def dflash_config(config: DraftConfig, dtype: str, provenance: dict[str, Any]) -> dict[str, Any]:
    """Return the `config.json` of a DFlash draft in z-lab's format, which vLLM 0.32 (`DFlashDraftModel`) and the
    `dflash` package load: Qwen3 layer keys, the block size, and `dflash_config` with the mask token and the
    aux layers as `target_layer_ids`, which count decoder-layer outputs (eyas's input-convention id minus one).
    `layer_types` of full attention make every layer bidirectional inside the block, as trained."""
    assert config.block_size is not None and config.mask_token_id is not None  # a dflash config has both
    return {
        "architectures": ["DFlashDraftModel"], **_layer_config(config), "model_type": "qwen3", "attention_bias": False,
        "layer_types": ["full_attention"] * config.num_hidden_layers, "target_hidden_size": config.target_hidden_size,
        "block_size": config.block_size, "torch_dtype": dtype,
        "dflash_config": {"mask_token_id": config.mask_token_id,
                          "target_layer_ids": to_engine_ids(config.aux_layer_ids, "output")},
        PROVENANCE: {**provenance, "layer_convention": "output"},
    }


def engine_config(config: DraftConfig, fmt: Format, dtype: str, verifier: str | None,
                  verifier_architectures: list[str], speculative_tokens: int) -> dict[str, Any]:
    """Return the `config.json` of the draft in format `fmt` (layer ids in that format's convention).

    EAGLE-3.1's options and P-EAGLE's `mask_token_id` go where vLLM 0.32 reads them: top-level in the HF
    format; in the speculators format, `speculators_model_type: peagle` with `mask_token_id` top-level and
    the options inside `transformer_layer_config` (vLLM's peagle reader copies only that), or top-level
    for eagle3 (whose reader does)."""
    ids = to_engine_ids(config.aux_layer_ids, CONVENTION_OF[fmt])
    provenance = {"layer_convention": CONVENTION_OF[fmt], "aux_layer_ids_input_convention": config.aux_layer_ids,
                  "family": config.family,
                  "target": config.target.model_dump() if config.target else None, "eyas_version": config.eyas_version}
    if config.family == "dflash":
        return dflash_config(config, dtype, provenance)
    options = _option_keys(config)
    if fmt == "speculators":
        peagle = config.family == "peagle"
        layer = {**_layer_config(config), **options} if peagle else _layer_config(config)
        return {
            "architectures": ["Eagle3Speculator"], "speculators_model_type": "peagle" if peagle else "eagle3",
            "transformer_layer_config": layer, "draft_vocab_size": config.draft_vocab_size,
            **(_mask_key(config) if peagle else options),
            "norm_before_residual": False, "target_hidden_size": config.target_hidden_size,
            "eagle_aux_hidden_state_layer_ids": ids, "torch_dtype": dtype,
            "speculators_config": {
                "algorithm": "eagle3", "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens}],
                "verifier": {"name_or_path": verifier, "architectures": verifier_architectures},
            },
            PROVENANCE: provenance,
        }
    return {
        "architectures": [HF_ARCHITECTURE], **_layer_config(config), "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size, "torch_dtype": dtype, **options, **_mask_key(config),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
        PROVENANCE: provenance,
    }


def _embedding(config: ExportConfig, draft: DraftConfig) -> torch.Tensor:
    """Return the target's input embedding `[V, H]` for `--with-embedding`; refuses another target's."""
    from eyas.models.fingerprint import target_fingerprint
    from eyas.models.head import load_target_head
    from eyas.models.tokenizer import load_tokenizer

    if config.target is None:
        raise EyasError("export: --with-embedding needs --target (the embedding is the target's, not saved in the draft)")
    fingerprint = target_fingerprint(config.target, load_tokenizer(config.target, config.trust_remote_code,
                                                                   config.chat_template))
    if draft.target is not None and draft.target.id != fingerprint.id:
        raise EyasError(f"{config.target}: not the target {config.draft} was trained for (fingerprints differ)")
    return load_target_head(config.target, torch.float32, "cpu", config.trust_remote_code).embed


def run_export(config: ExportConfig) -> Path:
    """Write the draft of `config.draft` in `config.format` to `config.out`; return `config.out`.

    Refuses, for SGLang, a multi-layer draft (its EAGLE-3 model has one layer) and a P-EAGLE draft or
    EAGLE-3.1's options (it reads none of them); and aux layer ids the format's convention cannot express.
    """
    draft_config = read_draft_config(config.draft)
    fmt: Format = config.format
    if draft_config.family == "dflash" and fmt != "vllm":
        raise EyasError(f"{config.draft / CONFIG_FILE}: family: dflash; --format vllm writes z-lab's DFlash format, "
                        "which vLLM and the dflash package load (eyas writes no other DFlash format yet)")
    if fmt == "sglang" and draft_config.num_hidden_layers > 1:
        raise EyasError(f"{config.draft / CONFIG_FILE}: num_hidden_layers: {draft_config.num_hidden_layers}; SGLang's "
                        "EAGLE-3 draft has one layer (use --format vllm or speculators)")
    if fmt == "sglang" and (unread := [*_option_keys(draft_config)]
                            + (["family: peagle"] if draft_config.family == "peagle" else [])):
        raise EyasError(f"{config.draft / CONFIG_FILE}: {', '.join(unread)}; SGLang's EAGLE-3 draft reads none of "
                        "these (use --format vllm or speculators)")
    state = load_draft(config.draft).trainable_state()
    if draft_config.draft_vocab_size == draft_config.vocab_size:
        # the identity mapping: vLLM builds no mapping parameter for a full vocabulary and refuses one given
        state = {name: tensor for name, tensor in state.items() if name not in ("d2t", "t2d")}
    if draft_config.family == "dflash":  # its LM head is the target's, which the engines share
        state = {name: tensor for name, tensor in state.items() if name != "lm_head.weight"}
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[config.dtype] \
        if config.dtype else state["fc.weight"].dtype
    # speculators and DFlash name layers.N always; a one-layer EAGLE-3 HF draft names it midlayer
    layers = draft_config.num_hidden_layers if fmt != "speculators" and draft_config.family != "dflash" else 0
    tensors = {engine_name(name, layers): t.to(dtype) if t.is_floating_point() else t for name, t in state.items()}
    if config.with_embedding:
        tensors["embed_tokens.weight"] = _embedding(config, draft_config).to(dtype)
    verifier = config.verifier or (str(config.target) if config.target else None)
    architectures = []
    if config.target is not None:
        from eyas.models.fingerprint import read_model_config

        architectures = list(read_model_config(config.target).get("architectures") or [])
    body = engine_config(draft_config, fmt, str(dtype).removeprefix("torch."), verifier, architectures,
                         config.speculative_tokens)
    EXPORT.claim(config, {"config": body, "weights": sha256_file(config.draft / WEIGHTS_FILE)})
    write_atomic(config.out / WEIGHTS_FILE,
                 lambda tmp: save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata={"format": "pt"}))
    write_json_atomic(config.out / CONFIG_FILE, body)
    return config.out
