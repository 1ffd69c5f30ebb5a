"""The import pre-flight: install an environment's whole lock on a CPU, import the engine's entry points and
run its launcher's --help, so a stack that dies at import is known at 0 GPU-seconds.

Measured on a CPU host (2 cores), sglang 0.5.12's resolved lock: 86 s to install (8.9 GB venv, warm uv cache),
then `import sglang` fails in 20 s with kernels' `ValueError: Either a revision or a version must be
specified.` (the same line an H200 printed). With kernels 0.14.1 instead, `import sglang,
sglang.launch_server` succeeds (32 s) and `--help` prints its 1,686 lines (47 s).

A library that refuses to load without a GPU says nothing about the stack: that is `inconclusive`, from the
engine's `import_check.needs_gpu` patterns. Results are facts about a lock, cached by its hash; the venv is
removed after the check (uv's cache keeps the wheels, shared by every environment).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from servematrix.classify import classify_text
from servematrix.engines import Engine
from servematrix.util import atomic_write, find_python, install_venv, lock_requirements, run_captured, uv_env

Outcome = Literal["pass", "fail", "inconclusive", "error"]
RESULT_SCHEMA = 1


@dataclass(frozen=True, kw_only=True)
class ImportCheck:
    outcome: Outcome
    klass: str = ""  # the failure class (fail), or why it could not decide (error, inconclusive)
    evidence: str = ""  # the deciding line
    excerpt: str = ""
    seconds: float = 0.0
    cached: bool = False
    downloaded: str = ""  # what its install fetched (`downloads`)


def code_files() -> tuple[Path, ...]:
    """The check's own code: this module and the failure classifier it reads import failures with (every
    module of the classify package, not only its re-exporting __init__)."""
    from servematrix import classify
    from servematrix.classify import tracebacks

    return (Path(__file__), *sorted(Path(classify.__file__).parent.glob("*.py")), Path(tracebacks.__file__))


@functools.cache
def code_version() -> str:
    """A digest of `code_files`: a cached result of other code is not this check's result."""
    digest = hashlib.sha256()
    for path in code_files():
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _body(lockfile: Path) -> bytes:
    """The locked set: the lock without its comment lines (the header names the environment)."""
    return b"".join(line for line in lockfile.read_bytes().splitlines(keepends=True) if not line.startswith(b"#"))


def lock_key(lockfile: Path, engine: Engine) -> str:
    """What decides the result: the locked set (not the header, which names the environment, so the same
    pins on another GPU kind share the result: each distinct body is checked once), the engine's
    import-check data and the check's code."""
    body = _body(lockfile)
    wanted = json.dumps(
        {"engine": engine.name, "check": engine.import_check.model_dump(), "code": code_version()}, sort_keys=True
    ).encode()
    return hashlib.sha256(body + wanted).hexdigest()[:16]


def recorded(lockfile: Path, engine: Engine, *, cache_dir: Path) -> ImportCheck | None:
    """The import check's decided result for this lock (pass, fail or inconclusive), if one was made: what
    a bisection asks instead of reading the runner's notes. An error is never recorded."""
    return _read_result(Path(cache_dir) / "import" / "results" / f"{lock_key(lockfile, engine)}.json")


def _read_result(path: Path) -> ImportCheck | None:
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return ImportCheck(**{**data["result"], "cached": True}) if data.get("schema") == RESULT_SCHEMA else None


def import_failure(text: str, engine: Engine, *, returncode: int) -> tuple[Outcome, str, str]:
    """What an import that died says about the stack: (outcome, class, deciding line). Also how a model
    builder's import failure in a cell environment is read (models.StackImportError)."""
    gpu_line = next((line for line in text.splitlines() for p in engine.import_check.needs_gpu if p in line), None)
    if gpu_line is not None:
        return "inconclusive", "needs-gpu", gpu_line.strip()
    match = classify_text(text, engine.name)
    lines = [line for line in text.splitlines() if line.strip()]
    last = lines[-1].strip() if lines else f"exit {returncode}"
    if match is None:
        return "fail", "import-failed", last
    deciding = text.splitlines()[match.line - 1].strip() if match.line else last
    return "fail", match.cls, ", ".join((*match.evidence, deciding))


