"""The harness survives its own faults, with the real CPU server: SIGINT stops cleanly and marks the
partial cell interrupted; SIGKILL mid-run loses no finished result, and the next run kills the orphaned
server and completes the rest."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from servematrix.store.store import Store
from tests.conftest import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SMALL_BENCH = """
[bench]
concurrency = [4]
input_len = 16
output_len = 16
prompts_per_concurrency = 8
warmup = 1
repeats = 1
"""


def _matrix(project: Path) -> Path:
    path = project / "matrix" / "cpu-smoke.toml"
    text = path.read_text()
    path.write_text(text[: text.index("[bench]")] + SMALL_BENCH)
    return path


def _harness(project: Path, cache: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "servematrix",
            "run",
            "matrix/cpu-smoke.toml",
            "--backend",
            "venv",
            "--select",
            "transformers=5.24.0",
            "--workdir",
            str(cache / "work"),
            "--store",
            "results.sqlite",
            "--no-report",
        ],
        cwd=project,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # Started as a shell's background job is, with SIGINT ignored: the harness must still stop on it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )


def _wait_for(project: Path, predicate, timeout_s: float = 600.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (project / "results.sqlite").exists():
            with Store(project / "results.sqlite") as store:
                rows = store.all_rows()
            found = predicate(rows)
            if found:
                return found
        time.sleep(0.5)
    raise AssertionError("timed out waiting for the harness")


def _serving(rows):
    running = [r for r in rows if r["status"] == "running" and r["server_pid"]]
    return running[0] if running else None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_sigint_then_sigkill_then_resume(smoke_project, test_cache):
    _matrix(smoke_project)

    # 1. SIGINT while a server runs: exit 130, the cell is interrupted, its server is gone.
    harness = _harness(smoke_project, test_cache)
    row = _wait_for(smoke_project, _serving)
    harness.send_signal(signal.SIGINT)
    assert harness.wait(timeout=120) == 130
    with Store(smoke_project / "results.sqlite") as store:
        (interrupted,) = [r for r in store.all_rows() if r["cell_id"] == row["cell_id"]]
    assert interrupted["verdict"] == "interrupted" and interrupted["status"] == "finished"
    assert not _alive(row["server_pid"])

    # 2. SIGKILL once one cell has finished and the next one's server runs: the server is orphaned.
    harness = _harness(smoke_project, test_cache)
    first_run = _wait_for(smoke_project, lambda rows: {r["run_id"] for r in rows if r["verdict"] == "pass"})
    victim = _wait_for(
        smoke_project,
        lambda rows: next(
            (r for r in rows if r["status"] == "running" and r["server_pid"] and r["run_id"] in first_run), None
        ),
    )
    harness.kill()
    harness.wait(timeout=30)
    orphan = victim["server_pid"]
    assert _alive(orphan), "the server should have outlived the killed harness"
    with Store(smoke_project / "results.sqlite") as store:
        finished_before = {(r["cell_id"], r["run_id"]) for r in store.all_rows() if r["verdict"] == "pass"}
    assert finished_before

    # 3. The next run reaps the orphan, keeps the finished cell, and completes the rest.
    harness = _harness(smoke_project, test_cache)
    assert harness.wait(timeout=900) == 0
    assert not _alive(orphan)
    with Store(smoke_project / "results.sqlite") as store:
        rows = store.all_rows()
    assert finished_before <= {(r["cell_id"], r["run_id"]) for r in rows if r["verdict"] == "pass"}
    assert {r["cell_id"] for r in rows if r["verdict"] == "pass"} == {r["cell_id"] for r in rows}
    assert any(r["verdict"] == "interrupted" and r["cell_id"] == victim["cell_id"] for r in rows)
    assert not [r for r in rows if r["status"] == "running"]
    for r in rows:
        if r["server_pid"]:
            assert not _alive(r["server_pid"])
