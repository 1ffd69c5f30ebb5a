"""The concurrent pre-flight (`run --jobs`, run/pool.py) against one environment at a time: the same cells
`--fresh` with `--jobs 1` and with the default (the host's room, `pool.room`), both measured in this run, each
from its own empty workdir (no import check or load result cached), and the ratio printed. The rows' verdicts
must be the same.

By default the cells are the test engine's on the stand-in index (tests/integration/test_preflight_pool.py):
six environments of two modes, each an import check and a load pre-flight per cell that run in the
environment's installed lock, each of them a core's work of POOL_SPIN_S seconds (the stand-in for importing a
release). With SERVEMATRIX_BENCH_POOL_MATRIX (and SERVEMATRIX_BENCH_POOL_SELECT) it runs that matrix's cells at
the pre-flight stages instead, with the committed locks and this host's uv cache: the issue's measurement of the
product matrix (`matrix/glm5-nvfp4.toml`, tens of minutes per run). The default run goes first, so the
baseline finds uv's cache as warm as it left it: the ratio is, if anything, understated.
SERVEMATRIX_BENCH_POOL_JOBS=N measures `--jobs N` in place of the default (a host whose free disk bounds the
default to 1 measures nothing otherwise).
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servematrix.engines import load_engine
from servematrix.run import pool
from tests.integration.test_preflight_pool import PACKAGES, _finished, _project, _run
from tests.unit.releases.standin import Upload, standin_index

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ("1.4", "1.5", "2.1", "2.2", "2.3", "2.4")
SPIN_S = "2"


def _variants() -> tuple[tuple[str, tuple[str, ...]], ...]:
    chosen = os.environ.get("SERVEMATRIX_BENCH_POOL_JOBS")
    return (("default", ("--jobs", chosen) if chosen else ()), ("jobs-1", ("--jobs", "1")))


def _verdicts(store: Path) -> dict[str, str]:
    with sqlite3.connect(store) as db:
        return dict(db.execute("SELECT cell_id, verdict FROM cell_runs WHERE status = 'finished'"))


def _timed(process: subprocess.Popen[str], name: str, at_once: dict[str, str]) -> float:
    """The run's seconds; how many environments it ran at once, as it said."""
    started = time.perf_counter()
    out = _finished(process)
    seconds = time.perf_counter() - started
    found = re.search(r"environment\(s\) \(\d+ cell\(s\)\), (\d+) at once", out)
    at_once[name] = found[1] if found else "1"
    return seconds


Measured = tuple[dict[str, float], dict[str, dict[str, str]], dict[str, str], str]


def _toy(tmp_path: Path) -> Measured:
    projects = {"toyserve": [*PACKAGES["toyserve"], *(Upload(v) for v in ("1.5", "2.3", "2.4"))]}
    seconds, verdicts, at_once = {}, {}, {}
    with standin_index(tmp_path / "index", projects) as index:
        for name, jobs in _variants():
            root, env = _project(tmp_path, index, VERSIONS, name=name)
            env["POOL_SPIN_S"] = SPIN_S
            seconds[name] = _timed(_run(root, env, *jobs), name, at_once)
            verdicts[name] = _verdicts(root / "s.sqlite")
    what = (
        f"{len(VERSIONS)} environments of the test engine, {len(VERSIONS) * 2} cells, {SPIN_S} s of a core per program"
    )
    return seconds, verdicts, at_once, what


def _matrix(tmp_path: Path, matrix: str, select: str) -> Measured:
    seconds, verdicts, at_once = {}, {}, {}
    argv = [sys.executable, "-m", "servematrix", "run", matrix, "--fresh", "--stages", "resolve,import,probe"]
    argv += ["--select", select] if select else []
    for name, jobs in _variants():
        store = tmp_path / f"{name}.sqlite"
        process = subprocess.Popen(
            [*argv, "--store", str(store), "--workdir", str(tmp_path / f"wd-{name}"), *jobs],
            cwd=ROOT,
            env={**os.environ, "UV_PYTHON_DOWNLOADS": "never", "NO_COLOR": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        seconds[name] = _timed(process, name, at_once)
        verdicts[name] = _verdicts(store)
    return seconds, verdicts, at_once, f"{matrix} {select or '(every cell)'}"


def test_preflight_side_by_side_against_one_environment_at_a_time(tmp_path):
    matrix = os.environ.get("SERVEMATRIX_BENCH_POOL_MATRIX")
    if matrix:
        measured = _matrix(tmp_path, matrix, os.environ.get("SERVEMATRIX_BENCH_POOL_SELECT", ""))
    else:
        measured = _toy(tmp_path)
    seconds, verdicts, at_once, what = measured
    room = pool.room(tmp_path, load_engine("sglang"))  # the host's figures, with the product engine's disk
    chosen = os.environ.get("SERVEMATRIX_BENCH_POOL_JOBS")
    print(
        f"\n{what}, --fresh at resolve,import,probe: --jobs 1 {seconds['jobs-1']:.1f} s; "
        f"{f'--jobs {chosen}' if chosen else 'the default'}, {at_once['default']} at once, {seconds['default']:.1f} s; {seconds['jobs-1'] / seconds['default']:.2f}x "
        f"(this host: {room.line()})"
    )
    assert verdicts["default"] == verdicts["jobs-1"] and verdicts["default"]
    assert at_once["jobs-1"] == "1"
