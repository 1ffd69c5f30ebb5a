"""A newcomer's first hour, as the README tells it: a fresh clone, `nox -s matrix` (servematrix installed
non-editable by nox, nothing built beforehand, podman present), the README's commands that follow a run
(`nox -s report`, `recommend`, `plan`: servematrix itself is only in nox's venv), and the README's quick test
command. Output goes to a pipe, as in CI: what a log reader sees.

Checked on the way (issue 27): `report` before any run says how to get a store; the run announces what it
will run (the cells, only the stages they go through) and does exactly that; no log line is more than 30 s
after the one before; the end counts the cells by verdict and points at the report and `recommend`; an
unchanged re-run announces nothing to run.

This is the test that the project's own suite cannot stand in for: the suite runs from the checkout, while
users run what pip installed.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from servematrix.stages import STAGES
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


# `[done/total elapsed] ...`: a progress line of a run without a terminal (servematrix.run.progress).
PROGRESS = re.compile(r"^\[(\d+)/(\d+)\s+(\d+)s\] (.*)$")
HEARTBEAT_MAX_S = 30


def _announced(output: str) -> tuple[int, tuple[str, ...]]:
    """The cells and the stages the run said it would run."""
    found = re.search(r"servematrix: will run (\d+) cell\(s\), stages ([\w,]+)", output)
    assert found, output[-4000:]
    return int(found.group(1)), tuple(found.group(2).split(","))


def _progress(output: str) -> list[tuple[int, str]]:
    """(seconds since the start, what) of each progress line, in order."""
    lines = (PROGRESS.match(line.strip()) for line in output.splitlines())
    return [(int(m.group(3)), m.group(4)) for m in lines if m]


def _stages_run(output: str) -> set[str]:
    stages = set()
    for _, what in _progress(output):
        found = re.search(r" mode=\S+: (\w+)", what)
        if found and found.group(1) in STAGES:
            stages.add(found.group(1))
    return stages


def _check_the_log(output: str, verdicts: dict[str, str]) -> None:
    """What a log reader is owed: what was announced ran, signs of life, and an end that says what came out."""
    count, stages = _announced(output)
    assert count == len(verdicts)
    assert _stages_run(output) <= set(stages), (_stages_run(output), stages)
    seconds = [elapsed for elapsed, _ in _progress(output)]
    assert seconds, output[-4000:]
    gaps = [b - a for a, b in itertools.pairwise(seconds)]
    assert max(gaps, default=0) <= HEARTBEAT_MAX_S, [(e, w) for e, w in _progress(output)]
    assert all("downloaded" in what for _, what in _progress(output) if "still running" in what)
    counts = {verdict: list(verdicts.values()).count(verdict) for verdict in set(verdicts.values())}
    summary = " ".join(line.strip() for line in output.splitlines() if "cell(s): " in line or line.startswith("    "))
    for verdict, n in counts.items():
        assert f"{n} {verdict}" in summary, (verdict, n, summary)
    assert "servematrix: report: `nox -s report" in output
    assert "servematrix: which stack to pick: `nox -s recommend -- --store " in output


def _readme_block_after(clone: Path, marker: str) -> list[list[str]]:
    """The commands of the README's first code block after `marker`, as written (comments dropped)."""
    text = (clone / "README.md").read_text()
    block = text[text.index(marker) :].split("```bash\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def _git_status(clone: Path) -> str:
    return subprocess.run(
        ["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True, check=True
    ).stdout


def test_the_cpu_main_job_from_a_fresh_clone(clone):
    assert not (clone / ".servematrix").exists()  # nothing built beforehand: no model, no venv, no store
    before = _nox(clone, "-s", "report", timeout=600)  # the tour's report, before anything ran
    assert before.returncode != 0
    said = before.stdout + before.stderr
    assert "no such store" in said and "`nox -s matrix -- matrix/cpu-smoke.toml`" in said
    assert "--publish --from-published" in said and "Traceback" not in said
    done = _nox(clone, "-s", "matrix", "--", "matrix/cpu-smoke.toml", timeout=1800)
    assert done.returncode == 0
    assert "Traceback" not in done.stdout + done.stderr
    verdicts = _verdicts(clone / ".servematrix" / "results.sqlite")
    assert len(verdicts) == 4 and set(verdicts.values()) == {"pass"}, verdicts
    output = done.stdout + done.stderr  # nox passes the command's output through on stdout
    assert "servematrix: backend:" in output  # it says which backend it picked
    assert "[4/4" in output  # progress lines in a log without a terminal
    _check_the_log(output, verdicts)
    assert _announced(output)[1] == ("resolve", "build", "serve", "bench")  # the CPU engine has no pre-flight
    # What the README says comes next, as written: servematrix through nox's sessions.
    commands = _readme_block_after(clone, "The run ends with the counts by verdict")
    assert [c[:3] for c in commands] == [["nox", "-s", "report"], ["nox", "-s", "recommend"], ["nox", "-s", "plan"]]
    for command in commands:
        after = _nox(clone, *command[1:], timeout=600)
        assert after.returncode == 0, command
        assert "Traceback" not in after.stdout + after.stderr
    assert (clone / ".servematrix" / "report" / "compatibility.html").is_file()
    assert _git_status(clone) == ""  # no committed file rewritten, nothing new outside ignored paths


def test_the_default_matrix_resolves_on_a_cpu_host(clone):
    # --fresh: a resolve-only run would otherwise replay the published resolve outcomes (their keys are today's)
    done = _nox(
        clone, "-s", "matrix", "--", "--stages", "resolve", "--fresh", "--store", "resolve.sqlite", timeout=1800
    )
    assert done.returncode == 0
    assert "Traceback" not in done.stdout + done.stderr
    output = done.stdout + done.stderr
    assert "need GPUs this host lacks" in output and "matrix/cpu-smoke.toml" in output
    verdicts = _verdicts(clone / "resolve.sqlite")
    assert verdicts and set(verdicts.values()) <= CPU_HOST_VERDICTS, set(verdicts.values())
    assert "skipped:no-gpu" in verdicts.values()
    _check_the_log(output, verdicts)
    assert _announced(output)[1] == ("resolve",)
    assert "servematrix: backend: none used" in output  # nothing is built on this host: no backend named
    # Unchanged: nothing is announced, nothing runs (a cell the network failed is retried, and announced).
    again = _nox(
        clone, "-s", "matrix", "--", "--stages", "resolve", "--fresh", "--store", "resolve.sqlite", timeout=1800
    )
    assert again.returncode == 0
    retried = sum(v.startswith("error") for v in verdicts.values())
    said = again.stdout + again.stderr
    if retried:
        assert _announced(said)[0] == retried
    else:
        assert f"servematrix: nothing to run: {len(verdicts)} unchanged since their last finished run" in said
        assert "import:" not in said and "trace probe" not in said and not _progress(said)
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
