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

import glob
import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from servematrix.classify import classify_text
from servematrix.engines import Engine
from servematrix.util import atomic_write, run_captured, uv_env

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


def find_python(version: str) -> str | None:
    """An interpreter of this X.Y on the host: uv's view of the system, else pyenv's versions."""
    found = run_captured(
        ["uv", "python", "find", "--python-preference", "only-system", version], env=uv_env(), timeout_s=None
    )
    candidates = [found.stdout.strip()] if found.returncode == 0 and found.stdout.strip() else []
    candidates += sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}*/bin/python{version}")))
    for candidate in candidates:
        probe = run_captured([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], timeout_s=None)
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    return None


def lock_key(lockfile: Path, engine: Engine) -> str:
    """What decides the result: the locked set (not the header, which names the environment, so the same
    pins on another GPU kind share the result) and the engine's import-check data."""
    body = b"".join(line for line in lockfile.read_bytes().splitlines(keepends=True) if not line.startswith(b"#"))
    wanted = json.dumps({"engine": engine.name, "check": engine.import_check.model_dump()}, sort_keys=True).encode()
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

    def done(outcome: Outcome, klass: str = "", evidence: str = "", excerpt: str = "") -> ImportCheck:
        result = ImportCheck(
            outcome=outcome, klass=klass, evidence=evidence, excerpt=excerpt[-3000:], seconds=time.monotonic() - started
        )
        if outcome in ("pass", "fail", "inconclusive"):  # facts about the lock; an error may pass
            record = {"schema": RESULT_SCHEMA, "lock": lockfile.name, "result": asdict(result)}
            atomic_write(result_path, json.dumps(record, indent=1) + "\n")
        return result

    python = find_python(python_version)
    if python is None:
        return done("error", "no-python", f"no Python {python_version} on this host for the import check")
    venv = root / "venvs" / key
    shutil.rmtree(venv, ignore_errors=True)
    env = uv_env(NO_COLOR="1")
    env.pop("VIRTUAL_ENV", None)

    def took_too_long(argv: list[str]) -> ImportCheck:
        return done("error", "timeout", f"`{' '.join(argv[:3])}` took more than {timeout_s:.0f} s")

    try:
        for step in (
            ["uv", "venv", "--quiet", "--python", python, str(venv)],
            [
                "uv",
                "pip",
                "install",
                "--quiet",
                "--python",
                str(venv / "bin" / "python"),
                "--require-hashes",
                "--no-deps",  # the lock is complete; its crossed pins would fail a second resolution
                "-r",
                str(lockfile),
            ],
        ):
            run = run_captured(step, env=env, timeout_s=timeout_s)
            if run.timed_out:
                return took_too_long(step)
            if run.returncode != 0:
                last = (run.stderr.strip().splitlines() or ["(no output)"])[-1]
                return done("error", "install", f"`{' '.join(step[:3])}` failed: {last}", run.stderr)
        check = engine.import_check
        python_in_venv = str(venv / "bin" / "python")
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
