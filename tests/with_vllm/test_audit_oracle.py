"""The audit's API model against the live vLLM of this venv: no mismatch between eyas's modelled
signatures and `inspect.signature` may be able to give a wrong error (`eyas.audit.oracle`)."""

from __future__ import annotations

from eyas.audit.oracle import package_fidelity


def test_vllm_has_no_error_capable_mismatch() -> None:
    fidelity = package_fidelity("vllm")
    assert fidelity.compared > 500
    assert [(c.qualname, c.modelled, c.live) for c in fidelity.error_capable] == []
    assert fidelity.matched_share >= 0.995, [(c.qualname, c.verdict, c.modelled, c.live) for c in fidelity.comparisons
                                             if c.verdict in ("mismatched", "unknown")]
