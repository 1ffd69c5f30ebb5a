"""Plumbing that several modules need, written once: atomic file writes, running a program for its output,
an interrupt that reaches worker threads, the environment uv runs in, finding a host interpreter, installing
a lock (or requirements) into a fresh venv, and the last lines of a log.

Standard library only, and nothing from servematrix: any module may import it.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

# Where a run keeps its store, environments, logs and report preview, relative to the working directory.
DEFAULT_WORKDIR = Path(".servematrix")
PREVIEW_DIR = DEFAULT_WORKDIR / "report"  # where `report` writes a preview of the store
# A test device: the host has N GPUs of any arch (run/hostinfo.py). Here, low, for `options.py` to name it.
STANDIN_GPUS_ENV = "SERVEMATRIX_STANDIN_GPUS"

# The exit codes a shell gives a command it could not run or that ran out of time.
EXIT_TIMED_OUT = 124
EXIT_CANNOT_RUN = 126
EXIT_NOT_FOUND = 127

# Set when SIGINT or SIGTERM interrupts the run (`interrupt_on_signals`). Only the main thread gets the
# KeyboardInterrupt; a program that a worker thread waits on (`run_captured`) sees this within
# INTERRUPT_POLL_S and is killed, rather than the run waiting for it to end. A signal is process-wide: so is this.
INTERRUPTED = threading.Event()
INTERRUPT_POLL_S = 0.5
# Set inside `interrupt_on_signals`: outside, nothing sets INTERRUPTED, and programs run as subprocess.run runs them.
_INTERRUPTIBLE = threading.Event()


def atomic_write(path: Path | str, data: str | bytes, *, durable: bool = False) -> Path:
    """Write `data` (text as UTF-8, unchanged newlines) to `path`: a reader sees the old file or all of the
    new one, never a part, and a writer that fails leaves no temporary file behind.

    The data goes to a temporary file beside `path` (a rename is atomic only within one filesystem), named
    uniquely so that two writers of one path never write into each other's, and is renamed over `path`.
    The file gets the permissions a plain open would give it (umask applies). `durable` also syncs the data
    to disk before the rename, for files that must survive a power loss (committed locks).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as handle:
            handle.write(payload)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


@dataclass(frozen=True, kw_only=True)
class Captured:
    """A program's exit status and output. `problem` says why it did not run to its end (it could not be
    started, or ran out of time), naming the program; `returncode` is then the shell's code for that, and
    `stderr` the problem."""

    returncode: int
    stdout: str
    stderr: str
    problem: str | None = None
    timed_out: bool = False


def run_captured(
    argv: Sequence[str],
    *,
    timeout_s: float | None,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
) -> Captured:
    """Run `argv` with stdin closed and its output captured as text. A program that cannot be started or
    does not finish within `timeout_s` is a result (exit 127, 126 or 124, see `Captured.problem`), not an
    exception: callers turn it into their own verdict.

    Inside `interrupt_on_signals`, an interrupt kills the program and raises KeyboardInterrupt in the calling
    thread, a worker thread included (`_run_interruptibly`). A program cut short is no result: no caller may
    take a killed program's exit status for the program's own (an import check would record a failure)."""
    options: dict[str, Any] = {
        "cwd": cwd,
        "env": None if env is None else dict(env),
        "stdin": subprocess.DEVNULL,
        "stdout": subprocess.PIPE,
        "stderr": subprocess.PIPE,
        "text": True,
    }
    try:
        if _INTERRUPTIBLE.is_set():
            done = _run_interruptibly(list(argv), timeout_s, options)
        else:
            done = subprocess.run(list(argv), timeout=timeout_s, check=False, **options)
    except subprocess.TimeoutExpired:
        return _not_run(EXIT_TIMED_OUT, f"{argv[0]} timed out after {timeout_s:g} s", timed_out=True)
    except FileNotFoundError as exc:  # the program, or the working directory
        return _not_run(EXIT_NOT_FOUND, f"{exc.filename or argv[0]}: not found")
    except OSError as exc:
        return _not_run(EXIT_CANNOT_RUN, f"cannot run {argv[0]}: {exc.strerror or exc}")
    return Captured(returncode=done.returncode, stdout=done.stdout, stderr=done.stderr)


