"""Fixtures of the real-engine tests (run by `make test-vllm` in the vLLM venv): the embedded SmolLM2
directory, a learned tiny pair whose heads vLLM's CPU attention serves, and `eyas` run as a process
(vLLM starts engine processes of its own, which a fresh interpreter hosts most faithfully)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from eyas.testing.learned import build_on_policy_pair


@pytest.fixture(scope="session")
def vllm_pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The on-policy learned pair (eyas.testing.learned.build_on_policy_pair): head_dim 32, which vLLM's CPU
    attention serves, and a draft trained on the target's own greedy answers."""
    return build_on_policy_pair(tmp_path_factory.mktemp("vllm-pair"))


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The embedded SmolLM2-135M-Instruct as its materialised Hugging Face directory."""
    from eyas.models.default import default_target

    return default_target()


@pytest.fixture
def eyas_process() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Return a runner of `python -m eyas ARGS...` in this venv: the completed process (text output)."""
    def run(*args: str | Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "eyas", *map(str, args)], capture_output=True, text=True,
                              timeout=timeout, check=False)

    return run

