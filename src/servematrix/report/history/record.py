"""The table over time: each cell's history, and the category of each of its runs at every publish.

Publishing keeps the latest row of each cell in `results/latest.json`; this module keeps how each cell got
there, in `results/history.json` beside it (the feed, docs/history.md), moved into place with the rest of the
report, all of it or nothing. Each new run gets an entry (its inputs as digests, verdict, figures with their
intervals, where it was decided) and a category against the cell's previous decided run (`categorize`). The
history is bounded (`MAX_ENTRIES` per cell, `MAX_PUBLISHES`), yet keeps since when a cell fails (`since`);
`lock_changes` tells a lock's change package by package.

More, with the measurements behind it: docs/design-notes.md#srcservematrixreporthistoryrecordpy
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from servematrix.formats.lockfile import parse_header, parse_pins
from servematrix.formats.verdict import Verdict
from servematrix.records.history import SCHEMA, History, HistoryCell, HistoryEntry
from servematrix.report.regressions import spreads, ttft_spreads
from servematrix.store.rowschema import Row
from servematrix.util import atomic_write

HISTORY = Path("results") / "history.json"  # the feed, inside the site, beside results/latest.json
MAX_ENTRIES = 60  # per cell, after run-length compression
MAX_PUBLISHES = 60
CATEGORIES = ("new", "unchanged", "undecided", "regressed", "fixed", "changed-inputs", "flaky")
FAILED_KINDS = frozenset({"fail", "unresolvable", "predicted-fail"})
_LOCK_CHANGES_SHOWN = 40  # packages listed per lock change; the rest are counted


# ------------------------------------------------------------------------------------------- an entry


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]


def _round(value: float) -> float:
    """4 significant digits: the figures' noise is far larger, and the feed stays small."""
    if not value or not math.isfinite(value):
        return 0.0 if value == 0 else value
    return float(f"{value:.4g}")


def figures(row: Row) -> dict[str, list[float]]:
    """The headline figures of a row with their intervals: `tok_s@<c>` (output tok/s) and `ttft_ms@<c>` (the
    prefill profile's TTFT) -> [min, median, max] over the repeats."""
    metrics = row.metrics
    out: dict[str, list[float]] = {}
    try:
        for c, s in sorted(spreads(metrics).items()):
            out[f"tok_s@{c}"] = [_round(s["min"]), _round(s["median"]), _round(s["max"])]
        for c, s in sorted(ttft_spreads(metrics).items()):
            out[f"ttft_ms@{c}"] = [_round(s["min"] * 1000), _round(s["median"] * 1000), _round(s["max"] * 1000)]
    except (TypeError, ValueError, KeyError, AttributeError):  # figures that are not figures: none
        return {}
    return out


def decided_on(row: Row) -> str:
    """`cpu` when nothing was served on a GPU (a CPU pre-flight, a CPU cell), else the GPU the host named."""
    stages = row.stages or {}
    served = row.metrics is not None or any(s in stages for s in ("build", "serve", "bench"))
    gpu = row.on_host.gpu_sku
    return str(gpu) if served and gpu else "cpu"


def read_pins(lock_file: str | None, lock_hash: str | None, root: Path) -> dict[str, str] | None:
    """The package versions of a row's lock file, when it is under `root` and was made from the row's request
    (its header's inputs hash is the row's lock hash); None otherwise (another host's lock, a stale one)."""
    if not lock_file or Path(lock_file).is_absolute() or ".." in Path(lock_file).parts:
        return None
    path = root / lock_file
    try:
        stat = path.stat()
        key = (str(path.absolute()), stat.st_mtime_ns, stat.st_size)
        if key not in _PINS:
            text = path.read_text(encoding="utf-8")
            header = parse_header(text)
            _PINS[key] = (header.inputs_hash if header else None, parse_pins(text) if header else {})
    except (OSError, UnicodeDecodeError):
        return None
    request, pins = _PINS[key]
    if request is None or (lock_hash and request != lock_hash):
        return None
    return pins


# Lock files read, by path, time and size: a lock file is read once a process, however many publishes.
_PINS: dict[tuple[str, int, int], tuple[str | None, dict[str, str]]] = {}


