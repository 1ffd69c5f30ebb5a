"""The import pre-flight on real installs: a tiny real lock (six, from the index), imported for real, with
the engine's import-check data varied to give each outcome."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from servematrix.engines import ENGINES_PATH_ENV, ImportCheckSpec, load_engine
from servematrix.formats.lockfile import render_header
from servematrix.planning.plan import make_plan
from servematrix.run.pipeline import run_plan
from servematrix.run.runplan import RunOptions
from servematrix.stages import importcheck
from servematrix.stages.importcheck import check_all, import_check
from servematrix.stages.locking import resolve_request
from servematrix.stages.resolve import lock_header
from servematrix.store.store import Store
from tests.fakes.fake_backend import FakeBackend

pytestmark = [pytest.mark.slow, pytest.mark.integration]
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


@pytest.fixture(scope="module")
def lock(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("lock")
    (folder / "requirements.in").write_text("six==1.16.0\n")
    done = subprocess.run(
        [
            "uv",
            "pip",
            "compile",
            "--quiet",
            "--generate-hashes",
            "--python-version",
            PYTHON,
            "requirements.in",
            "-o",
            "lock.txt",
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return folder / "lock.txt"


def _engine(**check: object):
    return load_engine("sglang").model_copy(update={"import_check": ImportCheckSpec(**check)})


def test_a_lock_that_imports_passes_and_is_cached(lock, tmp_path):
    engine = _engine(modules=("six",), help=("python", "-c", "import six; print(six.__version__)"))
    first = import_check(lock, engine, python_version=PYTHON, cache_dir=tmp_path)
    assert (first.outcome, first.cached) == ("pass", False)
    again = import_check(lock, engine, python_version=PYTHON, cache_dir=tmp_path)
    assert (again.outcome, again.cached) == ("pass", True)
    assert not list((tmp_path / "import" / "venvs").iterdir())  # the venv is removed; the result stays


def test_a_module_the_lock_lacks_is_a_named_failure(lock, tmp_path):
    result = import_check(lock, _engine(modules=("six", "IPython")), python_version=PYTHON, cache_dir=tmp_path)
    assert (result.outcome, result.klass) == ("fail", "missing-module")
    assert "No module named 'IPython'" in result.evidence


def test_a_library_that_wants_a_gpu_is_inconclusive(lock, tmp_path):
    engine = _engine(
        modules=("six",),
        help=("python", "-c", "import ctypes; ctypes.CDLL('libcuda.so.1')"),
        needs_gpu=("libcuda.so.1: cannot open shared object file",),
    )
    result = import_check(lock, engine, python_version=PYTHON, cache_dir=tmp_path)
    assert (result.outcome, result.klass) == ("inconclusive", "needs-gpu")


def test_no_interpreter_of_that_version_is_an_error_not_a_verdict(lock, tmp_path):
    result = import_check(lock, _engine(modules=("six",)), python_version="2.1", cache_dir=tmp_path)
    assert (result.outcome, result.klass) == ("error", "no-python")
    assert not (tmp_path / "import" / "results").exists()


def test_a_crossed_lock_installs_as_it_is(tmp_path):
    # pydantic 2.7.0 pins pydantic-core==2.18.1; the lock overrides it, as a crossed flashinfer pin overrides
    # sglang's. A second resolution at install time would refuse the lock.
    (tmp_path / "requirements.in").write_text("pydantic==2.7.0\n")
    (tmp_path / "overrides.txt").write_text("pydantic-core==2.18.2\n")
    done = subprocess.run(
        ["uv", "pip", "compile", "--quiet", "--generate-hashes", "--python-version", PYTHON, "--override",
         "overrides.txt", "requirements.in", "-o", "lock.txt"],
        cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "pydantic-core==2.18.2" in (tmp_path / "lock.txt").read_text()
    result = import_check(
        tmp_path / "lock.txt", _engine(modules=("pydantic_core",)), python_version=PYTHON, cache_dir=tmp_path
    )
    assert result.outcome == "pass", result


def test_one_lock_body_under_two_headers_is_checked_once_and_says_what_it_fetched(lock, tmp_path):
    """The two GPU kinds' locks differ only in their headers: the second is the first's result."""
    engine = _engine(modules=("six",), help=())
    body = lock.read_text()
    kinds = []
    for gpu in ("b200", "rtx-pro-6000"):
        kinds.append(tmp_path / f"{gpu}.lock.txt")
        kinds[-1].write_text(f"# servematrix-lock: 1\n# axis: gpu={gpu}\n{body}")
    first = import_check(kinds[0], engine, python_version=PYTHON, cache_dir=tmp_path / "cache")
    second = import_check(kinds[1], engine, python_version=PYTHON, cache_dir=tmp_path / "cache")
    assert (first.outcome, first.cached, second.outcome, second.cached) == ("pass", False, "pass", True)
    assert first.downloaded.startswith("fetched ") and " of 1 packages" in first.downloaded, first.downloaded
    assert "uv's cache grew" in first.downloaded and first.downloaded in first.evidence


def test_distinct_lock_bodies_are_checked_at_once_and_each_environment_reads_its_result(lock, tmp_path):
    engine = _engine(modules=("six",), help=())
    body = lock.read_text()
    # six 1.15.0's hashes are not in the 1.16.0 lock: a lock of its own, made by uv as the fixture's is.
    folder = tmp_path / "older"
    folder.mkdir()
    (folder / "requirements.in").write_text("six==1.15.0\n")
    subprocess.run(
        [
            "uv",
            "pip",
            "compile",
            "--quiet",
            "--generate-hashes",
            "--python-version",
            PYTHON,
            "requirements.in",
            "-o",
            "lock.txt",
        ],
        cwd=folder,
        env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
        check=True,
    )
    locks = [tmp_path / "b200.lock.txt", tmp_path / "rtx.lock.txt", folder / "lock.txt"]
    locks[0].write_text("# axis: gpu=b200\n" + body)
    locks[1].write_text("# axis: gpu=rtx-pro-6000\n" + body)
    results = check_all(locks, engine, python_version=PYTHON, cache_dir=tmp_path / "cache", jobs=2)
    assert len(results) == 2 and all(r.outcome == "pass" and not r.cached for r in results.values())
    for path in locks:
        assert import_check(path, engine, python_version=PYTHON, cache_dir=tmp_path / "cache").cached


def test_a_run_checks_its_distinct_locks_at_once_before_its_cells(tmp_path, monkeypatch):
    """The test-defined engine with the import pre-flight: two environments, two locks of real six releases,
    checked together before the cells, which then read the results."""
    toy = Path(__file__).resolve().parents[1] / "fakes" / "engines" / "toyserve.toml"
    engines = tmp_path / "engines"
    engines.mkdir()
    text = toy.read_text().replace('preflight = ["context-limit"]', 'preflight = ["import", "context-limit"]')
    (engines / "toyserve.toml").write_text(text + '\n[import_check]\nmodules = ["six"]\n')
    monkeypatch.setenv(ENGINES_PATH_ENV, str(engines))
    matrix = tmp_path / "toy.toml"
    matrix.write_text(
        '[model]\nname = "m"\npath = "m"\n[axes]\ntoyserve = ["1.4", "2.1"]\ngpu = ["b200"]\nmode = ["short"]\n'
        '[gpu.b200]\narch = "sm_100"\ncount = 1\n[bench]\nconcurrency = [1]\ninput_len = 8\noutput_len = 8\n'
        "prompts_per_concurrency = 2\n".replace("[model]", 'engine = "toyserve"\n[model]')
    )
    plan = make_plan(matrix)
    locks = tmp_path / "locks"
    locks.mkdir()
    for env_id, six in zip(plan.environments, ("1.15.0", "1.16.0"), strict=True):
        folder = tmp_path / six
        folder.mkdir()
        (folder / "requirements.in").write_text(f"six=={six}\n")
        subprocess.run(
            [
                "uv",
                "pip",
                "compile",
                "-q",
                "--generate-hashes",
                "--python-version",
                PYTHON,
                "requirements.in",
                "-o",
                "l",
            ],
            cwd=folder,
            env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
            check=True,
        )
        header = render_header(lock_header(resolve_request(plan, env_id), crossed={}, resolver="uv (the test's)"))
        (locks / f"{env_id}.lock.txt").write_text(header + (folder / "l").read_text())
    monkeypatch.setattr(importcheck, "room", lambda cache_dir: 2)
    shown = io.StringIO()
    options = RunOptions(
        stages=("resolve", "import", "probe"), store=tmp_path / "s.sqlite", workdir=tmp_path / "w", lock_dir=locks
    )
    plan = make_plan(matrix)
    summary = run_plan(plan, FakeBackend(tmp_path), options, console=Console(file=shown))
    assert set(summary.verdicts.values()) == {"skipped:no-gpu"}
    assert "import checks: 2 distinct lock(s) of 2 environment(s), 2 at once" in shown.getvalue()
    with Store(tmp_path / "s.sqlite") as store:
        evidence = [r["evidence"] for r in store.latest()]
    assert all(e and e[0].startswith("import check (cached): pass: imported six") for e in evidence), evidence


HARNESS = """
import sys
from pathlib import Path
from servematrix.engines import ImportCheckSpec, load_engine
from servematrix.stages.importcheck import check_all
from servematrix.util import interrupt_on_signals

