"""The import check's bookkeeping: what an install fetched, read from uv's own lines, and the link mode."""

from __future__ import annotations

from servematrix.stages.importcheck import distinct_locks, downloads, link_mode


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


def test_the_plan_counts_one_import_check_per_distinct_lock_body(tmp_path):
    body = "six==1.16.0 \\\n    --hash=sha256:00\n"
    (tmp_path / "b200.lock.txt").write_text("# axis: gpu=b200\n" + body)
    (tmp_path / "rtx.lock.txt").write_text("# axis: gpu=rtx-pro-6000\n" + body)
    (tmp_path / "other.lock.txt").write_text("# axis: gpu=b200\n" + body.replace("1.16.0", "1.17.0"))
    assert distinct_locks(["b200", "rtx"], tmp_path) == 1
    assert distinct_locks(["b200", "rtx", "other", "not-locked-yet"], tmp_path) == 3
