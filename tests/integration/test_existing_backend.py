"""`--backend existing`: serve cells with an interpreter that is already installed (here a venv holding
transformers 5.24.0, as a prebuilt image or a GPU node without an index would hold sglang)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest

from tests.integration.test_tinymodel_and_bench import ensure_venv

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _run(project, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servematrix", "run", "matrix/cpu-smoke.toml", "--store", "s.sqlite", *args],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )


def test_cpu_smoke_served_by_an_existing_interpreter(smoke_project):
    python = ensure_venv("5.24.0")
    done = _run(smoke_project, "--backend", "existing", "--python", str(python), "--select", "transformers=5.24.0")
    assert done.returncode == 0, done.stderr[-3000:]
    with sqlite3.connect(smoke_project / "s.sqlite") as db:
        rows = db.execute("SELECT mode, verdict, evidence, lock_hash, image_digest FROM cell_runs").fetchall()
    assert sorted((mode, verdict) for mode, verdict, *_ in rows) == [
        ("continuous-batching", "pass"),
        ("static", "pass"),
    ]
    for _, _, evidence, lock_hash, image_digest in rows:
        notes = json.loads(evidence)
        # Provenance is the installed set, compared with the environment's committed lock.
        assert any(n.startswith(f"existing environment {python}: installed set {lock_hash}") for n in notes), notes
        assert image_digest is None
    assert not (smoke_project / ".servematrix" / "envs").exists()  # nothing was built


def test_a_cell_whose_axes_are_not_installed_is_refused(smoke_project):
    python = ensure_venv("5.24.0")
    done = _run(smoke_project, "--backend", "existing", "--python", str(python), "--select", "transformers=5.5.4")
    assert done.returncode == 2
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("servematrix: error:")]
    assert "wants transformers 5.5.4" in line and "has transformers 5.24.0" in line and "refusing" in line
    assert (
        not (smoke_project / "s.sqlite").exists()
        or not sqlite3.connect(smoke_project / "s.sqlite").execute("SELECT count(*) FROM cell_runs").fetchone()[0]
    )
