"""onnxruntime's C API headers for `edgespec build-kernel`: Debian's libonnxruntime-dev, checked against its pinned
SHA-256, kept in edgespec's downloads folder, and a one-line reason when it cannot be had. The package is served
over real HTTP from 127.0.0.1: a .deb built here from the headers this environment already holds."""

from __future__ import annotations

import hashlib
import io
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from edgespec.cli.main import main
from edgespec.kernels import library as custom_ops

INSTALLED = custom_ops.kernels_dir() / "include"  # the headers this environment's `make setup` fetched


def _ar(members: list[tuple[str, bytes]]) -> bytes:
    """An ar archive, the format of a .deb: magic, then per member a 60-byte header and the data (even-padded)."""
    heads = [f"{n:<16}{0:<12}{0:<6}{0:<6}{644:<8}{len(d):<10}`\n".encode() for n, d in members]
    return b"!<arch>\n" + b"".join(h + d + b"\n" * (len(d) % 2) for h, (_, d) in zip(heads, members, strict=True))


def _deb(headers: Path) -> bytes:
    """A libonnxruntime-dev-shaped package: the headers under usr/include/onnxruntime in data.tar.xz."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as tar:
        for header in sorted(headers.glob("*.h")):
            tar.add(header, arcname=f"./usr/include/onnxruntime/{header.name}")
    return _ar([("debian-binary", b"2.0\n"), ("data.tar.xz", data.getvalue())])


class _Mirror:
    """Serves one file at /pool/libonnxruntime-dev.deb and counts the requests."""

    def __init__(self, body: bytes) -> None:
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                mirror.requests += 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(mirror.body)))
                self.end_headers()
                self.wfile.write(mirror.body)

            def log_message(self, *_: object) -> None:
                pass

        self.body, self.requests = body, 0
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/pool/libonnxruntime-dev.deb"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture()
def deb() -> bytes:
    return _deb(INSTALLED)


@pytest.fixture()
def mirror(deb: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Mirror]:
    """The package on a local mirror, pinned by its hash; edgespec's home and the kernel folder in tmp_path."""
    served = _Mirror(deb)
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ORT_INCLUDE_DIR", raising=False)
    monkeypatch.setattr(custom_ops, "HEADERS_URL", served.url)
    monkeypatch.setattr(custom_ops, "HEADERS_SHA256", hashlib.sha256(deb).hexdigest())
    monkeypatch.setattr(custom_ops, "kernels_dir", lambda: tmp_path / "kernels")
    yield served
    served.httpd.shutdown()
    served.httpd.server_close()


def test_fetched_once_checked_kept_and_reused_offline(mirror: _Mirror, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    folder = custom_ops._headers(said.append)
    assert (folder / custom_ops.HEADER).read_bytes() == (INSTALLED / custom_ops.HEADER).read_bytes()
    kept = tmp_path / "home" / "downloads" / "libonnxruntime-dev.deb"
    assert kept.read_bytes() == mirror.body and mirror.requests == 1 and str(kept) in said[0]
    # Another environment (its own kernel folder), offline: the kept file serves, nothing is fetched.
    mirror.httpd.shutdown()
    monkeypatch.setattr(custom_ops, "kernels_dir", lambda: tmp_path / "other-env")
    assert (custom_ops._headers(said.append) / custom_ops.HEADER).is_file() and mirror.requests == 1


def test_offline_says_where_to_put_the_file(mirror: _Mirror, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`edgespec build-kernel` with nothing to fetch from: one line, exit 1, and what to do instead."""
    monkeypatch.setattr(custom_ops, "HEADERS_URL", "http://127.0.0.1:9/pool/libonnxruntime-dev.deb")  # refused
    monkeypatch.setattr(custom_ops, "_unbuildable", None)
    assert main(["build-kernel"]) == 1  # its library would go to tmp_path/kernels: not built there yet
    building, fetching, failed = capsys.readouterr().err.strip().splitlines()
    assert building.startswith("building edgespec_ops-")
    assert fetching.startswith("fetching onnxruntime's C API headers from http://127.0.0.1:9/")
    assert failed.startswith("edgespec: kernels not built (could not fetch http://127.0.0.1:9/")
    assert f"put that file at {tmp_path / 'home' / 'downloads' / 'libonnxruntime-dev.deb'}" in failed
    assert "ORT_INCLUDE_DIR" in failed and "GroupQueryAttention" in failed


def test_a_package_that_is_not_the_pinned_one_is_refused(mirror: _Mirror, tmp_path: Path) -> None:
    mirror.body = mirror.body[:-1] + b"x"
    digest = hashlib.sha256(mirror.body).hexdigest()
    with pytest.raises(custom_ops.KernelBuildError, match=f"has SHA-256 {digest}, not the pinned"):
        custom_ops._headers(print)
    assert not (tmp_path / "home" / "downloads").exists() and not (tmp_path / "kernels" / "include").exists()


def test_a_damaged_kept_file_is_fetched_again(mirror: _Mirror, tmp_path: Path) -> None:
    kept = tmp_path / "home" / "downloads" / "libonnxruntime-dev.deb"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(mirror.body[:100])  # a download cut short
    assert (custom_ops._headers(print) / custom_ops.HEADER).is_file()
    assert mirror.requests == 1 and kept.read_bytes() == mirror.body


def test_headers_are_read_from_the_debian_package_format() -> None:
    """A .deb is an ar archive: the build takes data.tar.xz out of it with no dpkg."""
    archive = _ar([("debian-binary", b"2.0\n"), ("data.tar.xz", b"odd")])
    assert custom_ops._ar_member(archive, "data.tar.xz") == b"odd"
    with pytest.raises(custom_ops.KernelBuildError, match=r"no control\.tar\.xz"):
        custom_ops._ar_member(archive, "control.tar.xz")
