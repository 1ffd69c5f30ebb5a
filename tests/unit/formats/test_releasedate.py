"""When a release was published, from an index's PEP 691 file list (uv's --exclude-newer for `as-released`)."""

from __future__ import annotations

import pytest

from servematrix.formats.releasedate import ReleaseDateError, upload_time

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