def pins_digest(pins: Mapping[str, str]) -> str:
    key = id(pins)
    if key not in _DIGESTS or _DIGESTS[key][0] is not pins:
        _DIGESTS[key] = (pins, _digest(sorted(pins.items())))
    return _DIGESTS[key][1]


_DIGESTS: dict[int, tuple[Mapping[str, str], str]] = {}  # the lock files' pins above, digested once


def entry_of(row: Row, pins: Mapping[str, str] | None = None) -> HistoryEntry:
    """A row's history entry (without its category)."""
    metrics = row.metrics
    # Two matrices differing only in their workload share cell ids: their figures are never compared.
    workload = metrics.get("workload") if isinstance(metrics, Mapping) else None
    return HistoryEntry(
        date=row.finished_at,
        run_id=row.run_id,
        inputs=_digest([row.inputs_hash, row.lock_hash, row.image_digest]),
        verdict=str(row.verdict or ""),
        on=decided_on(row),
        lock=pins_digest(pins) if pins is not None else None,
        checks=str(row.preflight_hash)[:12] if row.preflight_hash else None,
        figures=figures(row) or None,
        workload=_digest(workload)[:12] if workload is not None else None,
    )


# --------------------------------------------------------------------------------------- categories


def verdict_kind(verdict: str) -> str:
    return verdict.partition(":")[0]


def known_same(a: HistoryEntry, b: HistoryEntry, key: str) -> bool:
    """Equal, or unknown on either side (a lock file another host had, a row without pre-flight hash)."""
    first, second = getattr(a, key), getattr(b, key)
    return first is None or second is None or first == second


def same_inputs(before: HistoryEntry, after: HistoryEntry) -> bool:
    """Whether two entries ran the same stack on the same kind of place (inputs unknown are not the same)."""
    return (
        before.inputs is not None
        and before.inputs == after.inputs
        and known_same(before, after, "lock")
        and known_same(before, after, "checks")
        and before.on == after.on
    )


def moved_figures(before: HistoryEntry, after: HistoryEntry) -> list[tuple[str, str]]:
    """(figure, "down" | "up") for each figure both measured whose intervals no longer overlap; down is worse
    (fewer tok/s, a longer TTFT)."""
    old, new = before.figures or {}, after.figures or {}
    moved = []
    for key in sorted(set(old) & set(new)):
        (a_min, _, a_max), (b_min, _, b_max) = old[key], new[key]
        if b_max < a_min or b_min > a_max:
            higher = b_min > a_max
            worse = higher if key.startswith("ttft") else not higher
            moved.append((key, "down" if worse else "up"))
    return moved


def _interval(entry: HistoryEntry, key: str) -> str:
    low, median, high = (entry.figures or {})[key]
    return f"{median:,.4g} ({low:,.4g}–{high:,.4g})"


def decided(verdict: object) -> bool:
    """Whether a run's verdict says something about the stack (not an error of the harness, not stopped)."""
    return Verdict.parse(str(verdict)).final


def categorize(before: HistoryEntry | None, after: HistoryEntry) -> tuple[str, str]:
    """(category, why) of a new entry against the cell's previous decided one (`previous_decided`)."""
    if not decided(after.verdict):
        return "undecided", f"{after.verdict}: decided nothing about the stack; the cell runs again"
    if before is None:
        return "new", "first run in the history"
    verdict_moved = before.verdict != after.verdict
    figs = moved_figures(before, after) if not verdict_moved else []
    if not verdict_moved and not figs:
        return "unchanged", ""
    if verdict_moved:
        what = f"verdict {before.verdict} → {after.verdict}"
    else:
        what = "; ".join(f"{k} {_interval(before, k)} → {_interval(after, k)}" for k, _ in figs)
    if same_inputs(before, after):
        return "flaky", f"{what} with identical inputs"
    if not known_same(before, after, "workload"):
        return "changed-inputs", f"{what}; the benchmark workload changed (another matrix's cell of this id?)"
    changed = _what_changed(before, after)
    a, b = verdict_kind(str(before.verdict)), verdict_kind(str(after.verdict))
    stack_changed = before.on in (None, after.on)  # else only where it was decided changed
    if stack_changed and verdict_moved and a == "pass" and b in FAILED_KINDS:
        return "regressed", f"{what}; {changed}"
    if stack_changed and verdict_moved and a in FAILED_KINDS and b == "pass":
        return "fixed", f"{what}; {changed}"
    if stack_changed and not verdict_moved and any(d == "down" for _, d in figs):
        return "regressed", f"{what}; {changed}"
    return "changed-inputs", f"{what}; {changed}"


