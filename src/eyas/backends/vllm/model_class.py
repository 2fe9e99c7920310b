"""The class the installed vLLM builds a target with, resolved as vLLM's engine resolves it, before any weight loads.

vLLM's own `ModelConfig` reads the target's config (never its weights) and its registry maps
`architectures` and `model_impl` to a class (`resolve_model_cls`: vLLM's own class, or its
Transformers backend for `model_impl=transformers` and for architectures vLLM has no class of);
only that class's module is imported. `supports_eagle3` is the test vLLM's runner applies.
"""

from __future__ import annotations

from pathlib import Path

from vllm.config import ModelConfig
from vllm.model_executor.models.interfaces import supports_eagle3

from eyas.backends.vllm.startup import ModelImpl, ServedClass, engine_refusal


def served_class(target: Path, model_impl: ModelImpl, trust_remote_code: bool = False) -> ServedClass:
    """Return the class vLLM builds `target` (a model directory) with under `model_impl`, and whether it implements
    EAGLE-3's auxiliary hidden states; refuses (one line, `startup.engine_refusal`) a target vLLM refuses."""
    try:
        config = ModelConfig(model=str(target), model_impl=model_impl, trust_remote_code=trust_remote_code)
        model_class, _ = config.registry.resolve_model_cls(config.architectures, config)
    except Exception as error:  # vLLM's refusal, in whatever type it raises: one line
        raise engine_refusal(target, error) from error
    return ServedClass(model_class.__name__, supports_eagle3(model_class))
