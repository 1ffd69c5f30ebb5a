"""The venv backend: one uv virtual environment per env_id, shared by every mode of that environment.

Environments are built in a temporary directory and renamed into place, so a crash never leaves a
half-installed venv that a later run would trust. The exact installed set (`uv pip freeze`) and its
hash are the environment's provenance.

Several harnesses may share one workdir: the build of one environment holds an exclusive lock on
`<env_id>.lock` beside it, so a second harness waits and then finds the first one's venv built (never two
builds in one staging folder, whose collision would read as the stack's `fail:build`). A rebuild (changed
inputs) never removes a venv a live server runs from (a process whose `VIRTUAL_ENV` names it): it builds
beside it, as `<env_id>@<input hash>`, and a venv left so is removed by a later build once nothing runs from
it.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from servematrix.backends import BuildInput, Built, HostProcesses, LaunchSpec
from servematrix.util import exclusive, install_venv, lock_requirements, log_tail, uv_env

MARKER = "servematrix-env.json"


class VenvBackend(HostProcesses):
    name = "venv"
    bind_host = "127.0.0.1"

    def __init__(self, root: Path, uv: str = "uv") -> None:
        self.root = root
        self.uv = uv

    def path(self, env_id: str) -> Path:
        return self.root / env_id

    def build(self, request: BuildInput, log_path: Path) -> Built:
        started = time.monotonic()
        self.root.mkdir(parents=True, exist_ok=True)
        with exclusive(self.root / f"{request.env_id}.lock"):
            return self._build_locked(request, log_path, started)

    def _build_locked(self, request: BuildInput, log_path: Path, started: float) -> Built:
        wanted = _input_hash(request)
        current = self.path(request.env_id)
        beside = current.with_name(f"{current.name}@{wanted}")
        for built in (current, beside):
            recorded = _recorded(built)
            if recorded is not None and recorded.get("input_hash") == wanted:
                return Built(
                    ok=True,
                    env_id=request.env_id,
                    prefix=built,
                    lock_hash=recorded["lock_hash"],
                    installed=recorded["installed"],
                    cached=True,
                    seconds=time.monotonic() - started,
                )
        # Venvs of earlier inputs that nothing runs from any more are removed; one a server runs from stays.
        for old in (current, *current.parent.glob(f"{glob.escape(current.name)}@*")):
            if old.is_dir() and not _in_use(old):
                shutil.rmtree(old, ignore_errors=True)
        target = beside if current.exists() else current
        staging = target.with_name(target.name + ".building")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        python = staging / "bin" / "python"
        install = lock_requirements(request.lockfile) if request.lockfile else list(request.requirements)
        with log_path.open("w", encoding="utf-8") as log:
            # relocatable: scripts find their interpreter relative to themselves, so the staging directory
            # can be renamed into place.
            done = install_venv(
                staging, install, python=request.python, env=uv_env(), uv=self.uv, relocatable=True, log=log
            )
        if not done.ok:
            return Built(
                ok=False, env_id=request.env_id, excerpt=log_tail(log_path, 25), seconds=time.monotonic() - started
            )
        freeze = subprocess.run(
            [self.uv, "pip", "freeze", "--python", str(python)],
            capture_output=True,
            text=True,
            env=uv_env(),
            check=True,
        ).stdout
        installed = dict(line.split("==", 1) for line in freeze.splitlines() if "==" in line)
        lock_hash = request.lock_hash or hashlib.sha256(freeze.encode()).hexdigest()[:16]
        (staging / "freeze.txt").write_text(freeze)
        (staging / MARKER).write_text(
            json.dumps({"input_hash": wanted, "lock_hash": lock_hash, "installed": installed}, indent=1)
        )
        staging.rename(target)
        return Built(
            ok=True,
            env_id=request.env_id,
            prefix=target,
            lock_hash=lock_hash,
            installed=installed,
            seconds=time.monotonic() - started,
        )

    def model_location(self, model_dir: Path) -> str:
        return str(model_dir)

    def launch(
        self, built: Built, argv: tuple[str, ...], env: Mapping[str, str], port: int, *, model_dir: Path | None
    ) -> LaunchSpec:
        assert built.prefix is not None
        bin_dir = built.prefix / "bin"
        program = bin_dir / argv[0]
        resolved = (str(program), *argv[1:]) if program.exists() else argv
        environ = {**os.environ, **env, "VIRTUAL_ENV": str(built.prefix), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        return LaunchSpec(argv=resolved, env=environ, owns_listener=True)

    def python(self, built: Built, *, visible: tuple[Path, ...] = ()) -> tuple[str, ...]:
        assert built.prefix is not None
        return (str(built.prefix / "bin" / "python"),)


def _recorded(prefix: Path) -> dict[str, Any] | None:
    """What a built venv's marker records, or None (not built, or a marker that does not parse)."""
    try:
        recorded = json.loads((prefix / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return recorded if isinstance(recorded, dict) else None


def _in_use(prefix: Path) -> bool:
    """Whether a live process of this host runs from the venv (`launch` sets its `VIRTUAL_ENV`)."""
    wanted = {str(prefix), str(prefix.resolve())}
    for process in psutil.process_iter():
        try:
            if process.environ().get("VIRTUAL_ENV") in wanted:
                return True
        except (psutil.Error, OSError):
            continue  # gone, or another user's: not one of our servers
    return False


def _input_hash(request: BuildInput) -> str:
    payload = {"python": request.python, "requirements": request.requirements, "lock": request.lock_hash}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
