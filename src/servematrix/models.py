"""Models a matrix asks servematrix to build (``model.build``), such as the CPU engine's tiny Llama.

The builder is a self-contained script run by the cell environment's own interpreter, which has torch
and transformers; the harness itself needs neither. It is built once into the matrix's model path and
reused by every cell while its builder inputs are unchanged.
"""

from __future__ import annotations

import importlib.util
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from servematrix.engines import Engine
from servematrix.errors import InputError


class ModelBuildError(RuntimeError):
    pass


def builder_script(engine: Engine, builder: str) -> Path:
    module = engine.model_builders.get(builder)
    if module is None:
        known = ", ".join(engine.model_builders) or "none"
        raise InputError(f"engine {engine.name} has no model builder {builder!r} (builders: {known})")
    found = importlib.util.find_spec(module)
    if found is None or found.origin is None:
        raise InputError(f"model builder module {module} is not importable")
    return Path(found.origin)


def ensure_model(
    path: Path,
    *,
    builder: str,
    engine: Engine,
    python: Callable[[tuple[Path, ...]], Sequence[str]],
    timeout_s: float = 600,
) -> Path:
    """Build the model at `path` unless it is already built from the same inputs; return its absolute path."""
    from servematrix import tinymodel

    target = path.resolve()
    if tinymodel.is_built(target):
        return target
    script = builder_script(engine, builder)
    done = subprocess.run(
        [*python((target.parent,)), str(script), str(target)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0 or not tinymodel.is_built(target):
        raise ModelBuildError(f"building {builder} into {target} failed:\n{done.stderr[-2000:]}")
    return target
