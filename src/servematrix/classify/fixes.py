"""Fixes that are packages: a pin a matrix can express (a package axis, `packages = [...]` and `[axes]`) that
the signature data says fixes a cell failing with a class (`[[signature.fix]]`), for the failure pages.

A fix applies to a failed row when its `when` regex occurs in the row's evidence or excerpt, the row's axes
satisfy its `axes` specifiers, and the row does not already pin the package to that version. The command
runs the fixed cells; the matrix must list the package and the version first (the text says how).
"""

from __future__ import annotations

import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from servematrix.classify.signatures import PackageFix, SignatureDataError, load_signatures
from servematrix.store.rowschema import Row


@dataclass(frozen=True, kw_only=True)
class PinFix:
    package: str
    version: str
    why: str
    matrix: str
    has_axis: bool  # the matrix already has the package axis: only the version is to be added
    listed: bool  # the matrix file (read where the report runs) already lists that version
    select: tuple[str, ...]  # --select terms of the cells it fixes

    @property
    def edit(self) -> str:
        """What to change in the matrix file."""
        if self.listed:
            return f"nothing to change (it lists {self.package} {self.version})"
        if self.has_axis:
            return f'add "{self.version}" to the `{self.package}` axis under `[axes]`'
        return (
            f'add `packages = ["{self.package}"]` at the top and `{self.package} = ["locked", "{self.version}"]` '
            "under `[axes]`"
        )

    @property
    def command(self) -> str:
        terms = [arg for term in self.select for arg in ("--select", term)]
        return shlex.join(["servematrix", "run", self.matrix, *terms])

    @property
    def text(self) -> str:
        return (
            f"pin {self.package} {self.version}: {self.why} In {self.matrix}, {self.edit}; then run `{self.command}`."
        )


def package_fixes(row: Row) -> list[PinFix]:
    """The package pins that fix this failed row, from its engine's signature data (none for a passing row)."""
    kind, _, cls = str(row.verdict or "").partition(":")
    if kind not in ("fail", "predicted-fail") or not cls:
        return []
    try:
        signature = load_signatures(str(row.engine)).get(cls)
    except SignatureDataError:
        return []
    if signature is None:
        return []
    said = "\n".join([*(str(e) for e in row.evidence or ()), str(row.excerpt or "")])
    axes = {str(k): str(v) for k, v in (row.axes or {}).items()}
    return [
        _pin(fix, row, axes)
        for fix in signature.fix
        if fix.when.search(said) and _axes_match(fix, axes) and axes.get(fix.package) != fix.version
    ]


def _axes_match(fix: PackageFix, axes: Mapping[str, str]) -> bool:
    for axis, specifier in fix.axes.items():
        try:
            if Version(axes[axis]) not in SpecifierSet(specifier):
                return False
        except (KeyError, InvalidVersion, InvalidSpecifier):
            return False  # the row does not say which version it ran: no claim about it
    return True


def _pin(fix: PackageFix, row: Row, axes: Mapping[str, str]) -> PinFix:
    select = [f"{axis}={axes[axis]}" for axis in fix.axes]
    return PinFix(
        package=fix.package,
        version=fix.version,
        why=fix.why,
        matrix=str(row.matrix),
        has_axis=fix.package in axes,
        listed=fix.version in _axis_values(str(row.matrix), fix.package),
        select=(*select, f"{fix.package}={fix.version}"),
    )


def _axis_values(matrix: str, axis: str) -> tuple[str, ...]:
    """The values the matrix file lists for an axis, when the file is where the report runs (else none)."""
    try:
        values = tomllib.loads(Path(matrix).read_text(encoding="utf-8")).get("axes", {}).get(axis, ())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return ()
    return tuple(str(v) for v in values) if isinstance(values, list) else ()