def distinct_locks(env_ids: Iterable[str], lock_dir: Path) -> int:
    """How many import checks these environments cost: one per distinct lock body (an environment without a
    lock yet counts as one of its own)."""
    bodies = set()
    for env_id in env_ids:
        lockfile = Path(lock_dir) / f"{env_id}.lock.txt"
        if not lockfile.is_file():
            bodies.add(env_id)
            continue
        bodies.add(hashlib.sha256(_body(lockfile)).hexdigest())
    return len(bodies)


def _uv_cache_dir(env: dict[str, str]) -> Path | None:
    found = run_captured(["uv", "cache", "dir"], env=env, timeout_s=60)
    return Path(found.stdout.strip()) if found.returncode == 0 and found.stdout.strip() else None


def _size_bytes(path: Path | None) -> int | None:
    """Apparent size of a directory tree (du: a C walk of uv's cache takes about 2 s for 16 GB here)."""
    if path is None or not path.is_dir() or shutil.which("du") is None:
        return None
    run = run_captured(["du", "-sb", str(path)], timeout_s=120)
    words = run.stdout.split()
    return int(words[0]) if run.returncode == 0 and words and words[0].isdigit() else None


def _install_env(venv: Path) -> tuple[dict[str, str], Path | None]:
    """The environment a lock is installed in, and uv's cache: every check installs from the one uv cache the
    host has; its wheels are linked, not copied, when it can (`link_mode`)."""
    env = uv_env(NO_COLOR="1")
    env.pop("VIRTUAL_ENV", None)
    cache = _uv_cache_dir(env)
    venv.parent.mkdir(parents=True, exist_ok=True)
    env.setdefault("UV_LINK_MODE", link_mode(venv, cache))
    return env, cache


def link_mode(venv: Path, cache: Path | None) -> str:
    """uv links a venv's files from its shared cache when both are on one filesystem, else copies them
    (saying so up front spares uv a failed hardlink and its warning per install)."""
    try:
        same = cache is not None and venv.parent.stat().st_dev == cache.stat().st_dev
    except OSError:
        same = False
    return "hardlink" if same else "copy"


def downloads(stderr: str, cache_growth: int | None) -> str:
    """What an install fetched, from uv's `Prepared N packages` line and how much its cache grew meanwhile
    (other uv processes on the host count too: it is an upper bound)."""
    prepared = re.search(r"Prepared (\d+) packages?", stderr)
    installed = re.search(r"Installed (\d+) packages?", stderr)
    parts = []
    if prepared or installed:
        parts.append(
            f"fetched {prepared.group(1) if prepared else 0} of {installed.group(1) if installed else '?'} packages"
        )
    if cache_growth is not None:
        parts.append(f"uv's cache grew {max(cache_growth, 0) / 1e9:.2f} GB")
    return ", ".join(parts)


def import_check(
    lockfile: Path, engine: Engine, *, python_version: str, cache_dir: Path, timeout_s: float = 900
) -> ImportCheck:
    """Install `lockfile` into a fresh venv and import the engine's entry points there (see module doc)."""
    key = lock_key(lockfile, engine)
    root = Path(cache_dir) / "import"
    result_path = root / "results" / f"{key}.json"
    known = _read_result(result_path)
    if known is not None:
        return known
    started = time.monotonic()

    fetched = ""

    def done(outcome: Outcome, klass: str = "", evidence: str = "", excerpt: str = "") -> ImportCheck:
        result = ImportCheck(
            outcome=outcome,
            klass=klass,
            evidence=f"{evidence} ({fetched})" if fetched and evidence else evidence,
            excerpt=excerpt[-3000:],
            seconds=time.monotonic() - started,
            downloaded=fetched,
        )
        if outcome in ("pass", "fail", "inconclusive"):  # facts about the lock; an error may pass
            record = {"schema": RESULT_SCHEMA, "lock": lockfile.name, "result": asdict(result)}
            atomic_write(result_path, json.dumps(record, indent=1) + "\n")
        return result

    def took_too_long(argv: list[str]) -> ImportCheck:
        return done("error", "timeout", f"`{' '.join(argv[:3])}` took more than {timeout_s:.0f} s")

    python = find_python(python_version)
    if python is None:
        return done("error", "no-python", f"no Python {python_version} on this host for the import check")
    venv = root / "venvs" / key
    env, cache = _install_env(venv)
    try:
        before = _size_bytes(cache)
        installed = install_venv(venv, lock_requirements(lockfile), python=python, env=env, timeout_s=timeout_s)
        if installed.run is not None and installed.run.timed_out:
            return took_too_long(list(installed.failed))
        if installed.install is not None:
            after = _size_bytes(cache) if before is not None else None
            grown = after - before if after is not None and before is not None else None
            fetched = downloads(installed.install.stderr, grown)
        if not installed.ok:
            assert installed.run is not None
            return done("error", "install", installed.problem(), installed.run.stderr)
        check = engine.import_check
        python_in_venv = str(installed.python)
        commands = [[python_in_venv, "-c", f"import {module}"] for module in check.modules]
        if check.help:
            commands.append([python_in_venv if a in ("python", "python3") else a for a in check.help])
        for command in commands:
            run = run_captured(command, env={**env, **check.env}, timeout_s=timeout_s)
            if run.timed_out:
                return took_too_long(command)
            if run.returncode == 0:
                continue
            text = run.stdout + "\n" + run.stderr
            return done(*import_failure(text, engine, returncode=run.returncode), text)
        return done("pass", evidence=f"imported {', '.join(check.modules)}" + (" and ran --help" if check.help else ""))
    finally:
        shutil.rmtree(venv, ignore_errors=True)