def previous_decided(entries: Sequence[HistoryEntry]) -> HistoryEntry | None:
    """The newest entry whose run decided the cell: a new run is compared with it, past stopped runs."""
    return next((e for e in reversed(entries) if decided(e.verdict)), None)


def _what_changed(before: HistoryEntry, after: HistoryEntry) -> str:
    if before.inputs is None:
        return "the earlier run's inputs were not recorded"
    parts = []
    if before.on != after.on:
        parts.append(f"decided on {after.on}, before on {before.on}")
    if before.lock and after.lock and before.lock != after.lock:
        parts.append("the lock changed")
    if before.inputs != after.inputs and not parts:
        parts.append("the cell's inputs changed (lock request, workload, model or image)")
    if not known_same(before, after, "checks"):
        parts.append("the pre-flight's inputs changed (engine data, signatures or checks)")
    return ", ".join(parts) or "the inputs changed"


def _identical(a: HistoryEntry, b: HistoryEntry) -> bool:
    return (a.inputs, a.lock, a.checks, a.verdict, a.on, a.figures) == (
        b.inputs,
        b.lock,
        b.checks,
        b.verdict,
        b.on,
        b.figures,
    )


def lock_changes(old: Mapping[str, str], new: Mapping[str, str]) -> dict[str, Any]:
    """{package: [old, new]} (None where absent), the first `_LOCK_CHANGES_SHOWN`, with how many more."""
    names = sorted(n for n in set(old) | set(new) if old.get(n) != new.get(n))
    out: dict[str, Any] = {n: [old.get(n), new.get(n)] for n in names[:_LOCK_CHANGES_SHOWN]}
    if len(names) > _LOCK_CHANGES_SHOWN:
        out["..."] = f"{len(names) - _LOCK_CHANGES_SHOWN} more"
    return out


# ------------------------------------------------------------------------------------------ a publish

BOUND = {"entries_per_cell": MAX_ENTRIES, "publishes": MAX_PUBLISHES}


def empty() -> History:
    return History(bound=BOUND)


@dataclass(frozen=True, kw_only=True)
class Advance:
    """A publish's history, and the category of every cell that had a new run."""

    history: History
    categories: Mapping[str, tuple[str, str]]  # cell id -> (category, why), cells with a new run only
    no_new_run: int  # cells published again without a new run
    # A render with no new run (the docs build) shows the last publish's news again: its date, else None.
    again: str | None = None

    def counts(self) -> dict[str, int]:
        found = {c: 0 for c in CATEGORIES}
        for category, _ in self.categories.values():
            found[category] += 1
        return found

    def summary(self) -> str:
        counts = ", ".join(f"{n} {c}" for c, n in self.counts().items() if n)
        if self.again is not None:
            return f"history: the last publish ({self.again}, rendered again): {counts} (bound: {MAX_ENTRIES} entries per cell)"
        return (
            f"history: {counts or 'no new run'}"
            + (f"; {self.no_new_run} cell(s) without a new run" if self.no_new_run else "")
            + f" (bound: {MAX_ENTRIES} entries per cell)"
        )

    def lines(self) -> list[str]:
        """A line per cell whose category is news (all but new and unchanged), for the report's summary."""
        return [
            f"{category}: cell {cell}: {why}"
            for cell, (category, why) in sorted(self.categories.items(), key=lambda kv: (kv[1][0], kv[0]))
            if category not in ("new", "unchanged")
        ]


