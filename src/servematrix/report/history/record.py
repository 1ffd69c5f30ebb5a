"""The table over time: each cell's history, and the category of each of its runs at every publish.

Publishing (`servematrix report --publish`) keeps the latest row of each cell in `results/latest.json`; this
module keeps how each cell got there, in its own file beside it, `results/history.json` (the feed, documented
in docs/history.md), written in the same staging folder and moved into place with the rest of the report,
all of it or nothing.

Every cell with a new run gets an entry: the date it finished, its run id, its inputs, its verdict, its
headline figures with their intervals (min, median, max over the repeats) and where it was decided (`cpu`
for a CPU pre-flight or a CPU cell, else the GPU the host named). The inputs are three short digests:

- `inputs`: the cell's inputs hash (its id hashes the versions, the GPU kind, the Python, the mode and the
  argv; plus the workload and the model), the row's lock hash and its image digest;
- `lock`: the package versions of its lock file (`matrix/locks/<env>.lock.txt`) when the file is there and
  was made from the same request; the versions themselves are kept for the locks the cells use now, so the
  next change can be told package by package (`lock_changes`);
- `checks`: the CPU pre-flight's inputs hash (engine data, signatures, the checks' code; `reuse.py`).

Each new run is sorted into a category against the cell's previous run (`categorize`): `new`, `unchanged`,
`regressed` and `fixed` (a verdict from pass to a failure or back, or a figure whose interval fell below
the previous one, with the inputs changed), `changed-inputs` (any other move with the inputs changed) and
`flaky` (the verdict moved, or a figure's interval no longer overlaps the previous one, with identical
inputs). A rerun that leaves a cell unchanged is never a move: the intervals overlap. A run that decided
nothing about the stack (`error:*`, `interrupted`: the harness failed or was stopped, and the cell runs
again) is `undecided`, and a decided run is compared with the cell's previous decided run, past any
undecided ones: a cell stopped by a job's time limit and finished by the next run is not flaky.

The bound: a run identical to the cell's previous one (same inputs, verdict, place, figures) only counts on
its entry (`repeats`, `last_date`, `last_run_id`); a cell keeps its last `MAX_ENTRIES` entries, with how many
were dropped and the day its current verdict began (`since`), so "since when does it fail" survives the
bound. A failure whose class was named again from its stored log (`servematrix reclassify`) changes its
run's entry in place: the new class, and `named_again` with the class the run had and the publish that
renamed it. The record of publishes keeps its last `MAX_PUBLISHES`; a cell pruned from the published record
(`--prune`) leaves the history with it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servematrix.formats.lockfile import parse_header, parse_pins
from servematrix.formats.verdict import Verdict
from servematrix.report.regressions import spreads, ttft_spreads
from servematrix.store.rowschema import Row
from servematrix.util import atomic_write

SCHEMA = 1
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
    gpu = (row.host or {}).get("gpu_sku")
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


def entry_of(row: Row, pins: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A row's history entry (without its category)."""
    entry: dict[str, Any] = {
        "date": row.finished_at,
        "run_id": row.run_id,
        "inputs": _digest([row.inputs_hash, row.lock_hash, row.image_digest]),
        "verdict": str(row.verdict or ""),
        "on": decided_on(row),
    }
    if pins is not None:
        entry["lock"] = pins_digest(pins)
    if row.preflight_hash:
        entry["checks"] = str(row.preflight_hash)[:12]
    found = figures(row)
    if found:
        entry["figures"] = found
    metrics = row.metrics
    if isinstance(metrics, Mapping) and metrics.get("workload") is not None:
        # Two matrices differing only in their workload share cell ids: their figures are never compared.
        entry["workload"] = _digest(metrics["workload"])[:12]
    return entry


# --------------------------------------------------------------------------------------- categories


def verdict_kind(verdict: str) -> str:
    return verdict.partition(":")[0]