def _run_interruptibly(
    argv: list[str], timeout_s: float | None, options: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    """`subprocess.run` that also ends when the run is interrupted (`INTERRUPTED`): only the main thread gets a
    signal's KeyboardInterrupt, and a run would otherwise wait for a worker thread's program to end (an import
    check's `--help` takes minutes). The wait is cut into polls of INTERRUPT_POLL_S; a retried communicate
    loses no output."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    with subprocess.Popen(argv, **options) as process:
        try:
            while True:
                left = INTERRUPT_POLL_S if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    stdout, stderr = process.communicate(timeout=min(left, INTERRUPT_POLL_S))
                    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)
                except subprocess.TimeoutExpired:
                    if INTERRUPTED.is_set():
                        raise KeyboardInterrupt from None
                    if deadline is not None and time.monotonic() >= deadline:
                        raise
        except BaseException:  # the interrupt, or the deadline: the program ends here
            process.kill()
            process.communicate()
            raise


def _not_run(code: int, problem: str, *, timed_out: bool = False) -> Captured:
    return Captured(returncode=code, stdout="", stderr=problem, problem=problem, timed_out=timed_out)


def raise_interrupt(signum: int, frame: object) -> None:
    """A signal handler: the run is interrupted (`INTERRUPTED`, for worker threads; KeyboardInterrupt here)."""
    INTERRUPTED.set()
    raise KeyboardInterrupt


@contextlib.contextmanager
def interrupt_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM interrupt what runs inside (`raise_interrupt`), even when the process was started with
    SIGINT ignored, as a shell's background job is (Python then leaves it so); the handlers before are restored.
    Inside, `run_captured` watches for the interrupt in every thread."""
    INTERRUPTED.clear()
    previous = {sig: signal.signal(sig, raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    _INTERRUPTIBLE.set()
    try:
        yield
    finally:
        _INTERRUPTIBLE.clear()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        INTERRUPTED.clear()


def uv_env(**extra: str) -> dict[str, str]:
    """This process's environment for running uv, plus `extra`: uv never downloads an interpreter (it would
    spend seconds trying to reach one it may not reach; every interpreter it needs is already here)."""
    return {**os.environ, "UV_PYTHON_DOWNLOADS": "never", **extra}


def python_version_of(python: str, *, timeout_s: float | None = 60) -> str:
    """The X.Y of an interpreter ("" when it does not run); this one's without running it."""
    if python == sys.executable:
        return "{}.{}".format(*sys.version_info[:2])
    probe = run_captured([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], timeout_s=timeout_s)
    return probe.stdout.strip() if probe.returncode == 0 else ""


def find_python(version: str, *, timeout_s: float | None = None) -> str | None:
    """An interpreter of this X.Y on the host: uv's view of the system, else pyenv's versions; None if none.
    What the import check, the lock venv and the sglang config pre-flight install into."""
    found = run_captured(
        ["uv", "python", "find", "--python-preference", "only-system", version], env=uv_env(), timeout_s=timeout_s
    )
    candidates = [found.stdout.strip()] if found.returncode == 0 and found.stdout.strip() else []
    candidates += sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}*/bin/python{version}")))
    return next((c for c in candidates if python_version_of(c, timeout_s=timeout_s) == version), None)


def lock_requirements(lockfile: Path) -> list[str]:
    """The installer's arguments for a whole lock: exactly its pins, hash-checked, and --no-deps: a lock is
    the whole environment, crossed pins included, and a pin that overrides the release's own (sglang 0.5.12
    with flashinfer 0.6.12) would fail a second resolution."""
    return ["--require-hashes", "--no-deps", "-r", str(lockfile)]


@dataclass(frozen=True, kw_only=True)
class VenvInstall:
    """What `install_venv` did. `failed` is the step that failed (empty when every step ran), `run` that
    step's result; `install` is the install step's result once it ran (uv's stderr says what it fetched)."""

    python: Path  # the venv's interpreter
    failed: tuple[str, ...] = ()
    run: Captured | None = None
    install: Captured | None = None

    @property
    def ok(self) -> bool:
        return not self.failed

    def problem(self, words: int = 3) -> str:
        """What failed, as "`uv pip install` failed: <its last line>" (the step's first `words` words)."""
        text = self.run.stderr if self.run is not None else ""
        last = (text.strip().splitlines() or ["(no output)"])[-1]
        return f"`{' '.join(self.failed[:words])}` failed: {last}"


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """An exclusive lock on the file `path` (created, and its folder) for the block, across the processes of this
    host; waits for it. Closing the file releases it, also when the process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def install_venv(
    venv: Path,
    requirements: Sequence[str],
    *,
    python: str,
    env: Mapping[str, str],
    timeout_s: float | None = None,
    uv: str = "uv",
    installer: Literal["uv", "pip"] = "uv",
    relocatable: bool = False,
    quiet: bool = False,
    log: IO[str] | None = None,
) -> VenvInstall:
    """Install `requirements` (installer arguments: `lock_requirements(lock)`, or `name==version`, `-c FILE`,
    ...) into a fresh venv at `venv` made from the interpreter `python`: the one place a lock is installed (the
    venv backend, the import check, the lock venv, the probe and config pre-flight venvs). Whatever was at
    `venv` is removed first, and a venv whose step failed is removed again, so none is left half-built.

    `installer` "pip" makes the venv with `python -m venv` and installs with its pip (the probe's fallback);
    `relocatable` makes scripts find their interpreter relative to themselves (a venv built in a staging
    folder and renamed into place); `quiet` quiets the install. With `log`, each step is written to it
    (`$ argv`, then its output as it comes); without, the output is captured into the result."""
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    python_in_venv = venv / "bin" / "python"
    quieted = ["--quiet"] if quiet else []
    if installer == "uv":
        steps = [
            [uv, "venv", "--quiet", *(["--relocatable"] if relocatable else []), "--python", python, str(venv)],
            [uv, "pip", "install", *quieted, "--python", str(python_in_venv), *requirements],
        ]
    else:
        pip = ["-m", "pip", "install", *quieted, "--disable-pip-version-check", "--no-input"]
        steps = [[python, "-m", "venv", str(venv)], [str(python_in_venv), *pip, *requirements]]
    install = None
    for step in steps:
        if log is not None:
            log.write(f"$ {' '.join(step)}\n")
            log.flush()
            done = subprocess.run(step, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout_s, check=False)
            run = Captured(returncode=done.returncode, stdout="", stderr="")
        else:
            run = run_captured(step, env=env, timeout_s=timeout_s)
        if step is steps[-1]:
            install = run
        if run.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            return VenvInstall(python=python_in_venv, failed=tuple(step), run=run, install=install)
    return VenvInstall(python=python_in_venv, run=install, install=install)


def log_tail(path: Path, lines: int, *, max_bytes: int = 65536) -> str:
    """The last `lines` lines of a text file (a log), read from at most its last `max_bytes` bytes (a log
    may be large), undecodable bytes replaced; "" when the file cannot be read."""
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - max_bytes))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
