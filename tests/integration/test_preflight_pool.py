"""The pre-flight pool (`run --jobs N`, run/pool.py) through the real CLI on a CPU host: the test-defined engine
with an import check and a load-like pre-flight that runs in the environment's installed lock (as sglang's load
pre-flight does), environments resolved by uv from the stand-in index and installed from it. Every program of
the pre-flight writes when it started and ended (`MARK`), so what ran beside what is read from the programs'
own records, not from the harness's word or the clock of the whole run."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from servematrix.engines import ENGINES_PATH_ENV
from servematrix.run import hostinfo
from tests.conftest import REPO
from tests.unit.releases.standin import Upload, standin_index

pytestmark = [pytest.mark.integration]

MATRIX = """
engine = "toyserve"
[model]
name = "m"
path = "m"
[axes]
toyserve = [{versions}]
gpu = [{gpus}]
mode = ["short", "long"]
[gpu.b200]
arch = "sm_100"
count = 1
[gpu.h200]
arch = "sm_90"
count = 1
[bench]
concurrency = [1]
input_len = 8
output_len = 8
prompts_per_concurrency = 2
"""

# Run by the lock's interpreter: the import check's --help stand-in, and the load pre-flight's probe. It records
# its start and end in $POOL_MARKS as `<what>-<toyserve version>[-<mode>]-start|end`; if $POOL_WAITS names it
# (`load-2.1-short:import-1.4`), it waits (at most $POOL_WAIT_S) for that other program to have started; if
# $POOL_HOLD names it, it waits for $POOL_MARKS/release (an interrupted run's program, stopped by the harness).
# $POOL_SPIN_S: seconds of a core's work first (the benchmark's stand-in for an import or sglang's start-up).
MARK = r"""
import importlib.metadata, os, pathlib, sys, time
name = "-".join([sys.argv[1], importlib.metadata.version("toyserve"), *sys.argv[2:]])
marks = pathlib.Path(os.environ["POOL_MARKS"])
(marks / f"{name}-start").write_text(repr(time.time()))
with open(marks / "runs", "a") as runs:
    runs.write(name + "\n")
spin = time.process_time() + float(os.environ.get("POOL_SPIN_S", "0"))  # a core's work (the benchmark's)
while time.process_time() < spin:
    pass
waits = dict(pair.split(":") for pair in os.environ.get("POOL_WAITS", "").split(",") if pair)
held = name in os.environ.get("POOL_HOLD", "").split(",")
deadline = time.time() + float(os.environ.get("POOL_WAIT_S", "60"))
while time.time() < deadline and (
    (name in waits and not (marks / f"{waits[name]}-start").exists()) or (held and not (marks / "release").exists())
):
    time.sleep(0.05)
(marks / f"{name}-end").write_text(repr(time.time()))
"""

# The toy engine's hooks, with a pre-flight that runs the cell's environment (its lock installed on the CPU,
# `inp.python`), as sglang's load pre-flight does: toyserve 2.2 "cannot load" the short mode.
HOOKS = """

import os
import subprocess


def load(inp):
    python = inp.python() if inp.python is not None else None
    if python is None:
        return None
    if inp.cell.mode == "short" and os.environ.get("POOL_STRAY"):  # a program it starts, in a session of its own,
        subprocess.Popen([str(python), os.environ["POOL_MARK_SCRIPT"], "stray"], start_new_session=True)  # and leaves
    done = subprocess.run([str(python), os.environ["POOL_MARK_SCRIPT"], "load", inp.cell.mode], check=False)
    if done.returncode:
        raise RuntimeError(f"the load stand-in exited {done.returncode}")
    if inp.cell.mode == "short" and inp.cell.env.version == "2.2":
        return Verdict(kind="predicted-fail", detail="load-failed", excerpt="toyserve 2.2 loads no short context")
    return Verdict(kind="pass", evidence=(f"load: loaded toyserve {inp.cell.env.version}",))


PREFLIGHTS = {**PREFLIGHTS, "load": load}
"""


def _project(
    tmp_path: Path, index: str, versions: tuple[str, ...], name: str = "project", gpus: tuple[str, ...] = ("b200",)
) -> tuple[Path, dict[str, str]]:
    """A project folder (the matrix, its locks, store, workdir and uv cache), the engine data and hooks beside it
    (shared by the projects of a test: they are in the pre-flights' keys), and the environment the CLI runs in."""
    root = tmp_path / name
    root.mkdir()
    quoted = {"versions": versions, "gpus": gpus}
    (root / "toy.toml").write_text(MATRIX.format(**{k: ", ".join(f'"{v}"' for v in vs) for k, vs in quoted.items()}))
    engines = tmp_path / "engines"
    shutil.copytree(REPO / "tests" / "fakes" / "engines", engines, dirs_exist_ok=True)
    hooks = tmp_path / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "toy_pool_hooks.py").write_text((REPO / "tests" / "fakes" / "toy_engine.py").read_text() + HOOKS)
    script = tmp_path / "mark.py"
    script.write_text(MARK)
    data = engines / "toyserve.toml"
    text = data.read_text().replace('hooks = "tests.fakes.toy_engine"', 'hooks = "toy_pool_hooks"')
    text = text.replace('preflight = ["context-limit"]', 'preflight = ["import", "context-limit", "load"]')
    data.write_text(text + f'\n[import_check]\nmodules = ["toyserve"]\nhelp = ["python", "{script}", "import"]\n')
    marks = root / "marks"
    marks.mkdir()
    env = {
        **os.environ,
        ENGINES_PATH_ENV: str(engines),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(hooks), os.environ.get("PYTHONPATH", "")]),
        "UV_DEFAULT_INDEX": index,
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_CACHE_DIR": str(root / "uv-cache"),
        "POOL_MARKS": str(marks),
        "POOL_MARK_SCRIPT": str(script),
    }
    env.pop(hostinfo.STANDIN_GPUS_ENV, None)  # a CPU host: the b200 cells are pre-flighted, not served
    return root, env