def known_same(a: Mapping[str, Any], b: Mapping[str, Any], key: str) -> bool:
    """Equal, or unknown on either side (a lock file another host had, a row without pre-flight hash)."""
    return a.get(key) is None or b.get(key) is None or a[key] == b[key]


def same_inputs(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """Whether two entries ran the same stack on the same kind of place (inputs unknown are not the same)."""
    return (
        before.get("inputs") is not None
        and before.get("inputs") == after.get("inputs")
        and known_same(before, after, "lock")
        and known_same(before, after, "checks")
        and before.get("on") == after.get("on")
    )


def moved_figures(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(figure, "down" | "up") for each figure both measured whose intervals no longer overlap; down is worse
    (fewer tok/s, a longer TTFT)."""
    old, new = before.get("figures") or {}, after.get("figures") or {}
    moved = []
    for key in sorted(set(old) & set(new)):
        (a_min, _, a_max), (b_min, _, b_max) = old[key], new[key]
        if b_max < a_min or b_min > a_max:
            higher = b_min > a_max
            worse = higher if key.startswith("ttft") else not higher
            moved.append((key, "down" if worse else "up"))
    return moved


def _interval(entry: Mapping[str, Any], key: str) -> str:
    low, median, high = entry["figures"][key]
    return f"{median:,.4g} ({low:,.4g}–{high:,.4g})"


def decided(verdict: object) -> bool:
    """Whether a run's verdict says something about the stack (not an error of the harness, not stopped)."""
    return Verdict.parse(str(verdict)).final


def categorize(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> tuple[str, str]:
    """(category, why) of a new entry against the cell's previous decided one (`previous_decided`)."""
    if not decided(after.get("verdict")):
        return "undecided", f"{after.get('verdict')}: decided nothing about the stack; the cell runs again"
    if before is None:
        return "new", "first run in the history"
    verdict_moved = before.get("verdict") != after.get("verdict")
    figs = moved_figures(before, after) if not verdict_moved else []
    if not verdict_moved and not figs:
        return "unchanged", ""
    if verdict_moved:
        what = f"verdict {before.get('verdict')} → {after.get('verdict')}"
    else:
        what = "; ".join(f"{k} {_interval(before, k)} → {_interval(after, k)}" for k, _ in figs)
    if same_inputs(before, after):
        return "flaky", f"{what} with identical inputs"
    if not known_same(before, after, "workload"):
        return "changed-inputs", f"{what}; the benchmark workload changed (another matrix's cell of this id?)"
    changed = _what_changed(before, after)
    a, b = verdict_kind(str(before.get("verdict"))), verdict_kind(str(after.get("verdict")))
    stack_changed = before.get("on") in (None, after.get("on"))  # else only where it was decided changed
    if stack_changed and verdict_moved and a == "pass" and b in FAILED_KINDS:
        return "regressed", f"{what}; {changed}"
    if stack_changed and verdict_moved and a in FAILED_KINDS and b == "pass":
        return "fixed", f"{what}; {changed}"
    if stack_changed and not verdict_moved and any(d == "down" for _, d in figs):
        return "regressed", f"{what}; {changed}"
    return "changed-inputs", f"{what}; {changed}"


def previous_decided(entries: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The newest entry whose run decided the cell: a new run is compared with it, past stopped runs."""
    return next((e for e in reversed(entries) if decided(e.get("verdict"))), None)


def _what_changed(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    if before.get("inputs") is None:
        return "the earlier run's inputs were not recorded"
    parts = []
    if before.get("on") != after.get("on"):
        parts.append(f"decided on {after.get('on')}, before on {before.get('on')}")
    if before.get("lock") and after.get("lock") and before["lock"] != after["lock"]:
        parts.append("the lock changed")
    if before.get("inputs") != after.get("inputs") and not parts:
        parts.append("the cell's inputs changed (lock request, workload, model or image)")
    if not known_same(before, after, "checks"):
        parts.append("the pre-flight's inputs changed (engine data, signatures or checks)")
    return ", ".join(parts) or "the inputs changed"


def _identical(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    keys = ("inputs", "lock", "checks", "verdict", "on", "figures")
    return all(a.get(k) == b.get(k) for k in keys)


def lock_changes(old: Mapping[str, str], new: Mapping[str, str]) -> dict[str, Any]:
    """{package: [old, new]} (None where absent), the first `_LOCK_CHANGES_SHOWN`, with how many more."""
    names = sorted(n for n in set(old) | set(new) if old.get(n) != new.get(n))
    out: dict[str, Any] = {n: [old.get(n), new.get(n)] for n in names[:_LOCK_CHANGES_SHOWN]}
    if len(names) > _LOCK_CHANGES_SHOWN:
        out["..."] = f"{len(names) - _LOCK_CHANGES_SHOWN} more"
    return out


# ------------------------------------------------------------------------------------------ a publish


def empty() -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "bound": {"entries_per_cell": MAX_ENTRIES, "publishes": MAX_PUBLISHES},
        "publishes": [],
        "locks": {},
        "cells": {},
    }


@dataclass(frozen=True, kw_only=True)
class Advance:
    """A publish's history, and the category of every cell that had a new run."""

    history: dict[str, Any]
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


def _seed(cell: dict[str, Any], previous: Mapping[str, Any] | None) -> None:
    """A cell new to the history starts from what an older record kept: its row (an entry without the lock's
    versions, which are gone) and that row's one-step summary (`previous`: run, verdict, intervals; inputs not
    recorded)."""
    if not isinstance(previous, Mapping) or not previous.get("run_id"):
        return
    entries = cell["entries"]
    if entries and entries[-1].get("run_id") == previous.get("run_id"):
        return
    if "cell_id" in previous:  # a published row
        published = Row.of({k: v for k, v in previous.items() if k != "previous"})
        entry = {**entry_of(published), "category": "new", "why": "from the record published before the history"}
    else:
        entry = {
            "date": previous.get("finished_at"),
            "run_id": previous.get("run_id"),
            "inputs": None,
            "verdict": str(previous.get("verdict") or ""),
            "on": None,
            "category": "new",
            "why": "from the record's one-step summary (inputs not recorded)",
        }
        found = {}
        for key, prefix, scale in (("tok_s", "tok_s", 1.0), ("ttft_s", "ttft_ms", 1000.0)):
            for c, s in sorted((previous.get(key) or {}).items(), key=lambda kv: int(kv[0])):
                if isinstance(s, Mapping) and all(isinstance(s.get(k), int | float) for k in ("min", "median", "max")):
                    found[f"{prefix}@{c}"] = [_round(s[k] * scale) for k in ("min", "median", "max")]
        if found:
            entry["figures"] = found
    if not entries or verdict_kind(str(entries[-1].get("verdict"))) != verdict_kind(entry["verdict"]):
        cell["since"] = entry["date"]
    cell.setdefault("first", entry["date"])
    entries.append(entry)


def advance(
    history: Mapping[str, Any] | None,
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
    out = _copy(history) if history else empty()
    out["bound"] = {"entries_per_cell": MAX_ENTRIES, "publishes": MAX_PUBLISHES}
    locks: dict[str, dict[str, str]] = out.setdefault("locks", {})
    cells: dict[str, Any] = out.setdefault("cells", {})
    categories: dict[str, tuple[str, str]] = {}
    kept = 0
    pins_of: dict[tuple[str, str], dict[str, str] | None] = {}
    old_cells = (record or {}).get("cells") or {}
    for row in rows:
        cell_id = str(row.cell_id)
        cell = cells.get(cell_id)
        if cell is None:
            cell = cells[cell_id] = {"entries": [], "dropped": 0}
            old = old_cells.get(cell_id) if isinstance(old_cells, Mapping) else None
            if isinstance(old, Mapping):  # an older record: its one-step summary, then its row
                _seed(cell, old.get("previous"))
                if old.get("run_id") != row.run_id:
                    _seed(cell, old)
        cell.update(matrix=row.matrix, mode=row.mode, env_id=row.env_id, axes=dict(row.axes))
        entries = cell["entries"]
        last = entries[-1] if entries else None
        if last is not None and row.run_id in (last.get("run_id"), last.get("last_run_id")):
            kept += 1
            _renamed(last, str(row.verdict), date)
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
            last["repeats"] = int(last.get("repeats", 1)) + 1
            last["last_date"], last["last_run_id"] = entry["date"], entry["run_id"]
            last["published"] = date
            if (category, why) != (last.get("category"), last.get("why", "")):  # the entry keeps its first
                last["published_as"] = [category, why]  # what this publish called it
            else:
                last.pop("published_as", None)
            continue
        entry["category"], entry["published"] = category, date
        if why:
            entry["why"] = why
        if last is not None and last.get("lock") in locks and pins is not None and last["lock"] != entry["lock"]:
            entry["lock_changes"] = lock_changes(locks[last["lock"]], pins)
        if pins is not None:
            locks[entry["lock"]] = dict(pins)
        # A stopped run does not end what the cell's verdict has been since.
        if "since" not in cell or (
            decided(entry["verdict"])
            and (before is None or verdict_kind(str(before.get("verdict"))) != verdict_kind(entry["verdict"]))
        ):
            cell["since"] = entry["date"]
        cell.setdefault("first", entry["date"])
        entries.append(entry)
        if len(entries) > MAX_ENTRIES:
            cell["dropped"] = int(cell.get("dropped", 0)) + len(entries) - MAX_ENTRIES
            del entries[: len(entries) - MAX_ENTRIES]
    # The cells are the published ones: a cell pruned from the record (`--prune`) leaves its history too, so
    # matrices that change their cells do not grow the feed for ever.
    published = {str(row.cell_id) for row in rows}
    out["cells"] = cells = {cell_id: cell for cell_id, cell in cells.items() if cell_id in published}
    # The lock versions kept are those the cells' last entries use: the next change is told from them.
    used = {c["entries"][-1].get("lock") for c in cells.values() if c.get("entries")}
    out["locks"] = {k: v for k, v in sorted(locks.items()) if k in used}
    if not categories:
        return _again(out, kept)
    advance_ = Advance(history=out, categories=categories, no_new_run=kept)
    out["publishes"] = [
        *out.get("publishes", []),
        {"date": date, "cells": len(rows), "counts": {c: n for c, n in advance_.counts().items() if n}},
    ][-MAX_PUBLISHES:]
    return advance_


def _renamed(entry: dict[str, Any], verdict: str, date: str) -> None:
    """A run already in the history whose failure class was named again from its log (`servematrix
    reclassify`): the entry takes the new class and keeps the one the run had, with the publish that
    renamed it. Not a new run, so no category; any other change of a run's verdict is not a renaming."""
    was = str(entry.get("verdict"))
    if verdict == was or verdict_kind(verdict) != "fail" or verdict_kind(was) != "fail":
        return
    entry["verdict"] = verdict
    entry.setdefault("named_again", {"was": was})["on"] = date


def _again(history: dict[str, Any], kept: int) -> Advance:
    """A render with no new run (the docs build, `report --from-published`): the last publish's categories,
    read back from the cells' entries it wrote (`published`), so its news stays on the page."""
    last = (history.get("publishes") or [{}])[-1].get("date")
    if last is None:
        return Advance(history=history, categories={}, no_new_run=kept)
    categories = {}
    for cell_id, cell in history.get("cells", {}).items():
        entry = (cell.get("entries") or [{}])[-1]
        if entry.get("published") == last:
            category, why = entry.get("published_as") or (entry.get("category"), entry.get("why"))
            categories[cell_id] = (str(category or "unchanged"), str(why or ""))
    return Advance(history=history, categories=categories, no_new_run=kept, again=last if categories else None)


def _copy(history: Mapping[str, Any]) -> dict[str, Any]:
    """A copy that `advance` may change (it changes cells, their entry lists and last entries, never figures)."""
    out = dict(history)
    out["cells"] = {
        cell_id: {**cell, "entries": [dict(e) for e in cell.get("entries") or []]}
        for cell_id, cell in (history.get("cells") or {}).items()
    }
    out["locks"] = dict(history.get("locks") or {})
    out["publishes"] = list(history.get("publishes") or [])
    return out


# ------------------------------------------------------------------------------------------- the feed


def load_history(path: Path) -> dict[str, Any] | None:
    """The history at `path`, None when there is none (an older site: its cells start from `previous`). A
    malformed one is a ValueError."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("cells"), dict):
        raise ValueError(f"{path}: not a servematrix history (schema {SCHEMA})")
    for cell_id, cell in data["cells"].items():
        if not isinstance(cell, dict) or not isinstance(cell.get("entries"), list):
            raise ValueError(f"{path}: cell {str(cell_id)[:80]!r} has no list of entries")
        if not all(isinstance(e, dict) for e in cell["entries"]):
            raise ValueError(f"{path}: cell {str(cell_id)[:80]!r}: an entry is not a table")
        problem = _cell_problem(cell)
        if problem:
            raise ValueError(f"{path}: cell {str(cell_id)[:80]!r}: {problem}")
        if len(cell["entries"]) > MAX_ENTRIES:  # the bound holds for what is read, not only for what is added
            cell["dropped"] = int(cell.get("dropped", 0)) + len(cell["entries"]) - MAX_ENTRIES
            cell["entries"] = cell["entries"][-MAX_ENTRIES:]
    if not isinstance(data.get("locks", {}), dict) or not isinstance(data.get("publishes", []), list):
        raise ValueError(f"{path}: locks or publishes malformed")
    return data


_FIGURE_KEY = re.compile(r"[a-z_]+@[0-9]{1,9}")


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _cell_problem(cell: Mapping[str, Any]) -> str | None:
    """What makes a cell's entries unusable (a hand edit, a crafted file), or None: a figure is three finite
    numbers under a `<figure>@<level>` key, and counts are whole numbers."""
    if "dropped" in cell and not _is_count(cell["dropped"]):
        return f"dropped is {cell['dropped']!r:.40}, not a whole number"
    for index, entry in enumerate(cell["entries"]):
        if "repeats" in entry and not _is_count(entry["repeats"]):
            return f"entry {index}: repeats is {entry['repeats']!r:.40}, not a whole number"
        found = entry.get("figures", {})
        if not isinstance(found, dict):
            return f"entry {index}: figures is not a table"
        for key, value in found.items():
            if not isinstance(key, str) or not _FIGURE_KEY.fullmatch(key):
                return f"entry {index}: figure key {str(key)[:40]!r} is not <figure>@<level>"
            numbers = value if isinstance(value, list) and len(value) == 3 else None
            if numbers is None or not all(
                isinstance(n, int | float) and not isinstance(n, bool) and math.isfinite(n) for n in numbers
            ):
                return f"entry {index}: figure {key} is {str(value)[:40]}, not three finite numbers"
    return None


def dumps(history: Mapping[str, Any]) -> str:
    """One cell a line, so a nightly publish changes few lines of the file in git."""
    parts = []
    for key in ("schema", "bound", "publishes", "locks"):
        parts.append(f"{json.dumps(key)}: {json.dumps(history.get(key), sort_keys=True, ensure_ascii=False)}")
    cells = history.get("cells") or {}
    body = ",\n".join(
        f"  {json.dumps(c)}: {json.dumps(cells[c], sort_keys=True, ensure_ascii=False, allow_nan=False)}"
        for c in sorted(cells)
    )
    return "{\n" + ",\n".join(parts) + ',\n"cells": {\n' + body + "\n}\n}\n"


def write_history(history: Mapping[str, Any], path: Path) -> Path:
    return atomic_write(path, dumps(history))
