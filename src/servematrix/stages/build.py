"""The build stage: an environment's requirements (or lock) become a venv or an image via a backend."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from packaging.requirements import Requirement

from servematrix.backends import Backend, BuildInput, Built
from servematrix.cells import Environment
from servematrix.engines import Engine
from servematrix.spec import LOCKED, PINNED


def requirements(
    env: Environment, engine: Engine, packages: Sequence[str] = ()
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(requirements, overrides) from an environment's axes.

    The engine's own version is a requirement. An axis the release pins (torch, flashinfer for sglang)
    is left to the pin when `pinned`, and is otherwise a resolver override, since it may cross the
    release's exact pin. Axes the engine does not pin are plain requirements.
    """
    reqs: list[str] = []
    overrides: list[str] = []
    for axis in engine.axes:
        template = engine.requirements.for_axis(axis)
        value = env.axes[axis]
        if template is None or value == PINNED:
            continue
        line = template.format(version=value)
        (overrides if axis in engine.pinnable else reqs).append(line)
    # Package axes (the matrix's `packages`): a version overrides whatever the resolver would pick.
    overrides += [f"{axis}=={value}" for axis, value in env.axes.items() if axis in packages and value != LOCKED]
    return (*reqs, *engine.requirements.extra), tuple(overrides)


def axis_packages(env: Environment, engine: Engine, packages: Sequence[str] = ()) -> list[tuple[str, str]]:
    """(package, version) for each version axis with a known value: `pinned` is the release's known pin,
    and a package axis (the matrix's `packages`) at `locked` says nothing."""
    out = [(axis, value) for axis, value in env.axes.items() if axis in packages and value != LOCKED]
    for axis in engine.axes:
        template = engine.requirements.for_axis(axis)
        value = env.effective(axis, engine.pins)
        if template is None or value is None or value == PINNED:
            continue
        out.append((Requirement(template.format(version=value)).name, value))
    return sorted(out)


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
