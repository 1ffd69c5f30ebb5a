"""A newcomer's first hour, as the README tells it: a fresh clone, `nox -s matrix` (servematrix installed
non-editable by nox, nothing built beforehand, podman present), and the README's quick test command.

This is the test that the project's own suite cannot stand in for: the suite runs from the checkout, while
users run what pip installed.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.integration]

# The CPU engine's cells pass; a GPU matrix on a host without its GPUs ends in these (resolve only).
CPU_HOST_VERDICTS = {"unresolvable", "skipped:no-gpu", "skipped:not-applicable"}


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("newcomer") / "servematrix"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(target)], check=True)
    return target


def _newcomer_env() -> dict[str, str]:
    """The shell of someone who just cloned: none of the test suite's settings, none of its venv."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SERVEMATRIX_", "NOX_", "PYTEST_"))}
    env.pop("VIRTUAL_ENV", None)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != venv_bin)
    return env


def _nox(clone: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    nox = shutil.which("nox", path=_newcomer_env()["PATH"])
    assert nox, "nox is not on PATH: the README's first command installs it (pip install nox uv)"
    done = subprocess.run(
        [nox, *args], cwd=clone, env=_newcomer_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    print(done.stdout[-4000:], done.stderr[-8000:])
    return done


def _verdicts(store: Path) -> dict[str, str]:
    with sqlite3.connect(store) as db:
        return dict(db.execute("SELECT cell_id, verdict FROM cell_runs WHERE status = 'finished'").fetchall())


def _git_status(clone: Path) -> str:
    return subprocess.run(
        ["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True, check=True
    ).stdout


def test_the_cpu_main_job_from_a_fresh_clone(clone):
    assert not (clone / ".servematrix").exists()  # nothing built beforehand: no model, no venv, no store
    done = _nox(clone, "-s", "matrix", "--", "matrix/cpu-smoke.toml", timeout=1800)
    assert done.returncode == 0
    assert "Traceback" not in done.stdout + done.stderr
    verdicts = _verdicts(clone / ".servematrix" / "results.sqlite")
    assert len(verdicts) == 4 and set(verdicts.values()) == {"pass"}, verdicts
    output = done.stdout + done.stderr  # nox passes the command's output through on stdout
    assert "servematrix: backend:" in output  # it says which backend it picked
    assert "[4/4" in output  # progress lines in a log without a terminal
    assert _git_status(clone) == ""  # no committed file rewritten, nothing new outside ignored paths


def test_the_default_matrix_resolves_on_a_cpu_host(clone):
    done = _nox(clone, "-s", "matrix", "--", "--stages", "resolve", "--store", "resolve.sqlite", timeout=1800)
    assert done.returncode == 0
    assert "Traceback" not in done.stdout + done.stderr
    output = done.stdout + done.stderr
    assert "need GPUs this host lacks" in output and "matrix/cpu-smoke.toml" in output
    verdicts = _verdicts(clone / "resolve.sqlite")
    assert verdicts and set(verdicts.values()) <= CPU_HOST_VERDICTS, set(verdicts.values())
    assert "skipped:no-gpu" in verdicts.values()
    (clone / "resolve.sqlite").unlink()
    for extra in clone.glob("resolve.sqlite-*"):
        extra.unlink()
    assert _git_status(clone) == ""


def test_the_readme_quick_test_command(clone):
    readme = (clone / "README.md").read_text()
    command = 'nox -s tests -- -m "not slow"'
    assert command in readme
    done = _nox(clone, "-s", "tests", "--", "-m", "not slow", "-q", "-p", "no:cacheprovider", timeout=1800)
    assert done.returncode == 0
    assert " passed" in done.stdout
