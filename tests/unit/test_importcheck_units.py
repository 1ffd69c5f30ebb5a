"""The import check's bookkeeping: what an install fetched, read from uv's own lines, and the link mode."""

from __future__ import annotations

from servematrix.stages.importcheck import downloads, link_mode


def test_what_an_install_fetched_is_read_from_uv_and_the_cache_growth():
    stderr = "Using Python 3.12.3\nPrepared 12 packages in 3.1s\nInstalled 180 packages in 1.2s\n"
    assert downloads(stderr, 2_340_000_000) == "fetched 12 of 180 packages, uv's cache grew 2.34 GB"
    # Everything already in the cache: uv prints no Prepared line.
    assert downloads("Installed 1 package in 3ms\n", 0) == "fetched 0 of 1 packages, uv's cache grew 0.00 GB"
    assert downloads("", None) == ""


def test_link_mode_is_hardlink_on_one_filesystem_else_copy(tmp_path):
    (tmp_path / "venvs").mkdir()
    (tmp_path / "cache").mkdir()
    assert link_mode(tmp_path / "venvs" / "k", tmp_path / "cache") == "hardlink"
    assert link_mode(tmp_path / "venvs" / "k", None) == "copy"
    assert link_mode(tmp_path / "gone" / "k", tmp_path / "cache") == "copy"
