"""The build stage: an environment's requirements (or lock) become a venv or an image via a backend."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from servematrix.backends import Backend, BuildInput, Built
from servematrix.engines import Engine
from servematrix.planning.cells import requirements
from servematrix.records.cell import Environment


def build(
    backend: Backend,
    env: Environment,
    engine: Engine,
    *,
    lockfile: Path | None,
    lock_hash: str | None,
    log_path: Path,
    packages: Sequence[str] = (),
) -> Built:
    reqs, overrides = requirements(env, engine, packages)
    request = BuildInput(
        env_id=env.env_id,
        python=env.python,
        # Without a lock, overrides are installed as plain pins: uv pip install has no override file input
        # here, and a crossing that does not resolve fails the build with uv's own explanation.
        requirements=(*reqs, *overrides),
        lockfile=lockfile,
        lock_hash=lock_hash,
    )
    return backend.build(request, log_path)
