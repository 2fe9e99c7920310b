"""Seconds per stage of a demo (or of one of its continuations), this run's and every run's together.

Stages resume and are reused, so one run's seconds say little about what a stage cost: a reused
stage takes a second, a resumed one only its remainder. `StageClock` keeps both: this run's seconds,
and the sum over every run of the same directory, written after each stage (a killed run's finished
stages still count). The sums are what sizing by measured throughput reads (continuation.py).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from eyas.files import write_json_atomic

STAGE_SECONDS = "stage-seconds.json"
Result = TypeVar("Result")


class StageClock:
    """Times stage calls (announced on stderr after `announce`); `this_run` holds this run's seconds,
    `all_runs` the sums kept in `path`."""

    def __init__(self, path: Path, announce: str = "eyas demo") -> None:
        self.path, self.announce = path, announce
        self.this_run: dict[str, float] = {}
        self.all_runs: dict[str, float] = read_stage_seconds(path)

    def timed(self, name: str, work: Callable[[], Result]) -> Result:
        """Return `work()`, announced on stderr as stage `name`, its seconds added to both tallies."""
        started = time.perf_counter()
        print(f"{self.announce}: {name} ...", file=sys.stderr)
        result = work()
        seconds = time.perf_counter() - started
        self.this_run[name] = seconds
        self.all_runs[name] = self.all_runs.get(name, 0.0) + seconds
        write_json_atomic(self.path, self.all_runs)
        return result


def read_stage_seconds(path: Path) -> dict[str, float]:
    """Return the per-stage seconds summed over every run recorded in `path` (empty when there is none)."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
