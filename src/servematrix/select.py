"""--select expressions and --shard: which cells of a plan this invocation runs.

An expression is comma-separated terms, all of which must hold: `sglang>=0.5.10`, `mode=piecewise`,
`gpu=b200|rtx-pro-6000`, `env=3fa9…` (an id prefix). A term starting with an operator continues the
previous key's version range, so `sglang>=0.5.10,<0.5.14` reads as one range. Several --select options
must all hold too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from servematrix.cells import Cell
from servematrix.errors import InputError

_TERM = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_\-]*)\s*(==|!=|>=|<=|~=|=|>|<)\s*(.+?)\s*$")
_CONTINUATION = re.compile(r"^\s*(==|!=|>=|<=|~=|>|<)\s*(.+?)\s*$")
PREFIX_KEYS = ("env", "id")


@dataclass(frozen=True, kw_only=True)
class Term:
    key: str
    operator: str
    value: str

    def holds(self, values: Mapping[str, str], pins: Callable[[str], str | None]) -> bool:
        actual = values.get(self.key)
        if actual is None:
            return False
        if self.operator in ("=", "==", "!="):
            options = self.value.split("|")
            if self.key in PREFIX_KEYS:
                hit = any(actual.startswith(o) for o in options)
            else:
                hit = actual in options or (_pinned_value(actual, pins(self.key)) in options)
            return hit if self.operator != "!=" else not hit
        version = _pinned_value(actual, pins(self.key))
        try:
            return SpecifierSet(f"{self.operator}{self.value}").contains(Version(version or ""), prereleases=True)
        except (InvalidVersion, InvalidSpecifier):
            return False


def _pinned_value(actual: str, pin: str | None) -> str | None:
    return pin if actual == "pinned" else actual


@dataclass(frozen=True, kw_only=True)
class Selection:
    terms: tuple[Term, ...]

    def __call__(self, cell: Cell, release_pins: Mapping[str, Mapping[str, str]]) -> bool:
        values = cell.selectable()
        version = cell.env.version
        return all(t.holds(values, lambda axis: release_pins.get(version, {}).get(axis)) for t in self.terms)


def parse_select(expressions: Sequence[str], keys: Sequence[str]) -> Selection:
    terms: list[Term] = []
    for expression in expressions:
        previous: Term | None = None
        for raw in expression.split(","):
            if not raw.strip():
                raise InputError(f"--select {expression!r}: empty term")
            continued = _CONTINUATION.match(raw)
            if continued and previous is not None:
                term = Term(key=previous.key, operator=continued.group(1), value=continued.group(2))
            else:
                match = _TERM.match(raw)
                if not match:
                    raise InputError(f"--select {expression!r}: cannot read {raw.strip()!r} (expected KEY OP VALUE)")
                term = Term(key=match.group(1), operator=match.group(2), value=match.group(3))
            if term.key not in keys:
                raise InputError(f"--select {expression!r}: unknown key {term.key!r} (keys: {', '.join(keys)})")
            if term.operator not in ("=", "==", "!="):
                try:
                    SpecifierSet(f"{term.operator}{term.value}")
                except InvalidSpecifier:
                    raise InputError(f"--select {expression!r}: {raw.strip()!r} is not a version range") from None
            terms.append(term)
            previous = term
    return Selection(terms=tuple(terms))


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """`I/N`, 1-based, as CI matrices count."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match:
        raise InputError(f"--shard {text!r}: expected I/N, e.g. 1/4")
    index, total = int(match.group(1)), int(match.group(2))
    if total < 1 or not 1 <= index <= total:
        raise InputError(f"--shard {text!r}: I must be between 1 and N")
    return index, total


def shard(cells: Sequence[Cell], which: tuple[int, int] | None) -> list[Cell]:
    """A stable partition by environment: both modes of an environment always land in the same shard,
    so they share one build. Environments are dealt round-robin in plan order, which balances shards."""
    if which is None:
        return list(cells)
    index, total = which
    order: dict[str, int] = {}
    for cell in cells:
        order.setdefault(cell.env_id, len(order))
    return [c for c in cells if order[c.env_id] % total == index - 1]
