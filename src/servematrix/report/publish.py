"""What a report is made of, and publishing: an explicit act that merges, and never shrinks silently.

- A **preview** (`servematrix report`, `servematrix run --report PATH`) renders a store's newest finished
  rows into a directory of the user's (default `.servematrix/report/`, not committed). It writes no
  results record, and it refuses a directory that holds one: that directory is published, and a preview
  there would replace its results with one store's.
- **Publishing** (`servematrix report --publish`, into `docs/` by default) merges the store's rows into the
  published record (`results/latest.json`), cell by cell: a cell's newer finished row replaces the older
  one, cells the store lacks stay. Only `--prune` removes them, and it says how many. A run that decided
  nothing (`error:*`, `interrupted`: a job's time limit, a lost node) never replaces a decided row: the
  published pass and its figures stay until a run decides the cell again.

A store that is missing, empty or holds no finished row is an input error, never an empty report: a lost
CI artifact must not wipe the published results, nor pass a regression gate.

Either way the report is written whole or not at all (`write_report`): it is built in a staging folder
inside the output folder, every destination is tried for writing, and only then are the files moved into
place. A folder that is read-only or immutable, or a path the system refuses, is one line and exit 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from servematrix.engines import check_registered
from servematrix.errors import InputError
from servematrix.formats.verdict import Verdict, observed, unserved
from servematrix.planning.schedule import makespan_line, stored_spans
from servematrix.records.published import RECORD
from servematrix.report import owned
from servematrix.report.history import record as history
from servematrix.report.regressions import load_export, portable_argv, published_rows, scrub_host_paths
from servematrix.stages import naming
from servematrix.store.redact import bounded_evidence, bounded_excerpt
from servematrix.store.rowschema import in_future
from servematrix.store.store import Row, Store
from servematrix.util import atomic_write

HISTORY = history.HISTORY  # each cell's runs over time, beside it (the feed)


def store_rows(path: Path) -> list[Row]:
    """The newest finished row of every cell in the store at `path`; an InputError when there is none."""
    if not path.exists():
        raise InputError(f"{path}: no such store")
    if not path.is_file():
        raise InputError(f"{path}: not a store (not a file)")
    if path.stat().st_size == 0:
        raise InputError(f"{path}: empty file, not a store: nothing to report")
    try:
        with Store(path, read_only=True) as store:  # reporting reads only: no WAL switch, no new columns
            rows = store.latest()
    except sqlite3.DatabaseError as exc:
        raise InputError(f"{path}: not a servematrix store ({exc})") from None
    if not rows:
        raise InputError(f"{path}: no finished cell runs in this store: nothing to report")
    _check_engines((row.engine, f"{path}: the row of cell {row.cell_id!r}") for row in rows)
    return rows


def store_packing(path: Path, runs: int = 3) -> list[str]:
    """The newest packed runs of a store (read only), a line each: the makespan against its lower bound."""
    with Store(path, read_only=True) as store:
        jobs = store.packed_jobs()
    by_run: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        by_run.setdefault(job["run_id"], []).append(job)
    newest = sorted(by_run, reverse=True)[:runs]  # run ids begin with their start time
    return [f"run {run}: {makespan_line(stored_spans(by_run[run]), by_run[run][0]['host_gpus'])}" for run in newest]


_OWN_FOLDERS = ("plots", "failures")


@contextlib.contextmanager
def publish_lock(out_dir: Path) -> Iterator[None]:
    """One publisher into a folder at a time: its record is read, merged and written holding a lock on the folder.
    Two at once would each merge into the record as it was before the other wrote, and one store's cells would
    be lost. A folder this made for its lock is removed again if nothing was written there. Holding it, the
    staging folders of a publish that was killed are removed."""
    created = not out_dir.exists()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # not a folder, or one that cannot be made: write_report says so, writing nothing
        fd = None
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
            _finish_pending(out_dir)  # a publish killed while moving its files: its files move in now
            for leftover in out_dir.glob(".servematrix-staging-*"):  # a publish killed mid-write left it
                shutil.rmtree(leftover, ignore_errors=True)
        yield
    finally:
        if fd is not None:
            os.close(fd)
            if created:
                with contextlib.suppress(OSError):
                    out_dir.rmdir()  # only when empty


def write_report(
    rows: Sequence[Row],
    out_dir: Path,
    *,
    baseline: Path | None,
    write_record: bool,
    markdown_name: str,
    packing: Sequence[str] = (),
) -> Any:
    """`site.build_report` into `out_dir`, all of it or nothing: built in a staging folder, then moved."""
    from servematrix.report.site import build_report

    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir}: is not a folder (the report is a folder of pages)")
    for name in (*_OWN_FOLDERS, RECORD.parent.as_posix()):
        if (out_dir / name).is_symlink():
            raise InputError(
                f"{out_dir / name}: is a symbolic link; servematrix writes report folders only where it made them"
            )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        _finish_pending(out_dir)
        staging = Path(tempfile.mkdtemp(prefix=".servematrix-staging-", dir=out_dir))
    except OSError as exc:
        raise InputError(f"{out_dir}: cannot write the report there ({exc.strerror}); nothing was written") from None
    try:
        advanced = _advance_history(out_dir, rows) if write_record else None
        result = build_report(
            rows,
            staging,
            baseline=baseline,
            results=staging / RECORD,
            write_record=write_record,
            markdown_name=markdown_name,
            shown_from=out_dir,
            packing=packing,
            history=advanced,
        )
        if advanced is not None:  # the feed, moved into place with the rest
            result = dataclasses.replace(result, history=history.write_history(advanced.history, staging / HISTORY))
        files = sorted(p.relative_to(staging) for p in staging.rglob("*") if p.is_file() and p.name != owned.MANIFEST)
        for folder in sorted({out_dir / f.parent for f in files}):
            _check_writable(folder, [out_dir / f for f in files if out_dir / f.parent == folder])
        # The files move one by one: a journal naming the staging folder makes the moves one change. A publish
        # killed among them (history.json moved, latest.json not) leaves the journal, and the next publisher
        # finishes the moves before it reads the record (`_finish_pending`), so the two never disagree.
        atomic_write(out_dir / PENDING, json.dumps({"staging": staging.name, "files": [f.as_posix() for f in files]}))
        try:
            moved = _move_staged(out_dir, staging, files)
        except OSError as exc:
            raise InputError(
                f"{out_dir}: moving the report into place failed ({exc}); the next publish into it finishes the move"
            ) from None
        (out_dir / PENDING).unlink()
        assert moved == len(files)
    except OSError as exc:  # a full disk while the report was built (ENOSPC): nothing was moved into place
        raise InputError(f"{out_dir}: writing the report failed ({exc.strerror or exc}); nothing was written") from None
    finally:
        if not (out_dir / PENDING).is_file():  # else kept for the next publish to finish moving
            shutil.rmtree(staging, ignore_errors=True)

    def placed(path: Path) -> Path:
        return out_dir / path.relative_to(staging)

    return dataclasses.replace(
        result,
        markdown=placed(result.markdown),
        html=placed(result.html),
        plots=tuple(placed(p) for p in result.plots),
        failure_pages=tuple(placed(p) for p in result.failure_pages),
        results=placed(result.results) if result.results is not None else None,
        history=placed(result.history) if result.history is not None else None,
    )


PENDING = Path(".servematrix-publish-pending.json")  # the journal of a publish's moves, in the site


def _move_staged(out_dir: Path, staging: Path, files: Sequence[Path]) -> int:
    """Move the staged files into the site (a file already moved is skipped: a move finished again), then
    the own folders' manifests. Returns how many files are in place."""
    for relative in files:
        if (staging / relative).is_file():
            os.replace(staging / relative, out_dir / relative)
    for name in _OWN_FOLDERS:
        if (staging / name).is_dir():
            owned.replace_owned(out_dir / name, owned.owned(staging / name))
    return sum((out_dir / relative).is_file() for relative in files)


