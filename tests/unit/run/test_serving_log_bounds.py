"""Cells whose server writes past its log's bounds (attack L2 of 2026-12-06), through the real pipeline, store
and serve stage with the FAKE backend (tests/fakes/fake_backend.py), its server flooding real SGLang decode
lines: the cell proceeds or fails as its server's lines say, its log is bounded, and a harness that is
stopped or killed mid-flood leaves no server behind (the next run's reaper takes what a SIGKILL left)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from servematrix.classify import match_file
from servematrix.planning.plan import make_plan
from servematrix.records.row import Row
from servematrix.run.pipeline import run_plan
from servematrix.run.reaper import reap_orphans
from servematrix.run.runplan import RunOptions
from servematrix.stages import serve, serverlog
from servematrix.stages.serverlog import LogBounds, gap_marker
from servematrix.store.store import Store
from tests.conftest import REPO
from tests.fakes.fake_backend import MATRIX, FakeBackend
from tests.unit.stages.test_serverlog import MARKER

BOUNDS = LogBounds(head=64 * 1024, tail=64 * 1024)
FLOOD = str(512 * 1024)
MARKER_MAX = len(gap_marker(10**12, 10**10, BOUNDS)) + 1


@pytest.fixture
def matrix(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(MATRIX.format(server=""))
    return path


@pytest.fixture
def small_bounds(monkeypatch):
    monkeypatch.setattr(serverlog, "LOG_BOUNDS", BOUNDS)


def _run(matrix: Path, tmp_path: Path, *server_args: str) -> tuple[dict[str, str], list[Row]]:
    summary = run_plan(
        make_plan(matrix, ["mode=static"]),
        FakeBackend(tmp_path, server_args=("--after", "0", *server_args)),
        RunOptions(stages=("build", "serve"), store=tmp_path / "s.sqlite", workdir=tmp_path / "work"),
        console=Console(file=io.StringIO(), width=200),
    )
    with Store(tmp_path / "s.sqlite") as store:
        return summary.verdicts, store.all_rows()


def _bounded_log(row: Row, *, running: bool = False) -> bytes:
    text = Path(row.log_path).read_bytes()
    assert MARKER.search(text), text[:300]
    # Once its server has gone, head, marker and tail; while it runs, up to twice the tail and the piece being
    # written (a read's worth, and the end of the line it stopped in).
    limit = BOUNDS.head + BOUNDS.tail * (2 if running else 1) + MARKER_MAX
    limit += serverlog.READ_BYTES + 1024 if running else 0
    assert len(text) <= limit
    return text


def test_a_cell_whose_server_floods_its_log_before_it_answers_is_served(tmp_path, matrix, small_bounds):
    verdicts, rows = _run(matrix, tmp_path, "--flood", FLOOD, "--serve-when-replayed")
    assert set(verdicts.values()) == {"pass"} and len(rows) == 2
    for row in rows:
        assert _bounded_log(row).startswith(b"[fake] starting on")


def test_a_cell_whose_server_crashes_after_a_flood_fails_with_the_crash_named(tmp_path, matrix, small_bounds):
    crash = tmp_path / "crash.log"
    crash.write_text(
        "Traceback (most recent call last):\n"
        '  File "/venv/lib/python3.12/site-packages/transformers/cli/serve.py", line 12, in <module>\n'
        "    import fastapi\n"
        "ModuleNotFoundError: No module named 'fastapi'\n"
    )
    verdicts, rows = _run(matrix, tmp_path, "--flood", FLOOD, "--replay", str(crash), "--then", "hang")
    assert set(verdicts.values()) == {"fail:missing-module"}
    for row in rows:
        assert "No module named 'fastapi'" in row.excerpt
        assert _bounded_log(row).endswith(crash.read_bytes())
        found = match_file(row.log_path, "transformers")
        assert found is not None and found.cls == "missing-module"


HARNESS = """
import sys
from pathlib import Path
from servematrix.planning.plan import make_plan
from servematrix.run.pipeline import run_plan
from servematrix.run.runplan import RunOptions
from servematrix.stages import serverlog
from servematrix.util import interrupt_on_signals
from tests.fakes.fake_backend import FakeBackend

matrix, store, workdir, *server_args = sys.argv[1:]
serverlog.LOG_BOUNDS = serverlog.LogBounds(head=64 * 1024, tail=64 * 1024)
options = RunOptions(stages=("build", "serve"), store=Path(store), workdir=Path(workdir))
try:
    with interrupt_on_signals():
        run_plan(make_plan(Path(matrix), ["mode=static"]), FakeBackend(Path(workdir), server_args=server_args), options)
except KeyboardInterrupt:
    sys.exit(130)
"""


def _marked(marker: str) -> list[int]:
    return [p.pid for p in serve._carrying({marker})]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_harness_stopped_while_its_server_floods_leaves_no_server_and_a_bounded_log(tmp_path, matrix, sig):
    """The server floods without end and never answers; a worker of its group sleeps. SIGTERM: the harness
    stops it, its log is closed at head, marker and tail. SIGKILL: the log holds at most head, marker and
    twice the tail; the server's worker outlives the harness, and the next run's reaper kills it."""
    server_args = ("--after", "0", "--child", "--flood-after", "-1", "--then", "hang")
    harness = subprocess.Popen(
        [sys.executable, "-c", HARNESS, str(matrix), str(tmp_path / "s.sqlite"), str(tmp_path / "work"), *server_args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])},
        stdout=(tmp_path / "harness.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    row = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (tmp_path / "s.sqlite").exists():
            with Store(tmp_path / "s.sqlite") as store:
                running = [r for r in store.all_rows() if r.status == "running" and r.server_pgid]
            path = Path(running[0].log_path) if running else None
            if path is not None and path.exists() and MARKER.search(path.read_bytes()):
                row = running[0]
                break
        time.sleep(0.1)
    assert row is not None, (tmp_path / "harness.log").read_text()
    marker = serve.harness_marker(row.run_id, row.cell_id)
    assert _marked(marker)  # the server and its worker
    harness.send_signal(sig)
    assert harness.wait(timeout=60) == (130 if sig == signal.SIGTERM else -signal.SIGKILL)
    if sig == signal.SIGKILL:
        _bounded_log(row, running=True)
        assert _marked(marker), "the worker should have outlived the killed harness"
        with Store(tmp_path / "s.sqlite") as store:
            reap_orphans(store)
            (after,) = [r for r in store.all_rows() if r.cell_id == row.cell_id]
        assert after.verdict == "interrupted"
    else:
        _bounded_log(row)
    assert _marked(marker) == []
    assert not [p for p in psutil.process_iter() if p.pid == row.server_pid and p.status() != "zombie"]
