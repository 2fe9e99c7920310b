"""`sdist:NAME==VERSION` specs against a fake PEP 691 index served from a temporary directory.

A local `http.server` (127.0.0.1, port 0) serves `simple/<project>/index.html` as the JSON
project page and `files/` as the file host; no test reaches the network.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import shutil
import tarfile
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from eyas.audit.run import run_audit
from eyas.audit.index import JSON_API
from eyas.audit.spec import cache_dir, resolve_spec
from eyas.errors import EyasError

MODULE = '''"""fakepkg: a tiny package in an sdist."""


def greet(name):
    return f"hello {name}"
'''


def _sdist(path: Path) -> bytes:
    """Write a tiny sdist (`fakepkg-1.0/` holding `fakepkg/__init__.py`, setup.py, PKG-INFO) to PATH; return its bytes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as handle:
        for name, text in (("fakepkg/__init__.py", MODULE), ("setup.py", "raise SystemExit('never run')\n"),
                           ("PKG-INFO", "Metadata-Version: 2.1\nName: fakepkg\nVersion: 1.0\n")):
            data = text.encode()
            info = tarfile.TarInfo(f"fakepkg-1.0/{name}")
            info.size = len(data)
            handle.addfile(info, io.BytesIO(data))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


class FakeIndex:
    """A PEP 691 index in a temporary directory, served over HTTP in a thread."""

    def __init__(self, root: Path, login: str | None = None) -> None:
        self.root = root
        self.accepts: list[str] = []
        self.login = login
        index = self

        class Handler(SimpleHTTPRequestHandler):
            extensions_map = {**SimpleHTTPRequestHandler.extensions_map, ".html": JSON_API}

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=str(root), **kwargs)

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                index.accepts.append(self.headers.get("Accept", ""))
                wanted = f"Basic {base64.b64encode(index.login.encode()).decode()}" if index.login else None
                if wanted and self.headers.get("Authorization") != wanted:
                    self.send_error(401, "Unauthorized")
                    return
                super().do_GET()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()
        self.archive = _sdist(root / "files" / "fakepkg-1.0.tar.gz")
        self.page("fakepkg", [self.entry()])

    @property
    def url(self) -> str:
        return f"http://{self.host}/simple"

    def entry(self, filename: str = "fakepkg-1.0.tar.gz", url: str | None = None, sha256: str | None = None) -> dict[str, Any]:
        """Return a `files` entry; default: the sdist, by absolute URL, with its true hash."""
        return {"filename": filename, "url": url or f"http://{self.host}/files/{filename}",
                "hashes": {"sha256": sha256 or hashlib.sha256(self.archive).hexdigest()}}

    def page(self, project: str, files: list[dict[str, Any]]) -> None:
        """Write PROJECT's JSON page."""
        path = self.root / "simple" / project / "index.html"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"meta": {"api-version": "1.0"}, "name": project, "files": files}))

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeIndex]:
    served = FakeIndex(tmp_path / "index")
    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("EYAS_INDEX_URL", served.url)
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    yield served
    served.stop()


def test_sdist_is_found_downloaded_and_unpacked(index: FakeIndex) -> None:
    source = resolve_spec("sdist:fakepkg==1.0")
    assert source.label == "fakepkg==1.0 (sdist)"
    assert source.packages == {"fakepkg"}  # setup.py is not a package
    (root,) = source.roots
    assert (root / "fakepkg" / "__init__.py").read_text() == MODULE
    assert root.parent.name == "fakepkg-1.0-sdist"  # never the name a wheel download of 1.0 gets
    assert index.accepts[0] == JSON_API
    downloads = cache_dir() / "downloads" / "fakepkg-1.0-sdist"
    assert [p.name for p in downloads.iterdir()] == ["fakepkg-1.0.tar.gz"]  # no temporary file left


def test_unpacked_copy_is_reused_without_the_index(index: FakeIndex) -> None:
    first = resolve_spec("sdist:fakepkg==1.0")
    index.stop()
    asked = len(index.accepts)
    again = resolve_spec("sdist:fakepkg==1.0")
    assert again == first and len(index.accepts) == asked


def test_names_are_normalized(index: FakeIndex) -> None:
    source = resolve_spec("sdist:FakePkg==1.0")
    assert source.packages == {"fakepkg"} and source.label == "FakePkg==1.0 (sdist)"


def test_relative_file_url(index: FakeIndex) -> None:
    index.page("fakepkg", [index.entry(url="../../files/fakepkg-1.0.tar.gz")])
    (root,) = resolve_spec("sdist:fakepkg==1.0").roots
    assert (root / "fakepkg" / "__init__.py").is_file()


