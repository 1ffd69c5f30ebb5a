"""An index page read into memory within a bound, however far its compressed body inflates (L12)."""

from __future__ import annotations

import gzip
import http.server
import threading
import zlib
from collections.abc import Iterator

import httpx
import pytest

from servematrix.formats.indexpage import PageError, get_page

MiB = 2**20


def bomb(inflated_mib: int, wbits: int = 16 + zlib.MAX_WBITS) -> bytes:
    """JSON of `inflated_mib` MiB, compressed as it is made (never held whole)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits)
    parts = [packer.compress(b'{"files": [{"filename": "')]
    block = b"a" * MiB
    parts += [packer.compress(block) for _ in range(inflated_mib)]
    parts += [packer.compress(b'"}]}'), packer.flush()]
    return b"".join(parts)


def serve(body: bytes, encoding: str) -> Iterator[str]:
    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            if encoding:
                self.send_header("Content-Encoding", encoding)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple/x/"
    finally:
        server.shutdown()
        server.server_close()


def _get(url: str, limit: int) -> bytes:
    with httpx.Client(timeout=30) as client:
        return get_page(client, url, headers={}, limit=limit).content


@pytest.mark.parametrize(("encoding", "wbits"), [("gzip", 16 + zlib.MAX_WBITS), ("deflate", zlib.MAX_WBITS)])
def test_a_compressed_page_past_the_bound_is_cut_off_not_inflated(encoding: str, wbits: int):
    body = bomb(64, wbits)
    assert len(body) < MiB // 4  # 64 MiB of JSON in well under a quarter of a MiB
    for url in serve(body, encoding):
        with pytest.raises(PageError, match="larger than 4,194,304 bytes once inflated"):
            _get(url, 4 * MiB)
        assert len(_get(url, 65 * MiB)) == 64 * MiB + len(b'{"files": [{"filename": ""}]}')


def test_a_plain_page_is_read_whole_and_a_long_one_is_cut_off():
    for url in serve(b'{"files": []}', ""):
        assert _get(url, 1024) == b'{"files": []}'
        with pytest.raises(PageError, match="larger than 4 bytes"):
            _get(url, 4)


def test_an_encoding_this_reader_does_not_inflate_is_refused():
    for url in serve(gzip.compress(b"{}"), "br"):
        with pytest.raises(PageError, match="does not inflate"):
            _get(url, MiB)


def test_when_a_release_was_published_is_not_read_from_a_bomb():
    """The as-released lock reads the same pages (releasedate.release_date): bounded alike, a ReleaseDateError."""
    from servematrix.formats.indexpage import MAX_PAGE
    from servematrix.formats.releasedate import ReleaseDateError, release_date

    for url in serve(bomb(MAX_PAGE // MiB + 1), "gzip"):
        with pytest.raises(ReleaseDateError, match="PageError: the page is larger than"):
            release_date("x", "1.0", url.removesuffix("/x/"), timeout_s=30)
