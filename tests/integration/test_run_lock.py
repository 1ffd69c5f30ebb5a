"""Two `run` processes on one store: each cell is run by one of them, never by both at once. Real processes,
a real store; the fake backend's server (a real process) takes a moment to get ready, so the runs overlap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servematrix.store.store import Store
from tests.conftest import REPO
from tests.fakes.fake_backend import MATRIX

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Each child imports everything, says so, then waits for the start file: the runs start together.
CHILD = """
import io, json, os, sys, time
from pathlib import Path
from rich.console import Console
from servematrix.run.runplan import RunOptions
from servematrix.run.pipeline import run_plan
from servematrix.planning.plan import make_plan
from tests.fakes.fake_backend import FakeBackend

matrix, store, work, start = map(Path, sys.argv[1:5])
plan = make_plan(matrix)
backend = FakeBackend(work, server_args=("--serve-after", "1.0"))
(start.parent / f"ready-{os.getpid()}").touch()
while not start.exists():
    time.sleep(0.002)
console = Console(file=io.StringIO(), width=200)
summary = run_plan(plan, backend, RunOptions(stages=("build", "serve"), store=store, workdir=work), console=console)
print(json.dumps({"ran": summary.verdicts, "owned": summary.skipped_owned, "unchanged": summary.skipped_unchanged,
                  "said": console.file.getvalue()}))
"""


def test_two_runs_on_one_store_split_the_cells(tmp_path):
    matrix = tmp_path / "m.toml"
    matrix.write_text(MATRIX.format(server=""))
    store, start = tmp_path / "s.sqlite", tmp_path / "go"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(matrix), str(store), str(tmp_path / f"work-{i}"), str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "src")])},
        )
        for i in range(2)
    ]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("ready-*"))) < len(children) and time.monotonic() < deadline:
        time.sleep(0.01)
    start.touch()
    outputs = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err
        outputs.append(json.loads(out))

    with Store(store) as opened:
        rows = opened.all_rows()
    cells = [r["cell_id"] for r in rows]
    assert len(cells) == 4 and len(set(cells)) == 4, "a cell was run twice"
    assert {r["verdict"] for r in rows} == {"pass"} and not opened_running(store)
    ran = [set(o["ran"]) for o in outputs]
    assert not ran[0] & ran[1] and ran[0] | ran[1] == set(cells)
    # At least one run met a cell the other was running, skipped it, and said so.
    owned = {cell: pid for o in outputs for cell, pid in o["owned"].items()}
    assert owned, outputs
    assert set(owned.values()) <= {c.pid for c in children}
    assert any("another run" in o["said"] for o in outputs)


def opened_running(store: Path) -> list:
    with Store(store) as opened:
        return opened.running()
