"""The vLLM extraction backend (`eyas extract --backend vllm`).

Two paths, chosen by the installed vLLM release (contract.py lists the ranges and the modules
each range runs): the `extract_hidden_states` speculative method with its hidden-states KV
connector (connector.py), or, on older releases, `LLM` with a worker extension reached through
`collective_rpc` (hooked.py driving worker.py). Neither re-creates vLLM's scheduler or executor.
Only connector.py, hooked.py, worker.py and engine.py import vLLM; the rest of the package does
not, so it imports and tests without vLLM.
"""
