"""When a release was published, from an index's PEP 691 file list (uv's --exclude-newer for `as-released`)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from servematrix.formats.releasedate import ReleaseDateError, release_date, upload_time

FILES = [
    {"filename": "sglang-0.5.12-cp312-cp312-manylinux_2_34_x86_64.whl", "upload-time": "2026-05-16T18:20:14.234388Z"},
    {"filename": "sglang-0.5.12-cp313-cp313-manylinux_2_34_x86_64.whl", "upload-time": "2026-05-16T18:20:18.293095Z"},
    {"filename": "sglang-0.5.12.tar.gz", "upload-time": "2026-05-16T18:19:00Z"},
    # A file of another release uploaded later, and one of an older release re-uploaded later, do not count.
    {"filename": "sglang-0.5.13-cp312-cp312-manylinux_2_34_x86_64.whl", "upload-time": "2026-06-01T00:00:00Z"},
    {"filename": "sglang-0.5.1-py3-none-any.whl", "upload-time": "2026-07-01T00:00:00Z"},
]


def test_the_newest_file_of_the_release_decides_and_the_release_itself_is_included():
    # One second past the last file, whole seconds: uv drops what is newer than the moment.
    assert upload_time(FILES, "sglang", "0.5.12") == "2026-05-16T18:20:19Z"


def test_a_release_without_upload_times_is_an_error_not_a_guess():
    files = [{"filename": "sglang-0.5.12.tar.gz"}]
    with pytest.raises(ReleaseDateError, match=r"no upload time for sglang 0\.5\.12"):
        upload_time(files, "sglang", "0.5.12")
    with pytest.raises(ReleaseDateError):
        upload_time(FILES, "sglang", "0.5.99")


NEXT_YEAR = (datetime.now(UTC) + timedelta(days=365)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _one(upload: object, filename: str = "httpx-0.29.0-py3-none-any.whl") -> list[dict]:
    return [{"filename": filename, "upload-time": upload}]


def test_an_offset_other_than_utc_is_converted_not_relabelled():
    """L8: the moment of `+14:00` is 14 hours before the same clock time in UTC; with several offsets the
    newest moment decides, whichever file's offset came first."""
    assert upload_time(_one("2024-01-01T00:00:00+14:00"), "httpx", "0.29.0") == "2023-12-31T10:00:01Z"
    mixed = [
        {"filename": "httpx-0.29.0-py3-none-any.whl", "upload-time": "2024-01-01T12:00:00+14:00"},
        {"filename": "httpx-0.29.0.tar.gz", "upload-time": "2024-01-01T01:00:00-05:00"},
    ]
    assert upload_time(mixed, "httpx", "0.29.0") == "2024-01-01T06:00:01Z"


def _index(upload: object) -> Iterator[str]:
    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"meta": {"api-version": "1.1"}, "name": "httpx", "files": _one(upload)}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("upload", "says"),
    [
        ("9999-12-31T23:59:59Z", "is in the future"),  # was "year 10000 is out of range"
        # was taken as it is: today's lock, labelled as released
        pytest.param(NEXT_YEAR, "is in the future", id="next-year"),
        ("2026-13-45T00:00:00Z", "is not a date"),
        ("2024-01-01T00:00:00", "has no UTC offset"),  # beside an aware one it was a TypeError
        (1704067200, "is not a date string"),
        ([2024, 1, 1], "is not a date string"),
    ],
)
def test_a_crafted_upload_time_on_a_local_index_is_a_release_date_error(upload: object, says: str):
    """L7: an index's upload time that is no past moment with an offset is a ReleaseDateError naming the
    release and its file (the lock's row says it), never a ValueError or TypeError traceback."""
    for url in _index(upload):
        with pytest.raises(ReleaseDateError, match=r"upload time of httpx 0\.29\.0 \(httpx-0\.29\.0-py3") as info:
            release_date("httpx", "0.29.0", url, timeout_s=10)
        assert says in str(info.value)
    naive_and_aware = [
        {"filename": "httpx-0.29.0-py3-none-any.whl", "upload-time": "2024-01-01T00:00:00Z"},
        {"filename": "httpx-0.29.0.tar.gz", "upload-time": "2024-01-01T00:00:00"},
    ]
    with pytest.raises(ReleaseDateError, match="has no UTC offset"):
        upload_time(naive_and_aware, "httpx", "0.29.0")
