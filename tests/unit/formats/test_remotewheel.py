"""Reading one wheel's METADATA by HTTP ranges, from real HTTP servers on localhost (tests/wheelserver.py)."""

from __future__ import annotations

import pytest

from servematrix.formats.remotewheel import RemoteWheelError, wheel_metadata
from tests.wheelserver import METADATA, PlainHandler, RangeHandler, make_wheel, serve


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    # The machine's proxy settings must not send a request for localhost elsewhere.
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")


def test_metadata_is_read_with_a_small_part_of_the_wheel(tmp_path):
    wheel = make_wheel(tmp_path / "demo_pkg-1.0-py3-none-any.whl")
    with serve(tmp_path, RangeHandler) as (base, sent):
        assert wheel_metadata(f"{base}/{wheel.name}", "demo-pkg", size=wheel.stat().st_size) == METADATA
    assert 0 < sum(sent) < wheel.stat().st_size // 8
    assert len(sent) <= 4  # the directory and the member, each in one or two requests


def test_the_size_is_asked_when_not_given(tmp_path):
    wheel = make_wheel(tmp_path / "demo_pkg-1.0-py3-none-any.whl", payload=1024)
    with serve(tmp_path, RangeHandler) as (base, _):
        assert wheel_metadata(f"{base}/{wheel.name}", "Demo.Pkg") == METADATA


def test_a_server_without_ranges_is_refused(tmp_path):
    wheel = make_wheel(tmp_path / "demo_pkg-1.0-py3-none-any.whl")
    with serve(tmp_path, PlainHandler) as (base, _), pytest.raises(RemoteWheelError, match="HTTP 200"):
        wheel_metadata(f"{base}/{wheel.name}", "demo-pkg", size=wheel.stat().st_size)


def test_a_wheel_of_another_project_is_refused(tmp_path):
    wheel = make_wheel(tmp_path / "other-1.0-py3-none-any.whl", dist="other-1.0", payload=1024)
    with serve(tmp_path, RangeHandler) as (base, _), pytest.raises(RemoteWheelError, match="no demo-pkg"):
        wheel_metadata(f"{base}/{wheel.name}", "demo-pkg")


def test_a_missing_file_is_refused(tmp_path):
    with serve(tmp_path, RangeHandler) as (base, _), pytest.raises(RemoteWheelError, match="404"):
        wheel_metadata(f"{base}/absent-1.0-py3-none-any.whl", "absent")


def test_a_file_that_is_not_a_zip_is_refused(tmp_path):
    (tmp_path / "fake-1.0-py3-none-any.whl").write_bytes(b"not a zip" * 100)
    with serve(tmp_path, RangeHandler) as (base, _), pytest.raises(RemoteWheelError):
        wheel_metadata(f"{base}/fake-1.0-py3-none-any.whl", "fake")
