"""Issue 47 through the real CLI: `servematrix run` serves the test engine's cells on a stand-in GPU with
`--backend existing` (an interpreter where `toyserve` is installed, whose console script is the fake GPU
server), each cell pre-flighting itself first on that interpreter (its import check and its hooks); then
`servematrix report --publish` and `servematrix recommend` show the pairs scored. A planted pre-flight predicts
a failure for one cell that then serves: contradicted, named per engine and per pre-flight."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from servematrix import engines as engine_data
from servematrix.engines import ENGINES_PATH_ENV
from servematrix.formats.lockfile import render_header
from servematrix.planning.plan import make_plan
from servematrix.stages.locking import resolve_request
from servematrix.stages.resolve import lock_header
from tests.conftest import REPO
from tests.fakes.fake_backend_harness import FAKE_MULTI_GPU_SERVER

pytestmark = [pytest.mark.integration]

MATRIX = """
engine = "toyserve"
[model]
name = "m"
path = "m"
[axes]
toyserve = ["2.1"]
gpu = ["h100"]
mode = ["short", "long"]
[gpu.h100]
arch = "sm_90"
count = 1
[server]
ready_timeout_s = 60
[bench]
concurrency = [1]
input_len = 8
output_len = 8
prompts_per_concurrency = 2
"""

# A pre-flight that predicts a failure the server does not show: the short mode "cannot" serve.
PLANTED = """

def planted(inp):
    if inp.cell.mode == "short":
        return Verdict(kind="predicted-fail", detail="planted")
    return None


PREFLIGHTS = {**PREFLIGHTS, "planted": planted}
"""


def _project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The engine data (import check, the toy's hook, the planted one), the hooks module, the matrix, its lock
    (written as `servematrix lock` writes it: toyserve is on no index) and the served interpreter."""
    engines = tmp_path / "engines"
    shutil.copytree(REPO / "tests" / "fakes" / "engines", engines)
    hooks = tmp_path / "hooks" / "toy_hooks_selfcheck.py"
    hooks.parent.mkdir()
    hooks.write_text((REPO / "tests" / "fakes" / "toy_engine.py").read_text() + PLANTED)
    data = engines / "toyserve.toml"
    text = data.read_text()
    text = text.replace('hooks = "tests.fakes.toy_engine"', 'hooks = "toy_hooks_selfcheck"')
    text = text.replace('preflight = ["context-limit"]', 'preflight = ["import", "context-limit", "planted"]')
    data.write_text(text + '\n[import_check]\nmodules = ["toyserve"]\n')
    monkeypatch.setenv(ENGINES_PATH_ENV, str(engines))
    monkeypatch.syspath_prepend(str(hooks.parent))
    engine_data._load.cache_clear()
    (tmp_path / "toy.toml").write_text(MATRIX)
    plan = make_plan(tmp_path / "toy.toml")
    engine_data._load.cache_clear()
    locks = tmp_path / "locks"
    locks.mkdir()
    for env_id in plan.environments:
        request = resolve_request(plan, env_id)
        body = f"toyserve=={request.axes['toyserve']} \\\n    --hash=sha256:{'0' * 64}\n"
        header = render_header(lock_header(request, crossed={}, resolver="uv (written by the test)"))
        (locks / f"{env_id}.lock.txt").write_text(header + body)

    # The served interpreter: a venv holding toyserve 2.1 (its metadata and a module), whose `toyserve`
    # console script is the fake GPU server.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    (site,) = (venv / "lib").glob("python*/site-packages")
    (site / "toyserve").mkdir()
    (site / "toyserve" / "__init__.py").write_text("")
    (site / "toyserve-2.1.dist-info").mkdir()
    (site / "toyserve-2.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: toyserve\nVersion: 2.1\n")
    script = venv / "bin" / "toyserve"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_MULTI_GPU_SERVER}" "$@"\n')
    script.chmod(0o755)
    (tmp_path / "records").mkdir()
    return {
        **os.environ,
        ENGINES_PATH_ENV: str(engines),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(hooks.parent), os.environ.get("PYTHONPATH", "")]),
        "FAKE_GPU_RECORDS": str(tmp_path / "records"),
        "PYTHON": str(venv / "bin" / "python"),
    }