def _run(root: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "servematrix", "run", "toy.toml", "--fresh", "--store", "s.sqlite"),
            *("--workdir", "work", "--lock-dir", "locks", "--stages", "resolve,import,probe", *args),
        ],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _finished(process: subprocess.Popen[str]) -> str:
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0, out[-4000:]
    return out


def _marks(folder: Path) -> dict[str, tuple[float, float]]:
    """(start, end) of each program that ran: `import-1.4`, `load-2.1-short`, ..."""
    found: dict[str, list[float]] = {}
    for path in folder.glob("*-start"):
        name = path.name.removesuffix("-start")
        end = folder / f"{name}-end"
        found[name] = [float(path.read_text()), float(end.read_text()) if end.exists() else float("inf")]
    return {name: (start, end) for name, (start, end) in found.items()}


def _rows(store: Path) -> dict[str, dict]:
    with sqlite3.connect(store) as db:
        db.row_factory = sqlite3.Row
        return {r["cell_id"]: dict(r) for r in db.execute("SELECT * FROM cell_runs")}


PACKAGES = {"toyserve": [Upload("1.4"), Upload("2.1"), Upload("2.2")]}


def test_with_two_jobs_one_environments_load_runs_while_anothers_import_check_runs(tmp_path):
    with standin_index(tmp_path / "index", PACKAGES) as index:
        root, env = _project(tmp_path, index, ("1.4", "2.1"))
        # 2.1's first load waits for 1.4's import check to start, which waits for that load to start: both happen
        # only when the two environments run at once (one at a time, each wait would run out).
        env["POOL_WAITS"] = "load-2.1-short:import-1.4,import-1.4:load-2.1-short"
        out = _finished(_run(root, env, "--jobs", "2"))
    marks = _marks(root / "marks")
    (load_start, load_end), (import_start, import_end) = marks["load-2.1-short"], marks["import-1.4"]
    assert load_start < import_end and import_start < load_end, (marks, out[-3000:])  # side by side
    assert marks["import-2.1"][1] <= load_start  # an environment's own stages stay in order
    assert "pre-flight: 2 environment(s) (4 cell(s)), 2 at once" in out, out[-3000:]
    # Each progress line names its cell and environment, and the run's own count, whichever job sent it.
    lines = [line for line in out.splitlines() if re.match(r"\[\d+/4 +\d+s\] \S+ toyserve=", line)]
    assert {re.search(r"toyserve=(\S+)", line)[1] for line in lines if line.endswith(": import")} == {"1.4", "2.1"}
    counted = [int(re.match(r"\[(\d+)/", line)[1]) for line in lines if line.endswith(("no-gpu", "too-long"))]
    assert counted == [1, 2, 3, 4], out[-3000:]
    verdicts = {(json.loads(r["axes"])["toyserve"], r["mode"]): r["verdict"] for r in _rows(root / "s.sqlite").values()}
    assert verdicts == {
        ("1.4", "short"): "skipped:no-gpu",
        ("1.4", "long"): "fail:context-too-long",
        ("2.1", "short"): "skipped:no-gpu",
        ("2.1", "long"): "skipped:no-gpu",
    }


# How the import check ran, not what it found: read from its cache (a run one environment at a time checks the
# distinct locks ahead, then reads them) or not, and what its install fetched, measured over the one uv cache
# that other installs grow (and empty of their temporary files) meanwhile: a measurement, as a time is. And the
# run's own fields.
RUN_FIELDS = {"run_id", "started_at", "finished_at", "stages", "harness_pid"}


def _comparable(row: dict) -> dict:
    kept = {k: v for k, v in row.items() if k not in RUN_FIELDS}
    return json.loads(re.sub(r" \(cached\)| \(fetched [^()]*\)", "", json.dumps(kept)))


