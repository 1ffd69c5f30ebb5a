"""A cell's history over publishes, `results/history.json` (docs/history.md): its entries (`HistoryEntry`, one
per distinct run), the cell (`HistoryCell`) and the feed (`History`). Frozen: `report/history/record.py`'s
`advance` makes new ones, and `to_json` writes the feed's JSON exactly as it was read.

An entry's JSON always has `date`, `run_id`, `inputs`, `verdict` and `on` (null where unknown: a run from an
older record's summary); every other field is written only when it holds something. A key no field names
(written by a newer servematrix) is kept as it was.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

SCHEMA = 1
_FIGURE_KEY = re.compile(r"[a-z_]+@[0-9]{1,9}")


@dataclass(frozen=True, kw_only=True)
class HistoryEntry:
    """One run of a cell (or several identical ones: `repeats`), and what the publish that filed it called it."""

    date: str | None = None  # when the run finished
    run_id: str | None = None
    inputs: str | None = None  # digest of the cell's inputs hash, lock hash and image digest; None: not recorded
    verdict: str | None = None
    on: str | None = None  # `cpu`, or the GPU the host named; None: not recorded
    lock: str | None = None  # digest of the lock's package versions (`History.locks`)
    checks: str | None = None  # the CPU pre-flight's inputs hash, short
    figures: Mapping[str, Sequence[float]] | None = None  # `tok_s@<c>`, `ttft_ms@<c>` -> [min, median, max]
    workload: str | None = None  # digest of the benchmark workload
    category: str | None = None
    why: str | None = None
    published: str | None = None  # the publish that filed it
    repeats: int | None = None  # identical runs counted on this entry
    last_date: str | None = None
    last_run_id: str | None = None
    published_as: Sequence[str] | None = None  # [category, why] a later publish gave a repeat
    named_again: Mapping[str, str] | None = None  # {"was": class, "on": publish}: renamed from its stored log
    lock_changes: Mapping[str, Any] | None = None  # package -> [old, new] against the entry before
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)  # keys no field names, kept

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = "entry") -> HistoryEntry:
        """An entry of the feed; a ValueError naming `where` and the field when one is malformed."""
        problem = _entry_problem(data)
        if problem:
            raise ValueError(f"{where}: {problem}")
        known = {k: v for k, v in data.items() if k in _ENTRY_FIELDS}
        return cls(**known, extra={k: v for k, v in data.items() if k not in _ENTRY_FIELDS})

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in _ENTRY_ORDER:
            value = getattr(self, name)
            if value is not None or name in _ALWAYS:
                out[name] = list(value) if name == "published_as" else value
        return {**out, **self.extra}

    @property
    def repeated(self) -> int:
        """How many identical runs the entry counts."""
        return 1 if self.repeats is None else self.repeats


@dataclass(frozen=True, kw_only=True)
class HistoryCell:
    """A cell's entries, oldest first, with what the bound dropped and since when its verdict holds."""

    entries: tuple[HistoryEntry, ...] = ()
    dropped: int = 0  # entries dropped by the bound
    since: str | None = None  # when its current verdict began
    first: str | None = None  # its first run's date
    matrix: str | None = None
    mode: str | None = None
    env_id: str | None = None
    axes: Mapping[str, str] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_json(cls, data: object, where: str = "cell") -> HistoryCell:
        if not isinstance(data, Mapping) or not isinstance(data.get("entries"), list):
            raise ValueError(f"{where} has no list of entries")
        if not all(isinstance(e, Mapping) for e in data["entries"]):
            raise ValueError(f"{where}: an entry is not a table")
        if "dropped" in data and not _is_count(data["dropped"]):
            raise ValueError(f"{where}: dropped is {data['dropped']!r:.40}, not a whole number")
        entries = tuple(HistoryEntry.from_json(e, f"{where}: entry {i}") for i, e in enumerate(data["entries"]))
        known = {k: v for k, v in data.items() if k in _CELL_FIELDS and k != "entries"}
        extra = {k: v for k, v in data.items() if k not in _CELL_FIELDS}
        return cls(**known, entries=entries, extra=extra)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"entries": [e.to_json() for e in self.entries], "dropped": self.dropped}
        for name in ("since", "first"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        out.update(matrix=self.matrix, mode=self.mode, env_id=self.env_id, axes=self.axes)
        return {**out, **self.extra}

    def bounded(self, most: int) -> HistoryCell:
        """The cell with its last `most` entries, the rest counted as dropped."""
        over = len(self.entries) - most
        if over <= 0:
            return self
        return replace(self, entries=self.entries[over:], dropped=self.dropped + over)


@dataclass(frozen=True, kw_only=True)
class History:
    """The feed: the bound, the publishes it records, the lock versions the cells' last entries use, the cells."""

    bound: Mapping[str, int]
    publishes: tuple[Mapping[str, Any], ...] = ()  # {date, cells, counts}, oldest first
    locks: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # lock digest -> package -> version
    cells: Mapping[str, HistoryCell] = field(default_factory=dict)
    schema: int = SCHEMA

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "bound": dict(self.bound),
            "publishes": [dict(p) for p in self.publishes],
            "locks": {k: dict(v) for k, v in self.locks.items()},
            "cells": {k: c.to_json() for k, c in self.cells.items()},
        }

    @property
    def last_publish(self) -> str | None:
        """The date of the last publish recorded, or None."""
        return self.publishes[-1].get("date") if self.publishes else None


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry_problem(entry: Mapping[str, Any]) -> str | None:
    """What makes an entry unusable (a hand edit, a crafted file), or None: a figure is three finite numbers
    under a `<figure>@<level>` key, counts are whole numbers, texts are text."""
    if "repeats" in entry and not _is_count(entry["repeats"]):
        return f"repeats is {entry['repeats']!r:.40}, not a whole number"
    for name in _TEXTS:
        if entry.get(name) is not None and not isinstance(entry[name], str):
            return f"{name} is {entry[name]!r:.40}, not text"
    found = entry.get("figures", {})
    if not isinstance(found, dict):
        return "figures is not a table"
    for key, value in found.items():
        if not isinstance(key, str) or not _FIGURE_KEY.fullmatch(key):
            return f"figure key {str(key)[:40]!r} is not <figure>@<level>"
        numbers = value if isinstance(value, list) and len(value) == 3 else None
        if numbers is None or not all(
            isinstance(n, int | float) and not isinstance(n, bool) and math.isfinite(n) for n in numbers
        ):
            return f"figure {key} is {str(value)[:40]}, not three finite numbers"
    for name in ("named_again", "lock_changes"):
        if entry.get(name) is not None and not isinstance(entry[name], dict):
            return f"{name} is not a table"
    if entry.get("published_as") is not None and not (
        isinstance(entry["published_as"], list) and len(entry["published_as"]) == 2
    ):
        return "published_as is not [category, why]"
    return None


_ENTRY_ORDER = tuple(f.name for f in fields(HistoryEntry) if f.name != "extra")
_ENTRY_FIELDS = frozenset(_ENTRY_ORDER)
_ALWAYS = frozenset({"date", "run_id", "inputs", "verdict", "on"})
_TEXTS = tuple(f.name for f in fields(HistoryEntry) if f.type == "str | None")
_CELL_FIELDS = frozenset(f.name for f in fields(HistoryCell) if f.name != "extra")