def _finish_pending(out_dir: Path) -> None:
    """Finish the moves of a publish killed while it moved its files into `out_dir` (its journal names them),
    holding the publish lock; a journal whose staging folder is gone, or that does not parse, is removed."""
    journal = out_dir / PENDING
    if not journal.is_file() or journal.is_symlink():
        return
    try:
        pending = json.loads(journal.read_text(encoding="utf-8"))
        staging = out_dir / str(pending["staging"])
        files = [Path(str(f)) for f in pending["files"]]
    except (OSError, ValueError, KeyError, TypeError):
        journal.unlink(missing_ok=True)
        return
    safe = staging.name.startswith(".servematrix-staging-") and staging.parent == out_dir and staging.is_dir()
    if safe and all(not f.is_absolute() and ".." not in f.parts for f in files):
        _move_staged(out_dir, staging, files)
        print(f"servematrix: {out_dir}: finished moving a publish that was stopped midway", file=sys.stderr)
    journal.unlink(missing_ok=True)


def _advance_history(out_dir: Path, rows: Sequence[Row]) -> history.Advance:
    """The site's history (`results/history.json`; none yet in an older site) with this publish's rows."""
    path = out_dir / HISTORY
    try:
        found = history.load_history(path)
        record = load_export(out_dir / RECORD)
    except ValueError as exc:
        raise InputError(f"{path}: not a servematrix history ({exc}); nothing was written") from None
    except OSError as exc:
        raise InputError(f"{str(path)[:200]}: cannot read the history ({exc.strerror})") from None
    date = datetime.now(UTC).isoformat(timespec="seconds")
    return history.advance(found, rows, date=date, root=Path.cwd(), record=record)


