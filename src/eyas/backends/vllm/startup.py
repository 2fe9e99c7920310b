"""What vLLM refuses when an engine starts, each in one line naming the target (vLLM is imported only by
model_class.py, and only when `vllm_target_problem` runs).

Two refusals: an engine that does not start at all (`engine_refusal`: vLLM's config validation, a
model class it cannot build, memory), and a target whose vLLM model class cannot serve an EAGLE-3
draft (`eagle3_problem`). vLLM's runner asks the target's class for EAGLE-3's auxiliary hidden
states only once the weights are loaded (`_setup_eagle3_aux_hidden_state_outputs`: "Model does not
support EAGLE3 interface but aux_hidden_state_outputs was requested"); the class is known before,
from the target's `architectures` and `model_impl` (model_class.py asks vLLM's registry), which
`eval --engine vllm` (`vllm_target_problem`) and `check-draft --engine vllm` (`target_problems`) do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eyas.backends.vllm.contract import installed_vllm, not_installed
from eyas.config import ModelImpl
from eyas.errors import CannotRun, EyasError

INTERFACE = "SupportsEagle3"  # vLLM's protocol for EAGLE-3's auxiliary hidden states (model_executor/models/interfaces.py)
LONG = 200  # a first line longer than this is cut to its first sentence (vLLM lists every choice after it)


@dataclass(frozen=True)
class ServedClass:
    """The class vLLM builds a target with, and whether it implements EAGLE-3's auxiliary hidden states."""

    name: str
    eagle3: bool


class EngineRefused(EyasError):
    """vLLM refused the target or the engine's settings before starting an engine (its config validation): exit 2."""


class EngineFailed(CannotRun):
    """vLLM's engine failed while starting (a model class it cannot build, memory, a dead engine process): exit 3."""


def first_message(error: BaseException) -> str:
    """Return the first meaningful line of `error`'s message: a pydantic validation error's first error (without
    "Value error, "), else the first non-empty line of the message, cut to its first sentence when long; the
    exception's class name when it has no message."""
    errors = getattr(error, "errors", None)
    text = str(error)
    if callable(errors):
        try:
            text = str(errors()[0]["msg"])
        except (TypeError, LookupError):
            pass
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    line = lines[0].removeprefix("Value error, ")
    if len(line) > LONG and ". " in line:
        line = line.split(". ", 1)[0]
    return line.rstrip(".")


def engine_refusal(target: Path | str, error: Exception) -> EyasError:
    """Return the one-line error for a vLLM engine on `target` (a path, or words naming it and its draft) that did
    not start because of `error`:
    EngineRefused (exit 2) for vLLM's validation of the target's config or the settings (a ValueError, pydantic's
    included), else EngineFailed (exit 3), with a pointer to vLLM's log where the cause is in another process."""
    message = first_message(error)
    if isinstance(error, ValueError):
        return EngineRefused(f"{target}: vLLM refused to start it: {message}")
    elsewhere = " (vLLM's log above names the cause)" if "root cause above" in str(error) else ""
    return EngineFailed(f"{target}: vLLM's engine failed to start: {message}{elsewhere}")


def eagle3_problem(target: Path, model_impl: ModelImpl, resolve: Callable[[ModelImpl], ServedClass]) -> str | None:
    """Return why vLLM cannot serve an EAGLE-3 draft on `target` with `model_impl`, in one line, or None when the
    class `resolve(model_impl)` names implements SupportsEagle3. Unless `model_impl` is already `transformers`, the
    line offers `model_impl=transformers` where vLLM's Transformers backend serves the target with a class that
    implements it. Refuses (raises) what `resolve` raises for `model_impl` itself (vLLM refusing the target)."""
    served = resolve(model_impl)
    if served.eagle3:
        return None
    line = (f"{target}: vLLM builds it as {served.name} (model_impl={model_impl}), which lacks EAGLE-3's auxiliary "
            f"hidden states ({INTERFACE}); vLLM would refuse the draft after loading the weights")
    if model_impl == "transformers":
        return line
    try:
        backend: ServedClass | None = resolve("transformers")
    except EyasError:
        backend = None
    if backend is not None and backend.eagle3:
        return f"{line}; give model_impl=transformers (vLLM's Transformers backend, {backend.name}, implements it)"
    return f"{line}; vLLM's Transformers backend does not serve it with {INTERFACE} either"


def vllm_target_problem(target: Path, model_impl: ModelImpl, trust_remote_code: bool = False) -> str | None:
    """Return why the installed vLLM cannot serve an EAGLE-3 draft on `target` under `model_impl`, before any weight
    loads (`eagle3_problem` on the class vLLM's registry gives, model_class.py), or None when it can. Refuses (one
    line, `engine_refusal`) a target vLLM refuses outright. Imports vLLM."""
    from eyas.backends.vllm.model_class import served_class

    return eagle3_problem(target, model_impl, lambda impl: served_class(target, impl, trust_remote_code))


def target_problems(target: Path, model_impl: ModelImpl, trust_remote_code: bool = False) -> list[str]:
    """Return, for `eyas check-draft --engine vllm`, why vLLM cannot serve an EAGLE-3 draft on `target` itself:
    vLLM refusing the target (in its words) or `vllm_target_problem`; empty when it can, and where vLLM is not
    installed (`unchecked` says so)."""
    if installed_vllm() is None:
        return []
    try:
        problem = vllm_target_problem(target, model_impl, trust_remote_code)
    except EyasError as error:
        return [str(error)]
    return [problem] if problem else []


def unchecked() -> str | None:
    """Return the note that the target's vLLM class was not checked (no vLLM in this Python), or None."""
    if installed_vllm() is not None:
        return None
    return not_installed("the target's vLLM class (EAGLE-3's SupportsEagle3) was not checked",
                         "run .venv-vllm/bin/eyas check-draft ...")