class LockVenv:
    """The environment's whole lock installed into a venv on this CPU, as the import check installs it (the
    same interpreter, `uv pip install --require-hashes --no-deps`, linked from uv's one cache): what a
    pre-flight that runs the engine's own code needs (the sglang load pre-flight). Installed on the first
    `python()` call, kept for the environment's cells, removed by `close()`. With uv's cache warm from the
    import check, the install links its files (measured: 207 packages of sglang 0.5.23's lock in 0.8 s)."""

    def __init__(self, lockfile: Path, *, python_version: str, cache_dir: Path, timeout_s: float = 900) -> None:
        self.lockfile = Path(lockfile)
        self.python_version = python_version
        body = hashlib.sha256(_body(self.lockfile)).hexdigest()[:16]
        self.venv = Path(cache_dir) / "import" / "venvs" / f"env-{body}-{os.getpid()}"
        self.timeout_s = timeout_s
        self.error = ""  # why there is no interpreter, once `python()` said None
        self._python: Path | None = None
        self._tried = False

    def python(self) -> Path | None:
        if self._tried:
            return self._python
        self._tried = True
        base = find_python(self.python_version)
        if base is None:
            self.error = f"no Python {self.python_version} on this host"
            return None
        env, _ = _install_env(self.venv)
        installed = install_venv(
            self.venv, lock_requirements(self.lockfile), python=base, env=env, timeout_s=self.timeout_s, quiet=True
        )
        if not installed.ok:
            self.error = installed.problem()
            self.close()
            return None
        python = installed.python
        self._python = python
        return python

    def close(self) -> None:
        shutil.rmtree(self.venv, ignore_errors=True)


# What one check may take while it runs, as a budget: the wheels it fetches land in uv's cache (sglang 0.5.6's
# lock grew it by 5.06 GB, measured here), its venv links them; its imports need memory of their own.
_CHECK_DISK_BYTES = 10 * 1024**3
_CHECK_MEMORY_BYTES = 3 * 1024**3


def room(cache_dir: Path) -> int:
    """How many import checks this host has room for at once: a core, the disk and the memory of each."""
    import psutil

    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    disk = shutil.disk_usage(cache_dir).free // _CHECK_DISK_BYTES
    memory = psutil.virtual_memory().available // _CHECK_MEMORY_BYTES
    return max(1, min(os.cpu_count() or 1, disk, memory))


def check_all(
    lockfiles: Sequence[Path], engine: Engine, *, python_version: str, cache_dir: Path, jobs: int | None = None
) -> dict[str, ImportCheck]:
    """`import_check` of each distinct lock body among `lockfiles` once, `jobs` (default: `room`) at a time;
    the results land in the result cache, where each environment's own check finds them. By lock key."""
    distinct: dict[str, Path] = {}
    for lockfile in lockfiles:
        distinct.setdefault(lock_key(lockfile, engine), lockfile)
    if not distinct:
        return {}
    workers = max(1, min(jobs or room(cache_dir), len(distinct)))
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="import-check")
    try:
        futures = {
            key: pool.submit(import_check, path, engine, python_version=python_version, cache_dir=cache_dir)
            for key, path in distinct.items()
        }
        return {key: future.result() for key, future in futures.items()}
    finally:
        # An interrupted run does not wait for the checks not started yet.
        pool.shutdown(wait=True, cancel_futures=True)