def _seed(cell: HistoryCell, previous: object) -> HistoryCell:
    """A cell new to the history starts from what an older record kept: its row (an entry without the lock's
    versions, which are gone) and that row's one-step summary (`previous`: run, verdict, intervals; inputs not
    recorded)."""
    if not isinstance(previous, Mapping) or not previous.get("run_id"):
        return cell
    if cell.entries and cell.entries[-1].run_id == previous.get("run_id"):
        return cell
    if "cell_id" in previous:  # a published row
        published = Row.of({k: v for k, v in previous.items() if k != "previous"})
        entry = replace(entry_of(published), category="new", why="from the record published before the history")
    else:
        found = {}
        for key, prefix, scale in (("tok_s", "tok_s", 1.0), ("ttft_s", "ttft_ms", 1000.0)):
            for c, s in sorted((previous.get(key) or {}).items(), key=lambda kv: int(kv[0])):
                if isinstance(s, Mapping) and all(isinstance(s.get(k), int | float) for k in ("min", "median", "max")):
                    found[f"{prefix}@{c}"] = [_round(s[k] * scale) for k in ("min", "median", "max")]
        entry = HistoryEntry(
            date=previous.get("finished_at"),
            run_id=previous.get("run_id"),
            verdict=str(previous.get("verdict") or ""),
            category="new",
            why="from the record's one-step summary (inputs not recorded)",
            figures=found or None,
        )
    since = cell.since
    if not cell.entries or verdict_kind(str(cell.entries[-1].verdict)) != verdict_kind(str(entry.verdict)):
        since = entry.date
    first = entry.date if cell.first is None else cell.first
    return replace(cell, entries=(*cell.entries, entry), since=since, first=first)


def advance(
    history: History | None,
    rows: Sequence[Row],
    *,
    date: str,
    root: Path,
    record: Mapping[str, Any] | None = None,
) -> Advance:
    """`history` (None: none yet) with the published `rows` of a publish on `date`. A row whose run the cell's
    last entry already holds (a cell kept, a re-render) adds nothing. `record` is the published record
    before this publish: a cell new to the history starts from its one-step `previous` summary. Lock files
    are read under `root` (the project)."""
    before_publish = history or empty()
    locks: dict[str, Mapping[str, str]] = dict(before_publish.locks)
    cells: dict[str, HistoryCell] = dict(before_publish.cells)
    categories: dict[str, tuple[str, str]] = {}
    kept = 0
    pins_of: dict[tuple[str, str], dict[str, str] | None] = {}
    old_cells = (record or {}).get("cells") or {}
    for row in rows:
        cell_id = str(row.cell_id)
        cell = cells.get(cell_id)
        if cell is None:
            cell = HistoryCell()
            old = old_cells.get(cell_id) if isinstance(old_cells, Mapping) else None
            if isinstance(old, Mapping):  # an older record: its one-step summary, then its row
                cell = _seed(cell, old.get("previous"))
                if old.get("run_id") != row.run_id:
                    cell = _seed(cell, old)
        cell = replace(cell, matrix=row.matrix, mode=row.mode, env_id=row.env_id, axes=dict(row.axes))
        cells[cell_id] = cell
        entries = list(cell.entries)
        last = entries[-1] if entries else None
        if last is not None and row.run_id in (last.run_id, last.last_run_id):
            kept += 1
            cells[cell_id] = replace(cell, entries=(*entries[:-1], _renamed(last, str(row.verdict), date)))
            continue
        key = (str(row.lock_file or ""), str(row.lock_hash or ""))
        if key not in pins_of:
            pins_of[key] = read_pins(row.lock_file, row.lock_hash, root)
        pins = pins_of[key]
        entry = entry_of(row, pins)
        before = previous_decided(entries)
        category, why = categorize(before, entry)
        if category == "new" and entries:  # only stopped runs before it
            why = "first decided run in the history"
        categories[cell_id] = (category, why)
        if last is not None and _identical(last, entry):
            # The entry keeps its first category; what this publish called it, where that differs.
            called = (category, why) != (last.category, "" if last.why is None else last.why)
            repeated = replace(
                last,
                repeats=last.repeated + 1,
                last_date=entry.date,
                last_run_id=entry.run_id,
                published=date,
                published_as=[category, why] if called else None,
            )
            cells[cell_id] = replace(cell, entries=(*entries[:-1], repeated))
            continue
        changes = None
        if last is not None and last.lock in locks and pins is not None and last.lock != entry.lock:
            changes = lock_changes(locks[str(last.lock)], pins)
        entry = replace(entry, category=category, published=date, why=why or None, lock_changes=changes)
        if pins is not None:
            locks[str(entry.lock)] = dict(pins)
        since = cell.since
        # A stopped run does not end what the cell's verdict has been since.
        if since is None or (
            decided(entry.verdict)
            and (before is None or verdict_kind(str(before.verdict)) != verdict_kind(str(entry.verdict)))
        ):
            since = entry.date
        first = entry.date if cell.first is None else cell.first
        cells[cell_id] = replace(cell, entries=(*entries, entry), since=since, first=first).bounded(MAX_ENTRIES)
    # The cells are the published ones: a cell pruned from the record (`--prune`) leaves its history too, so
    # matrices that change their cells do not grow the feed for ever.
    published = {str(row.cell_id) for row in rows}
    cells = {cell_id: cell for cell_id, cell in cells.items() if cell_id in published}
    # The lock versions kept are those the cells' last entries use: the next change is told from them.
    used = {c.entries[-1].lock for c in cells.values() if c.entries}
    out = replace(
        before_publish,
        bound=BOUND,
        cells=cells,
        locks={k: v for k, v in sorted(locks.items()) if k in used},
    )
    if not categories:
        return _again(out, kept)
    advance_ = Advance(history=out, categories=categories, no_new_run=kept)
    publish = {"date": date, "cells": len(rows), "counts": {c: n for c, n in advance_.counts().items() if n}}
    return replace(advance_, history=replace(out, publishes=(*out.publishes, publish)[-MAX_PUBLISHES:]))