def _check_writable(folder: Path, targets: Sequence[Path]) -> None:
    """An InputError unless a file can be made in `folder` and each existing target replaced (an immutable
    file refuses even root, which os.access does not tell)."""
    try:
        owned.own_folder(folder)
        probe = folder / f".servematrix-probe-{uuid.uuid4().hex[:12]}"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
    except OSError as exc:
        raise InputError(f"{folder}: cannot write the report there ({exc.strerror}); nothing was written") from None
    for target in targets:
        if target.is_dir() and not target.is_symlink():
            raise InputError(f"{target}: is a folder where the report writes a file; nothing was written")
        if target.is_symlink() or not target.is_file():
            continue  # a rename replaces the link itself
        try:
            with open(target, "ab"):
                pass
        except PermissionError as exc:
            if exc.errno == errno.EPERM:  # immutable; EACCES (read-only mode) a rename still replaces
                raise InputError(f"{target}: cannot be replaced ({exc.strerror}); nothing was written") from None


def _check_engines(named: Iterable[tuple[object, str]]) -> None:
    """Each row's engine, with where the row is: a row's engine is loaded to render it, so only a registered
    engine is allowed (each name checked once)."""
    registered: set[str] = set()
    for name, where in named:
        if not (isinstance(name, str) and name in registered):
            check_registered(name, where)
            registered.add(str(name))


def read_record(path: Path) -> dict[str, Any] | None:
    """The published record at `path`, None when there is none; a malformed one is an InputError."""
    try:
        record = load_export(path)
    except ValueError as exc:  # json.JSONDecodeError included
        raise InputError(f"{path}: not a servematrix results record ({exc})") from None
    except OSError as exc:  # a name too long, a folder that cannot be read
        raise InputError(f"{str(path)[:200]}: cannot read the results record ({exc.strerror})") from None
    cells = (record or {}).get("cells", {})
    _check_engines(
        (entry.get("engine") if isinstance(entry, Mapping) else None, f"{path}: cell {cell_id!r}")
        for cell_id, entry in cells.items()
    )
    return record


def refuse_published(out_dir: Path) -> None:
    """A preview must not land in a published site: it would replace the site's results with one store's."""
    record = out_dir / RECORD
    if record.exists():
        raise InputError(
            f"{out_dir} holds published results ({record}); a report there replaces them with one store's cells. "
            f"Publish with `servematrix report --publish --out {out_dir}` (it merges), or write elsewhere"
        )


@dataclass(frozen=True, kw_only=True)
class Publication:
    """The published rows after a merge, and what the merge did, cell by cell."""

    rows: tuple[Row, ...]
    added: int  # cells new to the record
    replaced: int  # cells whose published row a newer run replaced
    same: int  # cells whose published run is the store's newest (rendered again)
    kept_newer: int  # cells published from a run newer than the store's, kept
    kept_observed: int  # cells observed on a GPU that the store has only a CPU verdict for, kept
    kept_decided: int  # decided cells whose newer run in the store decided nothing (error, interrupted), kept
    kept_absent: int  # cells the store lacks, kept
    pruned: int  # cells the store lacks, removed (--prune)
    kept_future: int = 0  # cells whose store row finished ahead of this host's clock (a skewed clock), kept

    def summary(self, record: Path) -> str:
        parts = [
            f"{self.added} new",
            f"{self.replaced} replaced by a newer run",
            f"{self.same} unchanged",
            f"{self.kept_newer} kept (the published run is newer than the store's)",
            f"{self.kept_observed} kept (observed on a GPU; the store has only a CPU verdict)",
            f"{self.kept_decided} kept (the store's run decided nothing: error or interrupted)",
            f"{self.kept_absent} kept (not in the store; --prune removes them)",
        ]
        if self.pruned:
            parts[-1] = f"{self.pruned} pruned (not in the store)"
        if self.kept_future:
            parts.append(
                f"{self.kept_future} kept (the store's run finished after this host's clock says it is now: "
                "a skewed clock; its row is not published)"
            )
        return f"published {len(self.rows)} cell(s) to {record}: " + ", ".join(parts)


