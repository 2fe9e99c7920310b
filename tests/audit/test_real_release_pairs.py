"""Real release pairs: four real projects that drive transformers' internals (peft, liger-kernel, trl,
speculators; none written by us), each in a release written against transformers 4.57.6, audited against
the installed transformers (5.x in the main venv) with 4.57.6 as the baseline.

Ground truth is never eyas's reading: every use eyas's reader finds is resolved and bound against the
live release (`eyas.audit.groundtruth`, in a fresh interpreter). The installed side is judged live here;
the 4.57.6 side is the record `data/real_pairs_truth.json`, written by `bench/audit.py --record` in the
4.57 venv and checked live against that venv when this suite runs there (`make test-transformers4`).

Asserted: no wrong error (an error on a line whose uses all work, or all worked before and fail now for
no break) and no unconfirmed one (an error where no break is proven), and every break found.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from eyas.audit.groundtruth import Truth, judge_in, judged, score, site_key
from eyas.audit.run import run_audit
from eyas.audit.spec import resolve_spec
from eyas.audit.usage import Usage, read_usages

BASELINE = "transformers==4.57.6"
PACKAGE = "transformers"
# case -> (the client release, its import package)
CASES = {"peft": ("peft==0.17.1", "peft"), "liger-kernel": ("liger-kernel==0.6.2", "liger_kernel"),
         "trl": ("trl==0.23.1", "trl"), "speculators": ("speculators==0.2.0", "speculators")}
MIN_BREAKS = {"peft": 1, "liger-kernel": 1, "trl": 1, "speculators": 0}  # against 5.25.0: 3, 4, 3, 0
TRUTH = Path(__file__).parent / "data" / "real_pairs_truth.json"


def client_dir(case: str) -> Path:
    """Return the client's package directory, from its wheel unpacked in eyas's cache (downloaded once)."""
    spec, package = CASES[case]
    return resolve_spec(spec).roots[0] / package


def client_usages(client: Path) -> list[Usage]:
    """Return the client's uses of transformers that are not compatibility code (guarded uses are not checked)."""
    return [u for u in read_usages([client], {PACKAGE}).usages if not u.guarded]


def recorded_truth() -> dict[str, object]:
    return json.loads(TRUTH.read_text())


def installed_version() -> str:
    import importlib.metadata

    return importlib.metadata.version(PACKAGE)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("eyas-cache")


def _baseline_truth(case: str, usages: list[Usage]) -> Truth:
    record = recorded_truth()
    assert record["version"] == BASELINE.split("==")[1]
    truth = {key: tuple(value) for key, value in record["cases"][case].items()}  # type: ignore[index]
    absent = {site_key(u) for u in judged(usages)} - truth.keys()
    assert not absent, f"{len(absent)} uses have no recorded baseline verdict (e.g. {sorted(absent)[0]}): " \
                       "rerun `bench/audit.py --record` in the transformers 4.57 venv"
    return truth  # type: ignore[return-value]


@pytest.mark.skipif(installed_version() == BASELINE.split("==")[1], reason="the baseline itself is installed: "
                    "test_recorded_baseline_truth_is_live checks this venv")
@pytest.mark.parametrize("case", sorted(CASES))
def test_no_wrong_error_and_every_break_found(case: str, cache: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EYAS_CACHE", str(cache))
    client = client_dir(case)
    usages = client_usages(client)
    version, target = judge_in(sys.executable, usages, PACKAGE, tmp_path)
    result = run_audit([client], f"{PACKAGE}=={version}", BASELINE)
    errors = {(f.path, f.line) for f in result.findings if f.severity == "error"}
    scored = score(errors, usages, _baseline_truth(case, usages), target)
    assert not scored.wrong, f"wrong errors: {sorted(scored.wrong)}"
    assert not scored.unconfirmed, f"errors where no break is proven: {sorted(scored.unconfirmed)}"
    missed = {key: sorted(lines) for key, lines in scored.breaks.items() if key not in scored.found}
    assert not missed, f"breaks not found: {missed}"
    assert len(scored.breaks) >= MIN_BREAKS[case], "the pair no longer breaks: the case would prove nothing"


@pytest.mark.skipif(installed_version() != BASELINE.split("==")[1], reason=f"checks the record against {BASELINE} "
                    "live; runs in the 4.57 venv (make test-transformers4)")
@pytest.mark.parametrize("case", sorted(CASES))
def test_recorded_baseline_truth_is_live(case: str, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EYAS_CACHE", str(cache))
    usages = client_usages(client_dir(case))
    _, live = judge_in(sys.executable, usages, PACKAGE, tmp_path)
    recorded = _baseline_truth(case, usages)
    differ = {key: (recorded[key][0], live[key][0]) for key in live if recorded[key][0] != live[key][0]}
    assert not differ, f"{len(differ)} recorded verdicts differ from the live {BASELINE}: {sorted(differ.items())[:5]}"
