"""What every stage does with its output directory, written once: claim it, key the run, record the
resolved config, keep progress, append JSONL that survives a kill, and write the summary.

A stage module describes its output once (`Stage`: its name, what its output is called, the names of
the files it writes) and calls `Stage.claim(config, inputs)`; it keeps only its work loop.

The run key says which run a directory holds, so that a rerun resumes it and a different run is not
mistaken for it. It hashes, as JSON: the stage's name, the config fields marked as deciding the result
(`eyas.config.DECIDES` on the pydantic field; a field left unmarked, such as a path out, a device or a logging
interval, never changes the key), and the identities of the inputs the stage passes (fingerprints and
hashes, so that moving a model directory keeps the key and retraining it in place changes it). The key
lives in `OUT/run.json`, written when the directory is claimed, before anything else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from eyas import __version__
from eyas.config import StageConfig, deciding_fields, write_resolved_config
from eyas.errors import EyasError
from eyas.files import (LOCK_FILE, LineLog, parse_json_object, read_json_object, reading, sha256_text,
                        write_json_atomic, write_text_atomic)
from eyas.models.fingerprint import TargetFingerprint
from eyas.outputs import claim_output_dir

RUN_FILE = "run.json"
CONFIG_FILE = "config.yaml"
SUMMARY_FILE = "summary.json"
MANIFEST_FILE = "manifest.json"
MODEL_FILES = ("config.json", "model.safetensors")  # a model or draft directory (the Hugging Face layout)
Manifest = TypeVar("Manifest", bound="StageManifest")


class StageManifest(BaseModel):
    """What every stage's `manifest.json` starts with: its kind and format version, the eyas that wrote
    it, the run key, and the target it was made from (path as given, and fingerprint)."""

    kind: str
    format_version: int
    eyas_version: str
    run_key: str
    target_path: str
    target: TargetFingerprint

    @classmethod
    def read(cls: type[Manifest], directory: Path, what: str, verb: str) -> Manifest:
        """Return the `manifest.json` of the finished `what` (e.g. "eyas dataset") in `directory`, which
        `verb` writes; refuses a missing or unreadable one, naming the file."""
        path = directory / MANIFEST_FILE
        if not path.is_file():
            raise EyasError(f"{path}: not found; is {directory} a finished `{verb}` output?")
        with reading(path):
            text = path.read_text(encoding="utf-8")
        try:
            return cls.model_validate(json.loads(text))
        except (json.JSONDecodeError, ValidationError) as exc:
            raise EyasError(f"{path}: not a valid {what} manifest: {str(exc).splitlines()[0]}") from None


def run_key(stage: str, config: StageConfig, inputs: dict[str, Any]) -> str:
    """Return the hex run key of `stage` run with `config` on `inputs` (identities, JSON-able)."""
    values = config.model_dump(mode="json", include=set(deciding_fields(type(config))))
    return sha256_text(json.dumps({"stage": stage, "config": values, "inputs": inputs}, sort_keys=True, default=str))


class JsonLines:
    """An append-only JSONL file of whole lines: a killed writer's partial last line is dropped on read."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> list[dict[str, Any]]:
        """Return the records of the whole lines, and cut the file back to them so that appending continues
        after the last whole line; refuses (naming file and line) a whole line that is not a JSON object."""
        if not self.path.is_file():
            return []
        lines = self.path.read_text(encoding="utf-8").splitlines(keepends=True)
        whole = lines if not lines or lines[-1].endswith("\n") else lines[:-1]
        if len(whole) < len(lines):
            write_text_atomic(self.path, "".join(whole))
        return [parse_json_object(line, f"{self.path}:{number}") for number, line in enumerate(whole, 1)]

    def keep(self, count: int) -> None:
        """Cut the file back to its first `count` lines (a resumed run rewrites what came after)."""
        if self.path.is_file():
            lines = self.path.read_text(encoding="utf-8").splitlines(keepends=True)
            if len(lines) > count:
                write_text_atomic(self.path, "".join(lines[:count]))

    def appender(self) -> LineLog:
        """Return the writer that appends whole lines (a line cut short by a full disk or signal is removed)."""
        return LineLog(self.path)


@dataclass(frozen=True)
class Run:
    """A claimed output directory holding one run: `resumed` when it already held (part of) this run."""

    path: Path
    key: str
    resumed: bool

    def lines(self, name: str) -> JsonLines:
        """Return the JSONL file `name` of this run."""
        return JsonLines(self.path / name)

    def read_progress(self, name: str = "progress.json") -> dict[str, Any] | None:
        """Return the progress record `name` of this run, or None before the first one."""
        path = self.path / name
        return read_json_object(path) if path.is_file() else None

    def write_progress(self, record: dict[str, Any], name: str = "progress.json") -> None:
        """Replace the progress record `name` atomically."""
        write_json_atomic(self.path / name, record)

    def read_summary(self) -> dict[str, Any] | None:
        """Return the summary of a finished run, or None while it is not finished."""
        path = self.path / SUMMARY_FILE
        return read_json_object(path) if path.is_file() else None

    def write_summary(self, summary: dict[str, Any]) -> None:
        """Write the summary that marks this run finished (with its run key)."""
        write_json_atomic(self.path / SUMMARY_FILE, {"run_key": self.key, **summary})