def _finished(row: Row) -> datetime | None:
    stamp = row.finished_at
    try:
        when = datetime.fromisoformat(str(stamp)) if stamp else None
    except ValueError:
        return None
    when = when.replace(tzinfo=UTC) if when is not None and when.tzinfo is None else when
    return None if in_future(when.isoformat() if when else None) else when  # a skewed clock never pins a cell


def _newer_or_same(row: Row, than: Row) -> bool:
    """Whether `row` finished no earlier than `than`. A row with no readable time is the older one."""
    mine, theirs = _finished(row), _finished(than)
    if theirs is None:
        return True
    if mine is None:
        return False
    return mine >= theirs


def _portable_path(path: str | None) -> str | None:
    """A stored path as published: relative to the project when under it, else without the host's folders."""
    return scrub_host_paths(portable_argv([path], Path.cwd().absolute())[0]) if path else path


def merge_published(published: Mapping[str, Any] | None, rows: Sequence[Row], *, prune: bool = False) -> Publication:
    """The published cells with `rows` merged in: keyed by cell id, the newer finished row wins; published
    cells absent from `rows` stay unless `prune`."""
    current = {row.cell_id: row for row in published_rows(published)} if published else {}
    merged: dict[str, Row] = {}
    counts = {"added": 0, "replaced": 0, "same": 0, "kept_newer": 0, "kept_observed": 0, "kept_decided": 0}
    counts["kept_future"] = 0
    for row in rows:
        old = current.get(row.cell_id)
        if old is None:
            counts["added"] += 1
            merged[row.cell_id] = row
        elif old.run_id == row.run_id:
            counts["same"] += 1
            merged[row.cell_id] = row
        elif unserved(str(row.verdict or "")) and observed(str(old.verdict or "")):
            # A verdict reached without serving the cell (the nightly CPU pre-flight, an image that does not
            # hold it) does not overwrite what a GPU run observed.
            counts["kept_observed"] += 1
            merged[row.cell_id] = old
        elif not Verdict.parse(str(row.verdict or "")).final and Verdict.parse(str(old.verdict)).final:
            # A stopped run or a harness fault says nothing about the stack: it does not unpublish a verdict.
            counts["kept_decided"] += 1
            merged[row.cell_id] = old
        elif in_future(row.finished_at):
            # Neither newer nor older can be told: a time ahead of the clock would pin the cell, and dropping
            # it as "older" would be a false reason. Kept as published, and said so.
            counts["kept_future"] += 1
            merged[row.cell_id] = old
            print(
                f"servematrix: cell {row.cell_id}: the store's run {row.run_id} finished at "
                f"{row.finished_at}, ahead of this host's clock (skewed?): not published over run "
                f"{old.run_id}",
                file=sys.stderr,
            )
        elif _newer_or_same(row, old):
            counts["replaced"] += 1
            merged[row.cell_id] = row
        else:
            counts["kept_newer"] += 1
            merged[row.cell_id] = old
    absent = [cell for cell in current if cell not in merged]
    if not prune:
        merged.update({cell: current[cell] for cell in absent})
    # What is published names no host path (a traceback's frames, an interpreter), rendered pages included.
    published_rows_ = [
        Row.of(
            {
                **(row.values if isinstance(row, Row) else row),
                "excerpt": bounded_excerpt(scrub_host_paths(str(row.excerpt or ""))) or row.excerpt,
                "evidence": [scrub_host_paths(str(e)) for e in bounded_evidence(row.evidence or [])],
                "lock_file": _portable_path(row.lock_file),
            }
        )
        for row in merged.values()
    ]
    # A pre-flight failure's class is named again from its excerpt by today's signatures (stages/naming.py).
    published_rows_ = [Row.of(naming.renamed(row.values)) for row in published_rows_]
    ordered = tuple(sorted(published_rows_, key=lambda r: (str(r.env_id), str(r.mode), str(r.cell_id))))
    return Publication(
        rows=ordered,
        kept_absent=0 if prune else len(absent),
        pruned=len(absent) if prune else 0,
        **counts,
    )
