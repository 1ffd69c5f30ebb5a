"""The venv backend: one uv virtual environment per env_id, shared by every mode of that environment.

Environments are built in a temporary directory and renamed into place, so a crash never leaves a
half-installed venv that a later run would trust. The exact installed set (`uv pip freeze`) and its
hash are the environment's provenance.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from servematrix.backends import BuildInput, Built, HostProcesses, LaunchSpec
from servematrix.util import log_tail, uv_env

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
        target = self.path(request.env_id)
        wanted = _input_hash(request)
        marker = target / MARKER
        if marker.is_file():
            recorded = json.loads(marker.read_text())
            if recorded.get("input_hash") == wanted:
                return Built(
                    ok=True,
                    env_id=request.env_id,
                    prefix=target,
                    lock_hash=recorded["lock_hash"],
                    installed=recorded["installed"],
                    cached=True,
                    seconds=time.monotonic() - started,
                )
        staging = target.with_name(target.name + ".building")
        shutil.rmtree(staging, ignore_errors=True)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        python = staging / "bin" / "python"
        # A lock is the whole environment, crossed pins included: install exactly it (--no-deps), or a pin
        # that overrides the release's own (sglang 0.5.12 with flashinfer 0.6.12) fails a second resolution.
        install = (
            ["-r", str(request.lockfile), "--require-hashes", "--no-deps"]
            if request.lockfile
            else list(request.requirements)
        )
        steps = [
            # --relocatable: scripts find their interpreter relative to themselves, so the staging
            # directory can be renamed into place.
            [self.uv, "venv", "--quiet", "--relocatable", "--python", request.python, str(staging)],
            [self.uv, "pip", "install", "--python", str(python), *install],
        ]
        with log_path.open("w", encoding="utf-8") as log:
            for step in steps:
                log.write(f"$ {' '.join(step)}\n")
                log.flush()
                done = subprocess.run(step, stdout=log, stderr=subprocess.STDOUT, env=uv_env(), check=False)
                if done.returncode != 0:
                    shutil.rmtree(staging, ignore_errors=True)
                    return Built(
                        ok=False,
                        env_id=request.env_id,
                        excerpt=log_tail(log_path, 25),
                        seconds=time.monotonic() - started,
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
        shutil.rmtree(target, ignore_errors=True)
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


def _input_hash(request: BuildInput) -> str:
    payload = {"python": request.python, "requirements": request.requirements, "lock": request.lock_hash}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