def test_the_pool_stores_the_rows_one_environment_at_a_time_stores(tmp_path):
    versions = ("1.4", "2.1", "2.2")
    stores = {}
    with standin_index(tmp_path / "index", PACKAGES) as index:
        for jobs in ("1", "3"):
            root, env = _project(tmp_path, index, versions, name=f"jobs-{jobs}")
            out = _finished(_run(root, env, "--jobs", jobs))
            assert ("at once, each in a process of its own" in out) == (jobs != "1"), out[-3000:]
            stores[jobs] = _rows(root / "s.sqlite")
    serial, pooled = stores["1"], stores["3"]
    assert len(serial) == 6 and set(serial) == set(pooled)
    assert {r["verdict"] for r in serial.values()} == {
        "skipped:no-gpu",
        "fail:context-too-long",
        "predicted-fail:load-failed",
    }
    for cell_id, row in serial.items():
        one, other = _comparable(row), _comparable(pooled[cell_id])
        assert one == other, {k: (one[k], other.get(k)) for k in one if one[k] != other.get(k)}


def test_two_environments_of_one_lock_body_import_check_it_once_side_by_side(tmp_path):
    """Two GPU kinds' environments of one release: one lock body under two headers. Started at once, one
    installs and imports it while the other waits for its result (an import check's venv is named by the
    body: two installs into it at once would break each other); both then run their load pre-flights."""
    with standin_index(tmp_path / "index", PACKAGES) as index:
        root, env = _project(tmp_path, index, ("2.1",), gpus=("b200", "h200"))
        out = _finished(_run(root, env, "--jobs", "2"))
    assert "pre-flight: 2 environment(s) (4 cell(s)), 2 at once" in out, out[-3000:]
    runs = (root / "marks" / "runs").read_text().split()
    assert runs.count("import-2.1") == 1 and runs.count("load-2.1-short") == 2, runs
    rows = _rows(root / "s.sqlite").values()
    notes = sorted(json.loads(r["preflight"])["import"]["evidence"][0].split(":")[0] for r in rows)
    assert notes == ["import check", "import check", "import check (cached)", "import check (cached)"], notes
    assert {r["verdict"] for r in rows} == {"skipped:no-gpu"}


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:  # it ended between the listing and the read (a zombie until reaped)
        return ""


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_an_interrupted_pool_keeps_its_finished_rows_and_leaves_no_process(tmp_path, sig):
    with standin_index(tmp_path / "index", PACKAGES) as index:
        root, env = _project(tmp_path, index, ("1.4", "2.1", "2.2"))
        # 1.4 runs to its end; 2.1's load and 2.2's import check hold until the run is stopped.
        # Each load pre-flight of a short mode also starts a program and leaves it, held too (`stray-<version>`):
        # its job kills it as it ends, finished (1.4) or stopped (2.1).
        env.update(POOL_HOLD="load-2.1-short,import-2.2,stray-1.4,stray-2.1", POOL_WAIT_S="300", POOL_STRAY="1")
        harness = _run(root, env, "--jobs", "3")
        marks = root / "marks"
        deadline = time.monotonic() + 240
        rows: dict[str, dict] = {}
        while time.monotonic() < deadline:
            held = all((marks / f"{name}-start").exists() for name in ("load-2.1-short", "import-2.2", "stray-2.1"))
            try:
                rows = _rows(root / "s.sqlite") if (root / "s.sqlite").exists() else {}
            except sqlite3.OperationalError:  # the store is being made: no table yet
                rows = {}
            done = [r for r in rows.values() if r["status"] == "finished"]
            if held and len(done) == 2:
                break
            assert harness.poll() is None, harness.communicate()[0][-3000:]
            time.sleep(0.2)
        started = psutil.Process(harness.pid).children(recursive=True)
        assert [p for p in started if "servematrix.run.packjob" in _cmdline(p)], "no pre-flight job"
        harness.send_signal(sig)
        out, _ = harness.communicate(timeout=120)
    # SIGKILL: the harness could not stop its jobs; each ends with it (PR_SET_PDEATHSIG) and stops what it started.
    assert harness.returncode == (-signal.SIGKILL if sig == signal.SIGKILL else 130), out[-3000:]

    def left() -> list[str]:  # what the run started, a program a job left included (not the run's child)
        strays = [p for p in psutil.process_iter() if str(tmp_path / "mark.py") in _cmdline(p)]
        return [f"{p.pid}: {_cmdline(p)}" for p in {*started, *strays} if _alive(p)]

    deadline = time.monotonic() + 60
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left(), (left(), out[-3000:])  # no job, no install, no probe left
    assert (marks / "stray-1.4-start").exists() and (marks / "stray-2.1-start").exists()
    assert not list(marks.glob("stray-*-end"))  # killed, not ended of their own
    assert not (marks / "load-2.1-short-end").exists() and not (marks / "import-2.2-end").exists()  # stopped, not done
    after = _rows(root / "s.sqlite")
    verdicts = {(json.loads(r["axes"])["toyserve"], r["mode"]): (r["status"], r["verdict"]) for r in after.values()}
    # 1.4's cells were finished before the signal: kept as they were. The held ones are interrupted.
    assert verdicts[("1.4", "short")] == ("finished", "skipped:no-gpu")
    assert verdicts[("1.4", "long")] == ("finished", "fail:context-too-long")
    assert verdicts[("2.1", "short")] == ("finished", "interrupted")
    assert verdicts[("2.2", "short")] == ("finished", "interrupted")
    assert not [v for v in verdicts.values() if v[0] != "finished"]
