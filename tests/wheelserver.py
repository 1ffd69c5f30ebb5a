"""Wheels served over real HTTP on localhost: by a file server with the Range support that index file hosts
have, and by the stdlib's, which ignores Range and sends the whole file."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import re
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

METADATA = "Metadata-Version: 2.4\nName: Demo_Pkg\nVersion: 1.0\nRequires-Dist: torch==2.11.0\n"


def make_wheel(path: Path, *, dist: str = "demo_pkg-1.0", payload: int = 4 << 20) -> Path:
    """A wheel bigger than the read-ahead (incompressible filler), its dist-info in the directory at the end."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        wheel.writestr("demo_pkg/__init__.py", "")
        wheel.writestr("demo_pkg/blob.bin", os.urandom(payload))
        wheel.writestr(f"{dist}.dist-info/METADATA", METADATA)
        wheel.writestr(f"{dist}.dist-info/RECORD", "")
    return path


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves a directory, answering `Range: bytes=A-B` with 206; the server records the bytes of each answer."""

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        match = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        path = Path(self.translate_path(self.path))
        if match is None or not path.is_file():
            return super().do_GET()
        data = path.read_bytes()
        start, end = int(match[1]), min(int(match[2]), len(data) - 1)
        self.server.sent.append(end - start + 1)  # type: ignore[attr-defined]
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        self.wfile.write(data[start : end + 1])


class PlainHandler(http.server.SimpleHTTPRequestHandler):
    """The stdlib's file server: a Range header is ignored and the whole file comes back with 200."""

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def serve(directory: Path, handler: type[http.server.SimpleHTTPRequestHandler]) -> Iterator[tuple[str, list[int]]]:
    """(base URL, bytes sent per ranged answer) of a server of `directory` on a free localhost port."""
    sent: list[int] = []
    bound = functools.partial(handler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), bound)
    server.sent = sent  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", sent
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
