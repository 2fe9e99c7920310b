"""Source distributions from a package index, for `sdist:NAME==VERSION` audit specs.

The index (`$EYAS_INDEX_URL`, else `$PIP_INDEX_URL`, else PyPI) is read through its PEP 691 JSON
API with the standard library only; the sdist is sha256-checked against the index before use.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from eyas.errors import EyasError

PYPI = "https://pypi.org/simple"
JSON_API = "application/vnd.pypi.simple.v1+json"


def index_url() -> str:
    """Return the package index of `sdist:` specs: `$EYAS_INDEX_URL`, else `$PIP_INDEX_URL`, else PyPI."""
    return (os.environ.get("EYAS_INDEX_URL") or os.environ.get("PIP_INDEX_URL") or PYPI).rstrip("/")


def normalize(name: str) -> str:
    """Return NAME normalized per PEP 503 (lowercase, runs of `-_.` as one `-`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _shown(url: str) -> str:
    """Return URL with its user info (a login or a token) masked, for messages."""
    parts = urllib.parse.urlsplit(url)
    return parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]).geturl() if "@" in parts.netloc else url


def _login(url: str, index: str) -> str:
    """Return URL with the index's user info added when it points to the index's host without user info of its own."""
    parts, home = urllib.parse.urlsplit(url), urllib.parse.urlsplit(index)
    if "@" in home.netloc and "@" not in parts.netloc and parts.netloc == home.netloc.rpartition("@")[2]:
        return parts._replace(netloc=home.netloc).geturl()
    return url


def _open(spec: str, url: str, accept: str | None = None, missing: str | None = None) -> http.client.HTTPResponse:
    """Return the open response to GET URL, its user info sent as basic auth.

    Refuses an HTTP error (a 404 with the message `missing` when given) or an unreachable host.
    """
    parts = urllib.parse.urlsplit(url)
    request = urllib.request.Request(parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl())
    if accept:
        request.add_header("Accept", accept)
    if parts.username is not None:
        login = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        request.add_header("Authorization", "Basic " + base64.b64encode(login.encode()).decode())
    try:
        return urllib.request.urlopen(request, timeout=60)
    except urllib.error.HTTPError as error:
        if error.code == 404 and missing:
            raise EyasError(f"{spec}: {missing}") from None
        raise EyasError(f"{spec}: HTTP {error.code} {error.reason} from {_shown(url)}") from None
    except (OSError, ValueError) as error:  # URLError, timeouts, refused connections, malformed URLs
        raise EyasError(f"{spec}: index unreachable: {_shown(url)}: {getattr(error, 'reason', error)}") from None


def _project_files(spec: str, name: str) -> tuple[str, list[dict[str, Any]]]:
    """Return the URL of NAME's PEP 691 JSON page and its `files`; refuses a missing project or a page not in that format."""
    index = index_url()
    url = f"{index}/{normalize(name)}/"
    with _open(spec, url, JSON_API, missing=f"no project {name} on {_shown(index)}") as response:
        page_url, kind, body = response.geturl(), response.headers.get("Content-Type", "?"), response.read()
    try:
        files = json.loads(body)["files"]
        if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
            raise TypeError(files)
    except (ValueError, KeyError, TypeError):
        raise EyasError(f"{spec}: {_shown(url)} is not a PEP 691 JSON project page (Content-Type {kind})") from None
    return page_url, files


def _release(filename: str) -> tuple[str, str] | None:
    """Return (normalized name, version) of a wheel or sdist file name; None for any other file."""
    if filename.endswith(".whl"):
        parts = filename.split("-")
        return (normalize(parts[0]), parts[1]) if len(parts) >= 5 else None
    for ext in (".tar.gz", ".zip", ".tar.bz2", ".tgz"):
        if filename.endswith(ext):
            name, sep, version = filename.removesuffix(ext).rpartition("-")
            return (normalize(name), version) if sep else None
    return None


def _sdist_entry(spec: str, name: str, version: str, files: list[dict[str, Any]]) -> dict[str, Any]:
    """Return the index entry of `{name}-{version}.tar.gz`; refuses a missing version or a version without an sdist."""
    wanted = (normalize(name), version)
    same = [f for f in files if _release(str(f.get("filename", ""))) == wanted]
    for entry in same:
        if str(entry["filename"]).endswith(".tar.gz"):
            return entry
    if not same:
        raise EyasError(f"{spec}: {_shown(index_url())} has no files of {name} {version} ({len(files)} files of other versions)")
    raise EyasError(f"{spec}: {name} {version} has {len(same)} files on {_shown(index_url())} but no sdist (.tar.gz)")


def fetch_sdist(spec: str, name: str, version: str, into: Path) -> Path:
    """Download NAME==VERSION's sdist into `into` and return its path; refuses a missing sha256 or a mismatch.

    The file is written under a temporary name and renamed only once its hash matched, so an
    interrupted or refused download never leaves a `.tar.gz` that a later run would trust.
    """
    page_url, files = _project_files(spec, name)
    entry = _sdist_entry(spec, name, version, files)
    filename = str(entry["filename"])
    expected = str((entry.get("hashes") or {}).get("sha256", "")).lower()
    if not expected:
        raise EyasError(f"{spec}: the index gives no sha256 for {filename}; refusing an unverified download")
    url = _login(urllib.parse.urljoin(page_url, str(entry.get("url", ""))), index_url())
    into.mkdir(parents=True, exist_ok=True)
    part = into / f"{filename}.{os.getpid()}.part"
    try:
        digest = hashlib.sha256()
        with _open(spec, url) as response, part.open("wb") as out:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != expected:
            raise EyasError(f"{spec}: sha256 mismatch for {_shown(url)}: the index says {expected}, "
                            f"the download is {digest.hexdigest()}")
        return part.replace(into / filename)
    except OSError as error:
        raise EyasError(f"{spec}: download of {_shown(url)} failed: {error}") from None
    finally:
        part.unlink(missing_ok=True)
