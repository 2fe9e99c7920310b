"""The published EAGLE-3 checkpoint formats: tensor names, the layer-id convention of each format
(the conventions themselves live in `eyas.models.layers`) and config keys.

- `vllm`, `sglang`: the EAGLE-3 Hugging Face format (`architectures: ["LlamaForCausalLMEagle3"]`,
  `eagle_config.eagle_aux_hidden_state_layer_ids`), as SafeAILab/EAGLE, SpecForge and NVIDIA
  ModelOpt publish it. The layer ids are the engine's: vLLM reads id k as the *input* of decoder
  layer k (eyas's convention), SGLang (and SpecForge, ModelOpt) as the *output* of layer k,
  i.e. eyas's k+1. A one-layer draft names its layer `midlayer.*` (both engines read it).
- `speculators`: `architectures: ["Eagle3Speculator"]`, `speculators_model_type: "eagle3"`, the
  layer as `transformer_layer_config`, ids (input convention) at the top level, and a
  `speculators_config` naming the algorithm, proposal method and verifier.

Tensors (every format): `fc.weight [H, A*H_t]`, `layers.{i}.*` (or `midlayer.*`), `norm.weight`,
`lm_head.weight [N, H]`, `d2t [N]` int64 (target id = i + d2t[i]), `t2d [V]` bool; the target's
embedding only when asked for. Published checkpoints also prefix names with `model.`, call `d2t`
`draft_id_to_target_id`, omit `t2d`, or carry `embed_tokens`/`verifier_*` tensors; reading
normalises all of that.
"""

from __future__ import annotations

import re
from typing import Literal

from eyas.models.layers import Convention

Format = Literal["vllm", "sglang", "speculators"]
FORMATS: tuple[Format, ...] = ("vllm", "sglang", "speculators")
HF_ARCHITECTURE = "LlamaForCausalLMEagle3"
SPECULATORS_ARCHITECTURES = ("Eagle3Speculator", "Eagle3DraftModel")
CONVENTION_OF: dict[Format, Convention] = {"vllm": "input", "sglang": "output", "speculators": "input"}
IGNORED_TENSORS = re.compile(r"^(embed_tokens\.weight|verifier_.*)$")


def engine_name(name: str, num_layers: int) -> str:
    """Return the published name of an eyas tensor name (`layers.0.` is `midlayer.` in a one-layer draft)."""
    return name.replace("layers.0.", "midlayer.", 1) if num_layers == 1 and name.startswith("layers.0.") else name


def eyas_name(name: str) -> str | None:
    """Return eyas's name of a published tensor name, or None for tensors eyas does not keep."""
    name = name.removeprefix("model.")
    if name.startswith("midlayer."):
        name = "layers.0." + name.removeprefix("midlayer.")
    if name == "draft_id_to_target_id":
        name = "d2t"
    return None if IGNORED_TENSORS.match(name) else name