@dataclass(frozen=True)
class Stage:
    """A stage's output directory, described once: `name` (its config section), `what` its output is
    called in messages ("an eyas dataset"), `own`, the name patterns of every file it writes there, and
    `keyed`, those of its progress records that carry the run key (a checkpoint copied into a fresh
    directory is recognised by its own record)."""

    name: str
    what: str
    own: tuple[str, ...]
    keyed: tuple[str, ...] = ()  # patterns of the JSON files besides run.json that record their run's "run_key"
    nested: tuple[str, ...] = ()  # other stages' output directories inside this one: never foreign, never removed

    def claim(self, config: StageConfig, inputs: dict[str, Any], notes: tuple[str, ...] = (),
              primary: bool = True) -> Run:
        """Claim `config.out` for this run (see `eyas.outputs.claim_output_dir`) and record it: `run.json`
        and the resolved `config.yaml` (`notes` as comments above it); return the claimed run.

        Refuses a directory held by another eyas process, or holding another run, or files this stage
        never writes, unless `config.overwrite` (then only this stage's files are removed); files of
        this stage with no recorded key (a run killed before it recorded anything) are removed, and so
        is another run's bare claim (run.json and config.yaml alone: it stopped before any work, as
        when its engine did not start), so that the corrected rerun needs no --overwrite.
        `primary=False` (a torchrun rank other than 0) only computes the key and touches nothing
        (`resumed` is then False).
        """
        out: Path = config.out  # type: ignore[attr-defined]
        key = run_key(self.name, config, inputs)
        if not primary:
            return Run(out, key, resumed=False)
        _refuse_nesting(out, config)
        owner = self.other_owner(out, key)
        if owner is not None:
            raise EyasError(f"{out}: holds {owner}; `eyas {self.name}` never replaces it, with or without --overwrite; "
                            "use another --out")
        existing = self.recorded_keys(out)
        if existing != {key} and _only_claimed(out):  # a run that stopped before any work (an engine that did not start)
            existing = set()
        overwrite = bool(getattr(config, "overwrite", False))
        resumed = claim_output_dir(out, key, existing, (*self.own, RUN_FILE, CONFIG_FILE), overwrite, self.what,
                                   self.nested)
        write_json_atomic(out / RUN_FILE, {"stage": self.name, "run_key": key, "eyas_version": __version__})
        write_resolved_config(config, self.name, out, notes)
        return Run(out, key, resumed)


    def other_owner(self, out: Path, key: str) -> str | None:
        """Return what `out` holds when it is not this stage's to claim, else None.

        A directory is this stage's when its `run.json` names this stage, or it has no `run.json` and
        nothing that says whose it is. Another stage's output (its `run.json`), a finished output whose
        `run.json` is gone (a `manifest.json` of another run) and model files with no `run.json` (a
        draft under a training run's `final/` or `best/`, a published draft, a target) are never this
        stage's: `--overwrite` replaces a stage's own earlier runs, nothing else.
        """
        if not out.is_dir():
            return None
        run = out / RUN_FILE
        if run.is_file():
            stage = read_json_object(run).get("stage")
            return None if stage == self.name else f"the output of `eyas {stage}` (its {RUN_FILE})"
        manifest = out / MANIFEST_FILE
        if manifest.is_file() and read_json_object(manifest).get("run_key") != key:
            return f"a finished eyas output whose {RUN_FILE} is gone ({MANIFEST_FILE} of another run)"
        model = [name for name in MODEL_FILES if (out / name).exists()]
        if model:
            return f"model files ({', '.join(model)}) that no eyas stage claimed: a trained draft or a model"
        return None

    def recorded_keys(self, out: Path) -> set[str]:
        """Return the run keys recorded in `out` (run.json and the `keyed` records)."""
        records = [out / RUN_FILE, *(path for pattern in self.keyed for path in sorted(out.glob(pattern)))]
        return {_recorded_key(path) for path in records if path.is_file()}


def _only_claimed(out: Path) -> bool:
    """Return whether `out` holds nothing but a claim (its run.json and config.yaml, and the lock): a run that
    stopped before writing anything else, which another run may take over without --overwrite."""
    return (out / RUN_FILE).is_file() and {path.name for path in out.iterdir()} <= {RUN_FILE, CONFIG_FILE, LOCK_FILE}


def _input_paths(config: StageConfig) -> list[tuple[str, Path]]:
    """Return (field, path) of every path of `config` besides `out`: the stage's inputs."""
    found: list[tuple[str, Path]] = []
    for name in type(config).model_fields:
        value = getattr(config, name)
        paths = value if isinstance(value, list) else [value]
        found += [(name, path) for path in paths if isinstance(path, Path) and name != "out"]
    return found


def _refuse_nesting(out: Path, config: StageConfig) -> None:
    """Refuse an `out` inside one of the stage's input directories, or one holding an input: the stage's
    files would become its own inputs (or `--overwrite` would remove them)."""
    where = out.resolve()
    for name, path in _input_paths(config):
        given = path.resolve()
        flag = "--" + name.replace("_", "-")
        if where == given:
            raise EyasError(f"{out}: is the input {flag} itself; use another --out")
        if given in where.parents:
            raise EyasError(f"{out}: inside the input {path} ({flag}); the stage's files would become its own "
                            "inputs: use an --out outside it")
        if where in given.parents:
            raise EyasError(f"{out}: holds the input {path} ({flag}); use an --out that does not contain the inputs")


def _recorded_key(record: Path) -> str:
    """Return the run key recorded in the JSON file `record`; refuses a malformed one (naming the file)."""
    key = read_json_object(record).get("run_key")
    if not isinstance(key, str):
        raise EyasError(f"{record}: run_key: missing; use --overwrite or another --out")
    return key
