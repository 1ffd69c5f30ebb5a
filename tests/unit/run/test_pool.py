"""The concurrent pre-flight's parts (run/pool.py): the host's room, which environments run side by side, the
order they start in, and a job's progress as events its harness shows. The pool itself, through the real CLI:
tests/integration/test_preflight_pool.py."""

from __future__ import annotations

import io
import shutil

import pytest
from rich.console import Console

from servematrix.engines import load_engine
from servematrix.formats.lockfile import render_header
from servematrix.planning.plan import make_plan
from servematrix.run import pool, progress
from servematrix.run.progress import RunProgress, print_summary, relayed
from servematrix.run.runplan import RunOptions, reuse_for
from servematrix.stages.locking import resolve_request
from servematrix.stages.resolve import lock_header
from tests.conftest import MATRIX, SMALL_SGLANG


def test_the_room_is_the_least_of_cores_memory_and_disk(tmp_path):
    engine = load_engine("sglang")
    free_gb = shutil.disk_usage(tmp_path).free / 1e9
    roomy = pool.room(
        tmp_path,
        engine.model_copy(update={"import_check": engine.import_check.model_copy(update={"cost_gb": free_gb / 1000})}),
    )
    assert roomy.disk >= 999 and roomy.jobs == max(1, min(roomy.cores, roomy.memory))
    # An install larger than the free disk leaves room for none: one at a time, never none.
    tight = pool.room(
        tmp_path,
        engine.model_copy(update={"import_check": engine.import_check.model_copy(update={"cost_gb": free_gb * 2})}),
    )
    assert (tight.disk, tight.jobs) == (0, 1)
    assert "core(s), memory for" in tight.line() and "disk for 0" in tight.line()


def test_only_environments_this_host_does_not_serve_run_side_by_side(write_matrix, tmp_path):
    plan = make_plan(write_matrix(SMALL_SGLANG))  # b200 cells: this CPU host pre-flights them
    todo = {}
    for cell in plan.cells:
        todo.setdefault(cell.env_id, []).append(cell)
    options = RunOptions(
        stages=("resolve", "import", "probe"), fresh=True, store=tmp_path / "s", workdir=tmp_path, jobs=2
    )
    known = reuse_for(plan, options)
    assert set(pool.envs_to_pool(plan, options, todo, known)) == set(todo) and len(todo) > 1
    assert pool.envs_to_pool(plan, options, todo, known, but=set(list(todo)[1:])) == {}  # one left: no pool
    serial = RunOptions(stages=options.stages, fresh=True, store=options.store, workdir=tmp_path, jobs=1)
    assert pool.envs_to_pool(plan, serial, todo, known) == {}
    # The CPU smoke matrix's environments are served here (a CPU kind, with the build stage): never beside another.
    smoke = make_plan(MATRIX / "cpu-smoke.toml")
    served = {}
    for cell in smoke.cells:
        served.setdefault(cell.env_id, []).append(cell)
    everything = RunOptions(fresh=True, store=tmp_path / "s", workdir=tmp_path, jobs=4)
    assert pool.envs_to_pool(smoke, everything, served, reuse_for(smoke, everything)) == {}


def test_a_lock_bodys_second_environment_starts_after_every_bodys_first(write_matrix, tmp_path):
    plan = make_plan(write_matrix(SMALL_SGLANG))
    envs = {}
    for cell in plan.cells:
        envs.setdefault(cell.env_id, []).append(cell)
    locks = tmp_path / "locks"
    locks.mkdir()
    env_ids = list(envs)
    # The first two share a body under their own headers; the others have none yet (their own, each).
    for env_id in env_ids[:2]:
        header = render_header(lock_header(resolve_request(plan, env_id), crossed={}, resolver="uv (the test's)"))
        (locks / f"{env_id}.lock.txt").write_text(header + "six==1.16.0 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    options = RunOptions(lock_dir=locks, store=tmp_path / "s", workdir=tmp_path, jobs=2)
    order = pool.queue_order(plan, options, envs)
    assert sorted(order) == sorted(env_ids)
    assert order.index(env_ids[1]) == len(order) - 1  # the body's second: after every first
    assert order[:-1] == [e for e in env_ids if e != env_ids[1]]


@pytest.fixture
def relaying():
    out = io.StringIO()
    progress.relay_to(out)
    yield out
    progress.relay_to(None)


def test_a_jobs_progress_is_events_for_its_harness_and_no_summary(relaying, write_matrix):
    cell = make_plan(write_matrix(SMALL_SGLANG)).cells[0]
    shown = io.StringIO()
    job = RunProgress(Console(file=shown), title="m", total=1)
    job.stage(cell, "import")
    job.line(cell, "import still running: 20s in this stage")
    job.finished(cell, "skipped:no-gpu")
    print_summary(Console(file=shown), "run", {cell.id: cell}, {cell.id: "skipped:no-gpu"})
    assert shown.getvalue() == ""  # nothing shown by the job itself
    events = [relayed(line) for line in relaying.getvalue().splitlines()]
    assert events == [
        {"cell": cell.id, "stage": "import"},
        {"cell": cell.id, "line": "import still running: 20s in this stage"},
        {"cell": cell.id, "verdict": "skipped:no-gpu"},
    ]
    assert relayed("servematrix: import checks: 2 of 2 finished") is None
    assert relayed(progress.RELAY_MARK + "not json") is None


def test_the_harness_shows_a_jobs_events_as_its_own_lines_with_the_runs_count(write_matrix):
    cells = make_plan(write_matrix(SMALL_SGLANG)).cells[:2]
    shown = io.StringIO()
    harness = RunProgress(Console(file=shown), title="m", total=2)
    harness.stage(cells[0], "import")
    harness.finished(cells[0], "skipped:no-gpu")
    harness.note(cells[1], "load still running")
    harness.finished(cells[1], "predicted-fail:load-failed")
    lines = shown.getvalue().splitlines()
    assert [line.split("] ", 1)[0].split()[0] for line in lines] == ["[0/2", "[1/2", "[1/2", "[2/2"]
    assert all(line.split("] ", 1)[1].startswith(cells[i // 2].id) for i, line in enumerate(lines))
    assert "sglang=" in lines[0] and lines[-1].endswith("predicted-fail:load-failed")
