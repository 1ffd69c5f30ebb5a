"""--select expressions and --shard: which cells of a plan this invocation runs.

An expression is comma-separated terms, all of which must hold: `sglang>=0.5.10`, `mode=piecewise`,
`gpu=b200|rtx-pro-6000`, `env=3fa9…` (an id prefix). A term starting with an operator continues the
previous key's version range, so `sglang>=0.5.10,<0.5.14` reads as one range. Several --select options
must all hold too.

A selection that selects nothing is an error, not an empty run: a CI dispatch with a typo must not go
green having done nothing. Exact values are checked against the matrix before expansion (with a "did
you mean"); id prefixes and the selection as a whole are checked against the expanded cells.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from servematrix.config.spec import PINNED, Spec
from servematrix.errors import InputError
from servematrix.records.cell import Cell

_TERM = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_\-]*)\s*(==|!=|>=|<=|~=|=|>|<)\s*(.+?)\s*$")
_CONTINUATION = re.compile(r"^\s*(==|!=|>=|<=|~=|>|<)\s*(.+?)\s*$")
PREFIX_KEYS = ("env", "id")
EXACT_OPERATORS = ("=", "==", "!=")


@dataclass(frozen=True, kw_only=True)
class SelectKeys:
    """What --select may name in one matrix."""

    # key -> the values an exact term (`=`, `==`, `!=`) may name; id-prefix keys are not listed.
    values: Mapping[str, frozenset[str]]
    # keys that also take version comparisons (>=, <, ~=, ...)
    versions: frozenset[str]

    @property
    def names(self) -> tuple[str, ...]:
        return (*self.values, *PREFIX_KEYS)


def select_keys(spec: Spec) -> SelectKeys:
    """The keys and values of this matrix: axis values, include values, and what `pinned` stands for."""
    values: dict[str, set[str]] = {axis: set(spec.file.axes[axis]) for axis in (*spec.axis_names, "mode")}
    for rule in spec.include:
        for key, wanted in rule.conditions:
            values[key].update(wanted)
    # `torch=2.9.1` selects the cells whose `pinned` torch is 2.9.1 (see Term.holds).
    for version in values[spec.engine.version_axis]:
        for axis, pin in spec.engine.pins.get(version, {}).items():
            if axis in values and PINNED in values[axis]:
                values[axis].add(pin)
    values["engine"] = {spec.engine.name}
    return SelectKeys(
        values={key: frozenset(found) for key, found in values.items()},
        versions=frozenset(spec.engine.axes),
    )


@dataclass(frozen=True, kw_only=True)
class Term:
    key: str
    operator: str
    value: str
    expression: str  # the --select text it came from, for messages

    @property
    def options(self) -> tuple[str, ...]:
        return tuple(self.value.split("|"))

    def holds(self, values: Mapping[str, str], pins: Callable[[str], str | None]) -> bool:
        actual = values.get(self.key)
        if actual is None:
            return False
        if self.operator in EXACT_OPERATORS:
            options = self.options
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
    return pin if actual == PINNED else actual


@dataclass(frozen=True, kw_only=True)
class Selection:
    terms: tuple[Term, ...]

    def __call__(self, cell: Cell, release_pins: Mapping[str, Mapping[str, str]]) -> bool:
        values = cell.selectable()
        version = cell.env.version
        return all(t.holds(values, lambda axis: release_pins.get(version, {}).get(axis)) for t in self.terms)

    def apply(self, cells: Sequence[Cell], release_pins: Mapping[str, Mapping[str, str]]) -> list[Cell]:
        """The selected cells; an id prefix that names no cell, or a selection of nothing, is an error."""
        if not self.terms:
            return list(cells)
        for term in self.terms:
            if term.key in PREFIX_KEYS:
                _check_prefixes(term, cells)
        kept = [cell for cell in cells if self(cell, release_pins)]
        if not kept:
            shown = " ".join(f"--select {e!r}" for e in dict.fromkeys(t.expression for t in self.terms))
            raise InputError(f"{shown} selects no cells (of {len(cells)} in the matrix)")
        return kept


def _check_prefixes(term: Term, cells: Iterable[Cell]) -> None:
    seen = {cell.selectable()[term.key] for cell in cells}
    for option in term.options:
        if not any(value.startswith(option) for value in seen):
            what = "environment id" if term.key == "env" else "cell id"
            raise InputError(f"--select {term.expression!r}: no {what} starts with {option!r}")


def parse_select(expressions: Sequence[str], keys: SelectKeys) -> Selection:
    terms: list[Term] = []
    for expression in expressions:
        previous: Term | None = None
        for raw in expression.split(","):
            if not raw.strip():
                raise InputError(f"--select {expression!r}: empty term")
            continued = _CONTINUATION.match(raw)
            if continued and previous is not None:
                term = Term(
                    key=previous.key, operator=continued.group(1), value=continued.group(2), expression=expression
                )
            else:
                match = _TERM.match(raw)
                if not match:
                    raise InputError(f"--select {expression!r}: cannot read {raw.strip()!r} (expected KEY OP VALUE)")
                term = Term(key=match.group(1), operator=match.group(2), value=match.group(3), expression=expression)
            _check_term(term, raw.strip(), keys)
            terms.append(term)
            previous = term
    return Selection(terms=tuple(terms))


def _check_term(term: Term, raw: str, keys: SelectKeys) -> None:
    where = f"--select {term.expression!r}"
    if term.key not in keys.names:
        raise InputError(
            f"{where}: unknown key {term.key!r}{_did_you_mean(term.key, keys.names)} (keys: {', '.join(keys.names)})"
        )
    if term.operator not in EXACT_OPERATORS:
        if term.key not in keys.versions:
            raise InputError(f"{where}: {term.key} is not a version: use = or != (e.g. {term.key}=VALUE)")
        try:
            SpecifierSet(f"{term.operator}{term.value}")
        except InvalidSpecifier:
            raise InputError(f"{where}: {raw!r} is not a version range") from None
        return
    for option in term.options:
        if not option:
            raise InputError(f"{where}: {raw!r} has an empty value")
        if term.key in PREFIX_KEYS:
            continue  # checked against the expanded cells
        known = keys.values[term.key]
        if option not in known:
            listed = ", ".join(sorted(known, key=_sort_key))
            raise InputError(
                f"{where}: no {term.key} {option!r} in this matrix{_did_you_mean(option, known)} ({term.key}: {listed})"
            )


def _did_you_mean(word: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _sort_key(value: str) -> tuple[int, Version | str]:
    """Versions in version order, then everything else alphabetically."""
    try:
        return (0, Version(value))
    except InvalidVersion:
        return (1, value)


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