def _renamed(entry: HistoryEntry, verdict: str, date: str) -> HistoryEntry:
    """A run already in the history whose failure class was named again from its log (`servematrix
    reclassify`): the entry takes the new class and keeps the one the run had, with the publish that
    renamed it. Not a new run, so no category; any other change of a run's verdict is not a renaming."""
    was = str(entry.verdict)
    if verdict == was or verdict_kind(verdict) != "fail" or verdict_kind(was) != "fail":
        return entry
    return replace(entry, verdict=verdict, named_again={**(entry.named_again or {"was": was}), "on": date})


def _again(history: History, kept: int) -> Advance:
    """A render with no new run (the docs build, `report --from-published`): the last publish's categories,
    read back from the cells' entries it wrote (`published`), so its news stays on the page."""
    last = history.last_publish
    if last is None:
        return Advance(history=history, categories={}, no_new_run=kept)
    categories = {}
    for cell_id, cell in history.cells.items():
        entry = cell.entries[-1] if cell.entries else None
        if entry is not None and entry.published == last:
            category, why = entry.published_as or (entry.category, entry.why)
            categories[cell_id] = (str(category or "unchanged"), str(why or ""))
    return Advance(history=history, categories=categories, no_new_run=kept, again=last if categories else None)


# ------------------------------------------------------------------------------------------- the feed


def load_history(path: Path) -> History | None:
    """The history at `path`, None when there is none (an older site: its cells start from `previous`). A
    malformed one is a ValueError naming the cell, the entry and the field."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("cells"), dict):
        raise ValueError(f"{path}: not a servematrix history (schema {SCHEMA})")
    # The bound holds for what is read, not only for what is added.
    cells = {
        str(cell_id): HistoryCell.from_json(cell, f"{path}: cell {str(cell_id)[:80]!r}").bounded(MAX_ENTRIES)
        for cell_id, cell in data["cells"].items()
    }
    locks, publishes, bound = data.get("locks", {}), data.get("publishes", []), data.get("bound")
    if not isinstance(locks, dict) or not isinstance(publishes, list):
        raise ValueError(f"{path}: locks or publishes malformed")
    return History(
        bound=bound if isinstance(bound, dict) else BOUND, publishes=tuple(publishes), locks=locks, cells=cells
    )


def dumps(history: History) -> str:
    """One cell a line, so a nightly publish changes few lines of the file in git."""
    data = history.to_json()
    parts = []
    for key in ("schema", "bound", "publishes", "locks"):
        parts.append(f"{json.dumps(key)}: {json.dumps(data[key], sort_keys=True, ensure_ascii=False)}")
    cells = data["cells"]
    body = ",\n".join(
        f"  {json.dumps(c)}: {json.dumps(cells[c], sort_keys=True, ensure_ascii=False, allow_nan=False)}"
        for c in sorted(cells)
    )
    return "{\n" + ",\n".join(parts) + ',\n"cells": {\n' + body + "\n}\n}\n"


def write_history(history: History, path: Path) -> Path:
    return atomic_write(path, dumps(history))
