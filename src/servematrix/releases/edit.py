"""Writing new releases into a matrix file: each version goes into its axis's array in version order, and
nothing else of the file changes (its comments, layout and quoting are kept: tomlkit reads and writes the
document, never a string edit).

All or nothing: the new text is written to a temporary file beside the matrix (relative paths in it, such as
`[model] config_dir`, mean the same there), loaded and planned with the project's own checks, and compared
with the old plan: every cell the matrix had keeps its id. Only then is it renamed over the matrix. Any
failure leaves the matrix as it was and no temporary file behind.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import tomlkit
from packaging.version import InvalidVersion, Version
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import Array

from servematrix.errors import InputError


@dataclass(frozen=True, kw_only=True)
class Added:
    """What `--add` changed: the values written, per axis, and the new cells (ids) and environments."""

    values: Mapping[str, tuple[str, ...]]
    new_cells: tuple[str, ...]
    new_envs: tuple[str, ...]
    kept_cells: int


def with_values(text: str, additions: Mapping[str, Sequence[str]], *, where: str = "the matrix") -> str:
    """The matrix text with each axis's new versions inserted in version order (after every value of the axis
    that is older, `pinned` and `locked` staying where they are)."""
    try:
        document = tomlkit.parse(text)
    except TOMLKitError as exc:
        raise InputError(f"{where}: {exc}") from None
    axes = document.get("axes")
    for axis, versions in additions.items():
        values = axes.get(axis) if axes is not None else None
        if not isinstance(values, Array):
            raise InputError(f"{where}: axes.{axis} is not an array of values")
        for version in versions:
            if version in [str(v) for v in values]:
                continue
            values.insert(_place(values, Version(version)), version)
    return document.as_string()


def _place(values: Array, new: Version) -> int:
    place = len(values)
    for index, value in enumerate(values):
        try:
            if Version(str(value)) > new:
                return index
        except InvalidVersion:
            continue  # `pinned`, `locked`: not ordered
    return place


def add_releases(matrix: Path, additions: Mapping[str, Sequence[str]]) -> Added:
    """Write the additions into `matrix`, all or nothing, every existing cell id kept (see the module)."""
    from servematrix.planning.plan import make_plan

    wanted = {axis: tuple(v) for axis, v in additions.items() if v}
    before = make_plan(matrix)
    old_ids = {cell.id for cell in before.cells}
    old_envs = {cell.env_id for cell in before.cells}
    text = matrix.read_text(encoding="utf-8")
    new_text = with_values(text, wanted, where=str(matrix))
    # Beside the matrix, named like a matrix (a .toml) but hidden: planned there, then renamed over it.
    staged = matrix.with_name(f".{matrix.stem}.releases-{uuid.uuid4().hex[:12]}.toml")
    try:
        with open(os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "w", encoding="utf-8") as out:
            out.write(new_text)
        try:
            after = make_plan(staged)
        except InputError as exc:
            raise InputError(f"{matrix}: adding {_listed(wanted)} would make it invalid: {exc}") from None
        new_ids = {cell.id for cell in after.cells}
        lost = old_ids - new_ids
        if lost:
            raise InputError(
                f"{matrix}: adding {_listed(wanted)} would change the ids of {len(lost)} existing cell(s) "
                f"(e.g. {sorted(lost)[0]}): not written"
            )
        mode = matrix.stat().st_mode & 0o7777
        os.chmod(staged, mode)
        os.replace(staged, matrix)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    new_cells = tuple(c.id for c in after.cells if c.id not in old_ids)
    new_envs = tuple(dict.fromkeys(c.env_id for c in after.cells if c.env_id not in old_envs))
    return Added(values=wanted, new_cells=new_cells, new_envs=new_envs, kept_cells=len(old_ids))


def _listed(additions: Mapping[str, Sequence[str]]) -> str:
    return "; ".join(f"{axis} {', '.join(versions)}" for axis, versions in additions.items())