def test_hash_mismatch_is_refused_and_nothing_is_kept(index: FakeIndex) -> None:
    index.page("fakepkg", [index.entry(sha256="0" * 64)])
    with pytest.raises(EyasError, match=r"^sdist:fakepkg==1\.0: sha256 mismatch for http://.*fakepkg-1\.0\.tar\.gz"):
        resolve_spec("sdist:fakepkg==1.0")
    downloads = cache_dir() / "downloads" / "fakepkg-1.0-sdist"
    assert list(downloads.iterdir()) == []
    index.page("fakepkg", [index.entry()])  # the index fixed: the next run downloads afresh
    assert resolve_spec("sdist:fakepkg==1.0").packages == {"fakepkg"}


def test_a_stale_partial_download_is_not_trusted(index: FakeIndex) -> None:
    downloads = cache_dir() / "downloads" / "fakepkg-1.0-sdist"
    downloads.mkdir(parents=True)
    (downloads / "fakepkg-1.0.tar.gz.999.part").write_bytes(index.archive[:10])
    assert resolve_spec("sdist:fakepkg==1.0").packages == {"fakepkg"}


def test_missing_version(index: FakeIndex) -> None:
    with pytest.raises(EyasError, match=r"^sdist:fakepkg==2\.0: .* has no files of fakepkg 2\.0 \(1 files of other versions\)$"):
        resolve_spec("sdist:fakepkg==2.0")


def test_version_without_sdist(index: FakeIndex) -> None:
    wheels = [index.entry(f"fakepkg-1.0-py3-none-{tag}.whl") for tag in ("any", "manylinux_2_28_x86_64")]
    index.page("fakepkg", [*wheels, index.entry("fakepkg-1.0.1.tar.gz")])
    with pytest.raises(EyasError, match=r"^sdist:fakepkg==1\.0: fakepkg 1\.0 has 2 files on .* but no sdist \(\.tar\.gz\)$"):
        resolve_spec("sdist:fakepkg==1.0")


def test_missing_project(index: FakeIndex) -> None:
    with pytest.raises(EyasError, match=rf"^sdist:nopkg==1\.0: no project nopkg on {index.url}$"):
        resolve_spec("sdist:nopkg==1.0")


def test_missing_file_is_an_http_error(index: FakeIndex) -> None:
    index.page("fakepkg", [index.entry(url="/files/gone.tar.gz")])
    with pytest.raises(EyasError, match=r"^sdist:fakepkg==1\.0: HTTP 404 .* from http://127\.0\.0\.1:\d+/files/gone\.tar\.gz$"):
        resolve_spec("sdist:fakepkg==1.0")


def test_page_not_in_json(index: FakeIndex) -> None:
    (index.root / "simple" / "fakepkg" / "index.html").write_text("<html>not json</html>")
    with pytest.raises(EyasError, match=r"^sdist:fakepkg==1\.0: .* is not a PEP 691 JSON project page"):
        resolve_spec("sdist:fakepkg==1.0")


def test_unreachable_index(index: FakeIndex, monkeypatch: pytest.MonkeyPatch) -> None:
    index.stop()
    monkeypatch.setenv("EYAS_INDEX_URL", index.url)
    with pytest.raises(EyasError, match=rf"^sdist:fakepkg==1\.0: index unreachable: {index.url}/fakepkg/: "):
        resolve_spec("sdist:fakepkg==1.0")


def test_pip_index_url_with_login(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`$PIP_INDEX_URL` serves when `$EYAS_INDEX_URL` is unset; its login reaches the file host, never a message."""
    served = FakeIndex(tmp_path / "index", login="user:s3cret")
    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("EYAS_INDEX_URL", raising=False)
    try:
        monkeypatch.setenv("PIP_INDEX_URL", f"http://user:wrong@{served.host}/simple")
        with pytest.raises(EyasError, match="HTTP 401") as refused:
            resolve_spec("sdist:fakepkg==1.0")
        assert "wrong" not in str(refused.value) and "***@" in str(refused.value)
        monkeypatch.setenv("PIP_INDEX_URL", f"http://user:s3cret@{served.host}/simple")
        served.page("fakepkg", [served.entry(url="../../files/fakepkg-1.0.tar.gz")])
        assert resolve_spec("sdist:fakepkg==1.0").packages == {"fakepkg"}
        shutil.rmtree(cache_dir())
        served.page("fakepkg", [served.entry()])  # an absolute URL on the index's host gets the login too
        assert resolve_spec("sdist:fakepkg==1.0").packages == {"fakepkg"}
    finally:
        served.stop()


def test_audit_against_an_sdist(index: FakeIndex, tmp_path: Path) -> None:
    client = tmp_path / "client.py"
    client.write_text("import fakepkg\n\nfakepkg.greet('you')\nfakepkg.farewell('you')\n")
    result = run_audit([client], "sdist:fakepkg==1.0")
    assert result.summary["against"] == "fakepkg==1.0 (sdist)"
    assert [(f.kind, f.symbol, f.line, f.severity) for f in result.findings] == [
        ("missing-attribute", "fakepkg.farewell", 4, "error")]
