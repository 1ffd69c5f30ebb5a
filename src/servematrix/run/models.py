"""Models a matrix asks servematrix to build (``model.build``), such as the CPU engine's tiny Llama.

The engine's data names each builder's module (`model_builders`, `module` or `module:size`). A builder
module is a self-contained script, run by the cell environment's own interpreter as `SCRIPT OUT_DIR --size
SIZE` (that interpreter has torch and transformers; the harness itself needs neither), and it answers two
questions the harness asks in-process without importing anything heavy: `is_built(dir, size=)` and
`not_replaceable(dir)`. A builder that exits with its module's `STACK_IMPORT_EXIT` says the environment's own
stack did not import (its stderr is that traceback): `StackImportError`, a fact about the stack that the
runner classifies as the import check does, not a fault of the builder. A model is built once into the matrix's model path and reused by every cell while
its builder inputs are unchanged.

A built model replaces whatever was at its path before, so the path is held to two rules: it lies inside
a directory servematrix owns (the run's workdir, the project's .servematrix, or a model root the user
names), and a directory already there is replaced only if servematrix built it (it holds the builder's
marker) or it is empty. Anything else is bad input, named, and left alone.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from servematrix.engines import Engine
from servematrix.errors import InputError, Location

if TYPE_CHECKING:
    from servematrix.config.spec import Spec


class ModelBuildError(RuntimeError):
    pass


class StackImportError(ModelBuildError):
    """The cell environment's stack died at import while the builder ran in it (see the module doc)."""

    def __init__(self, message: str, *, output: str, returncode: int) -> None:
        super().__init__(message)
        self.output = output  # the builder's stderr: the stack's traceback
        self.returncode = returncode


def builder_entry(engine: Engine, builder: str) -> tuple[str, str]:
    """(module, size preset) of an engine's model builder: data says `module` or `module:size`."""
    entry = engine.model_builders.get(builder)
    if entry is None:
        known = ", ".join(engine.model_builders) or "none"
        raise InputError(f"engine {engine.name} has no model builder {builder!r} (builders: {known})")
    module, _, size = entry.partition(":")
    return module, size or "tiny"


def builder_script(engine: Engine, builder: str) -> Path:
    module, _ = builder_entry(engine, builder)
    found = importlib.util.find_spec(module)
    if found is None or found.origin is None:
        raise InputError(f"model builder module {module} is not importable")
    return Path(found.origin)


def builder_module(engine: Engine, builder: str) -> ModuleType:
    """The builder's module, for its `is_built` and `not_replaceable` (it imports nothing heavy at load)."""
    module, _ = builder_entry(engine, builder)
    builder_script(engine, builder)
    return importlib.import_module(module)


def _lexical(path: Path) -> Path:
    """An absolute path with `..` and `.` folded away, symlinks not followed (a linked cache stays inside)."""
    return Path(os.path.normpath(os.path.abspath(path)))


def inside(path: Path, roots: Sequence[Path]) -> bool:
    """Whether path lies strictly below one of the roots (the root itself is not a model directory)."""
    target = _lexical(path)
    return any(target != root and target.is_relative_to(root) for root in map(_lexical, roots))


def check_model_path(spec: Spec, roots: Sequence[Path]) -> None:
    """InputError at the matrix's `model.path` line unless the model may be built there: inside one of the
    roots, and not where something servematrix did not build already is."""
    path = Path(spec.file.model.path)
    if not inside(path, roots):
        shown = ", ".join(str(r) for r in dict.fromkeys(roots))
        raise InputError(
            f"{path} is outside servematrix's directories ({shown}): a built model replaces what is at its "
            "path, so it must lie inside the workdir or a model root you name",
            _model_path_location(spec),
        )
    target = path.resolve()
    builder = spec.file.model.build
    if not builder:
        return  # a model servematrix does not build is never replaced
    module = builder_module(spec.engine, builder)
    _, size = builder_entry(spec.engine, builder)
    problem = None if module.is_built(target, size=size) else module.not_replaceable(target)
    if problem:
        raise InputError(problem, _model_path_location(spec))


def _model_path_location(spec: Spec) -> Location:
    from servematrix.formats import tomlsource

    try:
        return tomlsource.load(spec.path).location(("model", "path"))
    except InputError:
        return Location(file=spec.path, key="model.path")


def ensure_model(
    path: Path,
    *,
    builder: str,
    engine: Engine,
    python: Callable[[tuple[Path, ...]], Sequence[str]],
    roots: Sequence[Path] | None = None,
    timeout_s: float = 600,
) -> Path:
    """Build the model at `path` unless it is already built from the same inputs; return its absolute path.

    `roots`: the directories the model must lie in (None when the user named the path itself, as
    `servematrix tiny-model DIR` does). Either way, nothing servematrix did not build is replaced.
    """
    if roots is not None and not inside(path, roots):
        shown = ", ".join(str(r) for r in dict.fromkeys(roots))
        raise InputError(f"model path {path} is outside servematrix's directories ({shown})")
    target = path.resolve()
    _, size = builder_entry(engine, builder)
    module = builder_module(engine, builder)
    if module.is_built(target, size=size):
        return target
    problem = module.not_replaceable(target)
    if problem:
        raise InputError(problem)
    script = builder_script(engine, builder)
    done = subprocess.run(  # in a container, both the script and the target's folder must be visible
        [*python((script.parent, target.parent)), str(script), str(target), "--size", size],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0 and done.returncode == getattr(module, "STACK_IMPORT_EXIT", None):
        raise StackImportError(
            f"building {builder} into {target}: the environment's stack did not import",
            output=done.stderr[-20000:],
            returncode=done.returncode,
        )
    if done.returncode != 0 or not module.is_built(target, size=size):
        raise ModelBuildError(f"building {builder} into {target} failed:\n{done.stderr[-2000:]}")
    return target