check = ImportCheckSpec(modules=("six",), help=("python", "-c", "import time; time.sleep(300)"))
engine = load_engine("sglang").model_copy(update={"import_check": check})
try:
    with interrupt_on_signals():  # as `servematrix run` runs its plan (cli.py)
        check_all([Path(sys.argv[1])], engine, python_version=sys.argv[2], cache_dir=Path(sys.argv[3]), jobs=2)
except KeyboardInterrupt:
    sys.exit(130)
"""


def _cmdline(process) -> str:
    import psutil

    try:
        return " ".join(process.cmdline())
    except psutil.Error:  # it ended between the listing and the read (a zombie until reaped: seen in CI)
        return ""


def test_sigterm_in_the_import_checks_stops_the_running_check_and_records_no_result(lock, tmp_path):
    """The checks run in worker threads; an interrupted run stops the programs they wait on (a real check's
    `--help` can take minutes; this one's sleeps 300 s) instead of waiting for them, and a check cut short is
    no fact about its lock: nothing is recorded, and the next run checks the lock again."""
    import psutil

    cache = tmp_path / "cache"
    script = tmp_path / "harness.py"
    script.write_text(HARNESS)
    harness = subprocess.Popen([sys.executable, str(script), str(lock), PYTHON, str(cache)], start_new_session=True)
    try:
        sleeper = None
        for _ in range(900):  # the install of six, then its --help stand-in starts
            children = psutil.Process(harness.pid).children(recursive=True)
            sleeper = next((c for c in children if "time.sleep(300)" in _cmdline(c)), None)
            if sleeper is not None:
                break
            assert harness.poll() is None, "the harness ended before its check's --help started"
            time.sleep(0.2)
        assert sleeper is not None
        signalled = time.monotonic()
        harness.send_signal(signal.SIGTERM)
        assert harness.wait(timeout=60) == 130  # not the 300 s its check would have taken
        print(f"the harness stopped {time.monotonic() - signalled:.1f} s after SIGTERM")
        assert not sleeper.is_running()
    finally:
        if harness.poll() is None:
            os.killpg(harness.pid, signal.SIGKILL)
            harness.wait()
    assert not list((cache / "import").glob("results/*.json"))
    assert not list((cache / "import").glob("venvs/*"))  # its venv is removed
    engine = _engine(modules=("six",), help=())
    assert import_check(lock, engine, python_version=PYTHON, cache_dir=cache).cached is False