def _cli(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servematrix", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_cli_serves_cells_that_pre_flight_themselves_and_publishes_the_pairs_scored(tmp_path, monkeypatch):
    env = _project(tmp_path, monkeypatch)
    done = _cli(
        env,
        tmp_path,
        "run",
        "toy.toml",
        *("--backend", "existing", "--python", env["PYTHON"], "--standin-gpus", "1", "--fresh"),
        *("--store", "s.sqlite", "--workdir", "work", "--lock-dir", "locks"),
        *("--stages", "resolve,import,build,probe,serve"),
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    with sqlite3.connect(tmp_path / "s.sqlite") as db:
        db.row_factory = sqlite3.Row
        rows = {r["mode"]: dict(r) for r in db.execute("SELECT * FROM cell_runs")}
    assert {mode: row["verdict"] for mode, row in rows.items()} == {"short": "pass", "long": "pass"}, rows
    assert len(list((tmp_path / "records").glob("*.json"))) == 2  # both were served, by the fake GPU server

    # Each row: its own prediction, and each pre-flight's outcome on the served interpreter.
    assert rows["short"]["prediction"] == "predicted-fail:planted"
    assert rows["long"]["prediction"] == "pass"
    short, long = (json.loads(rows[m]["preflight"]) for m in ("short", "long"))
    assert short["planted"]["outcome"] == "verdict" and short["planted"]["verdict"] == "predicted-fail:planted"
    assert long["planted"]["outcome"] == "passed" and long["context-limit"]["outcome"] == "passed"
    assert short["import"]["outcome"] == "passed"
    assert any("on the served interpreter: pass: imported toyserve" in e for e in short["import"]["evidence"])
    evidence = json.loads(rows["short"]["evidence"])
    assert "predicted predicted-fail:planted on this interpreter: contradicted" in evidence
    assert "predicted pass on this interpreter: confirmed" in json.loads(rows["long"]["evidence"])

    # Published into the project's own site (docs/): the record keeps the prediction, the page scores the pairs.
    done = _cli(env, tmp_path, "report", "--publish", "--store", "s.sqlite")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    record = json.loads((tmp_path / "docs" / "results" / "latest.json").read_text())
    predictions = {row["mode"]: row.get("prediction") for row in record["cells"].values()}
    assert predictions == {"short": "predicted-fail:planted", "long": "pass"}
    page = "\n".join(p.read_text() for p in (tmp_path / "docs").rglob("*.md"))
    expected = [
        "GPU runs' own CPU predictions, toyserve: 1 confirmed, 1 contradicted, 0 not comparable",
        "planted pre-flight (toyserve): 1 confirmed, 1 contradicted, 0 not comparable",
        "context-limit pre-flight (toyserve): 2 confirmed, 0 contradicted, 0 not comparable",
        "import pre-flight (toyserve): 2 confirmed, 0 contradicted, 0 not comparable",
    ]
    for line in expected:
        assert line in page, line
    assert "resolve pre-flight" not in page and "not comparable (" not in page  # resolving predicts nothing
    assert "- planted pre-flight (toyserve): 1 confirmed" in page  # a line each, not one run-on paragraph
    short_id = next(cell for cell, row in record["cells"].items() if row["mode"] == "short")
    day = rows["short"]["finished_at"][:10]
    assert f"`{short_id}`: predicted `predicted-fail:planted` on the served interpreter ({day}, run" in page
    html = (tmp_path / "docs" / "compatibility.html").read_text()
    assert "<br>  planted pre-flight (toyserve): 1 confirmed, 1 contradicted" in html
    assert f"{short_id}: predicted predicted-fail:planted on the served interpreter ({day}, run" in html

    # `recommend` on the published record says the same.
    done = _cli(env, tmp_path, "recommend")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    for line in expected:
        assert line in done.stdout, (line, done.stdout[-3000:])
