"""Where the source of an audited package comes from: `--against`/`--baseline` SPEC.

SPEC is an installed distribution (`transformers`: its installed files), `name==version`
(downloaded with `pip download --no-deps` into the cache and unpacked, never imported or run),
`sdist:name==version` (the source distribution, found through the index's PEP 691 JSON API,
hash-checked and unpacked, never built), a wheel file (unpacked into the cache) or a source
directory (`src/` layouts included).
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from eyas.audit.index import fetch_sdist, normalize
from eyas.errors import EyasError
from eyas.files import eyas_cache


@dataclass(frozen=True)
class Source:
    """`roots`: directories holding the package's top-level modules; `packages`: its import names."""

    label: str
    roots: tuple[Path, ...]
    packages: frozenset[str]


def cache_dir() -> Path:
    """Return eyas's audit cache (`$EYAS_CACHE/audit`, default `~/.cache/eyas/audit`)."""
    return eyas_cache() / "audit"


def _top_level(root: Path) -> frozenset[str]:
    names = set()
    for info in root.glob("*.dist-info/top_level.txt"):
        names |= {line.strip() for line in info.read_text().splitlines() if line.strip()}
    if not names:
        names = {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
        names |= {p.stem for p in root.glob("*.py") if p.stem not in ("setup", "conftest")}
    return frozenset(n for n in names if n.isidentifier())


def _unpack(archive: Path, into: Path) -> Path:
    """Unpack a wheel or sdist into `into` (once; a finished unpack is marked); return the source root."""
    done = into / ".eyas-unpacked"
    if not done.is_file():
        shutil.rmtree(into, ignore_errors=True)
        tmp = into.with_name(into.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if archive.suffix == ".whl" or archive.suffix == ".zip":
            with zipfile.ZipFile(archive) as handle:
                handle.extractall(tmp)
        else:
            with tarfile.open(archive) as handle:
                handle.extractall(tmp, filter="data")
        tmp.rename(into)
        done.write_text(archive.name)
    return _source_root(into, wheel=archive.suffix == ".whl")


def _source_root(into: Path, wheel: bool) -> Path:
    """Return the source root of an unpacked archive: an sdist's one top directory (its `src/`), else `into`."""
    entries = [p for p in into.iterdir() if p.is_dir() and not p.name.endswith(".dist-info")]
    if not wheel and len(entries) == 1:  # an sdist: one top directory
        top = entries[0]
        return top / "src" if (top / "src").is_dir() else top
    return into


def _directory(path: Path) -> Source:
    root = path / "src" if (path / "src").is_dir() else path
    if (root / "__init__.py").is_file():  # the package directory itself
        return Source(str(path), (root.parent,), frozenset({root.name}))
    return Source(str(path), (root,), _top_level(root))


def _installed(name: str) -> Source:
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise EyasError(f"{name}: no such installed distribution (give name==version, a wheel or a directory)") from None
    root = Path(str(dist.locate_file("")))
    top = (dist.read_text("top_level.txt") or "").split()
    if not top:
        top = sorted({Path(str(f)).parts[0].removesuffix(".py") for f in dist.files or []
                      if str(f).endswith(".py") and ".dist-info" not in str(f)})
    return Source(f"{dist.metadata['Name']}=={dist.version}", (root,), frozenset(top))


def _download(name: str, version: str) -> Source:
    target = cache_dir() / "src" / f"{name.lower()}-{version}"
    archives = cache_dir() / "downloads" / f"{name.lower()}-{version}"
    if not (target / ".eyas-unpacked").is_file():
        archives.mkdir(parents=True, exist_ok=True)
        if not any(archives.iterdir()):
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(archives),
                                   f"{name}=={version}"], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["pip download failed"])[-1]
                raise EyasError(f"{name}=={version}: pip download failed: {last}")
    archive = next(iter(sorted(archives.iterdir())), None) if archives.is_dir() else None
    if archive is None and not (target / ".eyas-unpacked").is_file():
        raise EyasError(f"{name}=={version}: nothing was downloaded")
    root = _unpack(archive, target) if archive is not None else target
    return Source(f"{name}=={version}", (root,), _top_level(root))


def _sdist(name: str, version: str) -> Source:
    """Return the source of NAME==VERSION's sdist; an unpacked copy in the cache is reused without any network access."""
    spec = f"sdist:{name}=={version}"
    key = f"{normalize(name)}-{version}-sdist"  # never the cache names of a wheel download
    target = cache_dir() / "src" / key
    if (target / ".eyas-unpacked").is_file():
        root = _source_root(target, wheel=False)
    else:
        archives = cache_dir() / "downloads" / key
        fetched = sorted(archives.glob("*.tar.gz")) if archives.is_dir() else []
        root = _unpack(fetched[0] if fetched else fetch_sdist(spec, name, version, archives), target)
    return Source(f"{name}=={version} (sdist)", (root,), _top_level(root))


def resolve_spec(spec: str) -> Source:
    """Return the source of SPEC; refuses one that names nothing readable."""
    path = Path(spec)
    if path.suffix == ".whl" and path.is_file():
        root = _unpack(path, cache_dir() / "src" / path.stem)
        return Source(path.name, (root,), _top_level(root))
    if path.is_dir():
        return _directory(path)
    match = re.fullmatch(r"(sdist:)?([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)", spec)
    if match:
        return _sdist(*match.groups()[1:]) if match[1] else _download(*match.groups()[1:])
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", spec):
        return _installed(spec)
    raise EyasError(f"{spec}: not a distribution name, name==version, sdist:name==version, wheel file or source directory")
