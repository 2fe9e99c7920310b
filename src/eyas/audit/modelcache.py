"""The parsed API model on disk: one JSON file per package module, keyed by the module's path, size
and modification time, so a second audit against the same version parses nothing it already parsed.
JSON only (no pickle); a file that does not read back is parsed again."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from eyas.audit.apimodel import Alias, Attribute, Function, Klass, Module
from eyas.audit.signature import Param, Signature
from eyas.files import write_text_atomic

VERSION = 14  # bump when the model's shape changes


def _key(path: Path) -> str:
    stat = path.stat()
    return hashlib.sha256(f"{VERSION}\0{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()


def _signature(raw: dict[str, Any]) -> Signature:
    return Signature([Param(**p) for p in raw["params"]])


def _function(raw: dict[str, Any]) -> Function:
    return Function(**{**raw, "signature": _signature(raw["signature"]),
                       "sets_methods": {name: _signature(s) for name, s in raw["sets_methods"].items()},
                       "takes_keywords": [tuple(pair) for pair in raw["takes_keywords"]]})


def _member(raw: dict[str, Any]) -> Function | Klass | Attribute | Alias:
    tag, body = raw["tag"], raw["body"]
    if tag == "function":
        return _function(body)
    if tag == "class":
        return Klass(**{**body, "methods": {k: _function(v) for k, v in body["methods"].items()},
                        "attributes": {k: Attribute(**v) for k, v in body["attributes"].items()},
                        "init_false": set(body["init_false"]), "kw_only_fields": set(body["kw_only_fields"])})
    if tag == "attribute":
        return Attribute(**body)
    return Alias(**body)


_TAGS = {Function: "function", Klass: "class", Attribute: "attribute", Alias: "alias"}


def _encode(value: Any) -> Any:
    if isinstance(value, set):
        return sorted(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(type(value))


class ModuleCache:
    """Reads and writes parsed modules under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def load(self, path: Path) -> Module | None:
        file = self.root / f"{_key(path)}.json"
        if not file.is_file():
            return None
        try:
            raw = json.loads(file.read_text(encoding="utf-8"))
            members = {name: _member(m) for name, m in raw["members"].items()}
            return Module(raw["name"], Path(raw["path"]), raw["is_package"], members, raw["all"], raw["star_imports"],
                          raw["lazy_getattr"], raw["lazy_module"])
        except (ValueError, KeyError, TypeError):
            return None

    def save(self, module: Module) -> None:
        members = {name: {"tag": _TAGS[type(m)], "body": asdict(m)} for name, m in module.members.items()}
        body = {"name": module.name, "path": str(module.path), "is_package": module.is_package, "members": members,
                "all": module.all, "star_imports": module.star_imports, "lazy_getattr": module.lazy_getattr,
                "lazy_module": module.lazy_module}
        self.root.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.root / f"{_key(module.path)}.json", json.dumps(body, default=_encode))
