"""The result store: SQLite in WAL mode, one row per cell run, with provenance.

A row is written when a harness claims a cell (status `running`, with the harness's pid; the server's pid
and process group follow when it starts) and completed when the cell ends, so a harness killed mid-cell
leaves a row the next run can find: it kills the orphaned server group and runs the cell again. The
claim is also the cell's lock: a second harness on the same store skips a cell a live harness owns.
Finished rows are never rewritten by a later run; a new run adds rows.

Merging shards is all-or-nothing: every input is checked first, then all rows go in one transaction, an
upsert on (run_id, cell_id) that only completes rows still running, hence idempotent.

Nothing secret is stored: argv, excerpts and evidence are redacted on their way in (written or merged).
A file that is not a servematrix store, a corrupt one, or one that cannot be written is an InputError.
"""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from servematrix import redact
from servematrix.errors import InputError
from servematrix.util import DEFAULT_WORKDIR
from servematrix.verdict import Verdict

DEFAULT_STORE = DEFAULT_WORKDIR / "results.sqlite"

SCHEMA = """
CREATE TABLE IF NOT EXISTS cell_runs (
    run_id        TEXT NOT NULL,
    cell_id       TEXT NOT NULL,
    env_id        TEXT NOT NULL,
    engine        TEXT NOT NULL,
    mode          TEXT NOT NULL,
    matrix        TEXT NOT NULL,
    axes          TEXT NOT NULL,   -- JSON
    inputs_hash   TEXT NOT NULL,   -- cell id + workload + model: unchanged inputs are not run again
    status        TEXT NOT NULL,   -- running | finished
    verdict       TEXT,
    excerpt       TEXT,
    evidence      TEXT,            -- JSON list
    metrics       TEXT,            -- JSON (benchmark report)
    argv          TEXT,            -- JSON list: the exact server argv that ran, secret values masked as ***
    redacted_flags TEXT,           -- JSON list: the secret flags whose values argv shows as ***
    lock_hash     TEXT,
    lock_file     TEXT,
    crossed_pins  TEXT,            -- JSON
    image_digest  TEXT,
    backend       TEXT,            -- the backend it ran on (its --backend name), for the reproduce command
    host          TEXT,            -- JSON: hostname, CPU model, GPU SKU, driver
    harness_pid   INTEGER,         -- the servematrix process that owns a running row
    server_pid    INTEGER,
    server_pgid   INTEGER,
    log_path      TEXT,
    stages        TEXT,            -- JSON: stage -> seconds
    preflight_hash TEXT,           -- the inputs of its CPU pre-flight verdict (reuse.py)
    started_at    TEXT NOT NULL,
    finished_at   TEXT,
    PRIMARY KEY (run_id, cell_id)
);
CREATE INDEX IF NOT EXISTS cell_runs_by_cell ON cell_runs (cell_id, status);
"""
# The jobs of a packed run (packing.py): an environment's cells on a set of GPUs, from when to when. The report
# states the run's makespan against its lower bound from them. Not merged: they describe one host's run.
PACKED_SCHEMA = """
CREATE TABLE IF NOT EXISTS packed_jobs (
    run_id      TEXT NOT NULL,
    env_id      TEXT NOT NULL,
    host_gpus   INTEGER NOT NULL,  -- the GPUs the run packed onto
    gpus        TEXT NOT NULL,     -- JSON list: this job's GPUs
    cpus        TEXT NOT NULL,     -- JSON list: this job's CPUs
    cells       INTEGER NOT NULL,
    estimate_s  REAL,              -- what the schedule expected it to take
    start_s     REAL NOT NULL,     -- seconds since the pack began
    end_s       REAL,              -- NULL while it runs
    PRIMARY KEY (run_id, env_id)
);
"""
PACKED_COLUMNS = ("run_id", "env_id", "host_gpus", "gpus", "cpus", "cells", "estimate_s", "start_s", "end_s")

COLUMNS = (
    "run_id",
    "cell_id",
    "env_id",
    "engine",
    "mode",
    "matrix",
    "axes",
    "inputs_hash",
    "status",
    "verdict",
    "excerpt",
    "evidence",
    "metrics",
    "argv",
    "redacted_flags",
    "lock_hash",
    "lock_file",
    "crossed_pins",
    "image_digest",
    "backend",
    "host",
    "harness_pid",
    "server_pid",
    "server_pgid",
    "log_path",
    "stages",
    "preflight_hash",
    "started_at",
    "finished_at",
)
JSON_COLUMNS = frozenset({"axes", "evidence", "metrics", "argv", "redacted_flags", "crossed_pins", "host", "stages"})


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# Columns a row cannot be read without: an input missing one of them is not a servematrix store.
REQUIRED_COLUMNS = ("run_id", "cell_id", "env_id", "engine", "mode", "matrix", "axes", "inputs_hash", "status")
_COLUMN_TYPES = dict(re.findall(r"^\s+(\w+)\s+(TEXT|INTEGER)", SCHEMA, re.MULTILINE))
# started_at has one-second resolution and a process starts just before its row: allow for both.
_OWNER_START_SLACK_S = 2.0
_LOCK_WAIT_S = 30.0  # how long a harness waits for another that holds the store


# Identifiers a row carries (run, cell and environment ids, the mode, axis names and values such as GPU kinds
# and versions): what a matrix file allows (spec.NAME), plus `!` for a version's epoch. A row from a merged
# store or a published record is refused at its row when one is anything else: these land in pages,
# anchors and file names.
ROW_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+!-]*")
# The matrix column is the matrix file's path as the run named it.
_MATRIX_PATH = re.compile(r"[A-Za-z0-9._+@,~/ ()-]+")
_NAMES = ("run_id", "cell_id", "env_id", "mode")
_TEXTS = (
    *("engine", "matrix", "inputs_hash", "status", "verdict", "excerpt", "lock_hash", "lock_file"),
    *("image_digest", "backend", "log_path", "started_at", "finished_at"),
)
_INTEGERS = ("harness_pid", "server_pid", "server_pgid")
_HOST_TEXTS = ("hostname", "cpu", "os", "gpu_sku", "driver")


def row_problem(values: Mapping[str, Any]) -> str | None:
    """What makes decoded row values unfit for the store schema, or None. Only the columns present are
    checked (a published record keeps a subset); a NULL where the report needs a name is a problem."""
    for key in (*_NAMES, "engine", "matrix", "axes"):
        if key in values and values[key] is None:
            return f"{key} is empty"
    for key in _TEXTS:
        if values.get(key) is not None and not isinstance(values[key], str):
            return f"{key} is {_kind(values[key])}, not text"
    for key in _NAMES:
        if key in values and not ROW_NAME.fullmatch(str(values[key])):
            return f"{key} {str(values[key])[:80]!r} has characters outside letters, digits and . _ + - !"
    if "matrix" in values and not _MATRIX_PATH.fullmatch(values["matrix"]):
        return f"matrix {values['matrix'][:80]!r} is not a matrix file path"
    if values.get("status", "finished") == "finished" and "verdict" in values and not values["verdict"]:
        return "finished without a verdict"
    if values.get("status") not in (None, "running", "finished"):
        return f"status {values['status']!r} is neither running nor finished"
    for key in _INTEGERS:
        if values.get(key) is not None and not _is_int(values[key]):
            return f"{key} is {_kind(values[key])}, not an integer"
    axes = values.get("axes", {})
    if not isinstance(axes, dict):
        return f"axes is {_kind(axes)}, not a table"
    for axis, value in axes.items():
        if not ROW_NAME.fullmatch(axis) or not isinstance(value, str) or not ROW_NAME.fullmatch(value):
            return f"axis {axis[:80]!r} = {str(value)[:80]!r} has characters outside letters, digits and . _ + - !"
    for key in ("evidence", "argv", "redacted_flags"):
        items = values.get(key)
        if items is not None and (not isinstance(items, list) or not all(isinstance(i, str) for i in items)):
            return f"{key} is {_kind(items)}, not a list of text"
    for key in ("metrics", "crossed_pins", "host", "stages"):
        if values.get(key) is not None and not isinstance(values[key], dict):
            return f"{key} is {_kind(values[key])}, not a table"
    host = values.get("host") or {}
    for key in _HOST_TEXTS:
        if host.get(key) is not None and not isinstance(host[key], str):
            return f"host.{key} is {_kind(host[key])}, not text"
    if host.get("gpus") is not None and not isinstance(host["gpus"], list):
        return f"host.gpus is {_kind(host['gpus'])}, not a list"
    return _metrics_problem(values.get("metrics"))


def _metrics_problem(metrics: Mapping[str, Any] | None) -> str | None:
    """Figures the report reads: non-negative, finite, of the right type (no absurd figure is published)."""
    if not metrics:
        return None
    for key in ("completion_tokens", "error_count"):
        if metrics.get(key) is not None and not (_is_int(metrics[key]) and metrics[key] >= 0):
            return f"metrics.{key} is {metrics[key]!r}, not a count"
    levels = metrics.get("levels", [])
    if not isinstance(levels, list) or not all(isinstance(lv, dict) for lv in levels):
        return "metrics.levels is not a list of tables"
    for level in levels:
        if not (_is_int(level.get("concurrency")) and level["concurrency"] > 0):
            return f"metrics level concurrency {level.get('concurrency')!r} is not a positive integer"
        for key in ("completion_tokens", "error_count"):
            if level.get(key) is not None and not (_is_int(level[key]) and level[key] >= 0):
                return f"metrics level {level['concurrency']}: {key} is {level[key]!r}, not a count"
        for key in ("output_tok_s", "request_s"):
            spread = level.get(key)
            if spread is None:
                continue
            if not isinstance(spread, dict):
                return f"metrics level {level['concurrency']}: {key} is {_kind(spread)}, not a table"
            for stat, figure in spread.items():
                if figure is not None and not (_is_number(figure) and 0 <= figure < _ABSURD):
                    return f"metrics level {level['concurrency']}: {key}.{stat} is {figure!r}, not a rate"
        runs = level.get("runs", [])
        if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
            return f"metrics level {level['concurrency']}: runs is not a list of tables"
        for run in runs:
            figure = run.get("output_tok_s")
            if figure is not None and not (_is_number(figure) and 0 <= figure < _ABSURD):
                return f"metrics level {level['concurrency']}: a run's output_tok_s is {figure!r}, not a rate"
    return None


# No server measured here emits 10^9 tokens or requests a second: a figure at or above it is a corrupt row.
_ABSURD = 1e9


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _kind(value: Any) -> str:
    return {dict: "a table", list: "a list", str: "text", bool: "a boolean", type(None): "empty"}.get(
        type(value), f"a {type(value).__name__}"
    )


def row_error(where: Path | str, values: Mapping[str, Any]) -> InputError | None:
    """An InputError naming `where` and the row when the row is unfit, else None."""
    problem = row_problem(values)
    if problem is None:
        return None
    return InputError(f"{where}: row {values.get('run_id')!s:.40}/{values.get('cell_id')!s:.40}: {problem}")


@dataclass(frozen=True, kw_only=True)
class Row:
    values: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


@dataclass(frozen=True, kw_only=True)
class Claim:
    """The outcome of claiming a cell: ours to run, owned by another live harness, or already done."""

    claimed: bool
    owner_pid: int | None = None  # the live harness that runs this cell now
    unchanged: bool = False  # a final result with the same inputs exists


def harness_alive(row: Row | Mapping[str, Any], hostname: str) -> bool:
    """Whether the harness that wrote a running row is still running it (on this host, not a reused pid)."""
    host = row.get("host") or {}
    if host.get("hostname") not in (None, hostname):
        return False  # a row merged from another machine: its pids mean nothing here
    pid = row.get("harness_pid")
    if not pid:
        return False
    try:
        created = psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True
    started = row.get("started_at")
    try:
        stamp = datetime.fromisoformat(started).timestamp() if started else None
    except ValueError:
        stamp = None
    return stamp is None or created <= stamp + _OWNER_START_SLACK_S


class Store:
    def __init__(self, path: Path | str, *, read_only: bool = False) -> None:
        """`read_only` (the report): the store is read as it is, never converted, altered or written; columns
        an older store lacks read as NULL."""
        self.path = Path(path)
        # After a merge, per input: its rows whose (run, cell) the target already held finished (or an earlier
        # input brought), kept as they were.
        self.merge_kept: list[int] = []
        self._picked = ", ".join(COLUMNS)  # the select list: every column, NULL for those a store lacks
        if read_only:
            self._open_for_reading()
            return
        if self.path.is_dir():
            raise InputError(f"{self.path}: is a directory, not a servematrix store")
        if self.path.exists() and not self.path.is_file():  # /dev/full: SQLite would create /dev/full-journal
            raise InputError(f"{self.path}: is a device, pipe or socket, not a servematrix store")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"{self.path}: cannot create the store's directory: {exc.strerror}") from None
        try:
            self._db = sqlite3.connect(self.path, timeout=_LOCK_WAIT_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise _store_error(self.path, exc) from None
        try:
            self._open()
        except sqlite3.Error as exc:
            self._db.close()
            raise _store_error(self.path, exc) from None
        except InputError:
            self._db.close()
            raise

    def _open_for_reading(self) -> None:
        columns = check_store_file(self.path)
        try:
            self._db = _open_read_only(self.path)
        except sqlite3.Error as exc:
            raise _store_error(self.path, exc) from None
        self._picked = ", ".join(c if c in columns else f"NULL AS {c}" for c in COLUMNS)

    def _open(self) -> None:
        tables = _tables(self._db)
        if tables and "cell_runs" not in tables:
            raise InputError(
                f"{self.path}: not a servematrix store (a SQLite database without a cell_runs table: "
                f"{', '.join(sorted(tables)[:5])})"
            )
        if not os.access(self.path, os.W_OK) or not os.access(self.path.parent, os.W_OK):
            raise InputError(f"{self.path}: the store is read-only (servematrix writes to it and beside it)")
        self._use_wal()
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA + PACKED_SCHEMA)
        self._add_missing_columns()

    def _use_wal(self) -> None:
        """Switch the store to WAL, waiting for other harnesses that open it at the same moment.

        SQLite answers a journal-mode change that meets another connection with "database is locked" at
        once, without calling the busy handler, so the connect timeout does not cover it: retry here.
        """
        deadline = time.monotonic() + _LOCK_WAIT_S
        while True:
            try:
                if self._db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def _add_missing_columns(self) -> None:
        """A store written by an older servematrix gets the newer columns (NULL in its old rows)."""
        if not set(COLUMNS) - set(_columns(self._db, "main")):
            return
        with self._transaction() as db:
            for name in COLUMNS:
                if name not in _columns(db, "main"):
                    db.execute(f"ALTER TABLE cell_runs ADD COLUMN {name} {_COLUMN_TYPES.get(name, 'TEXT')}")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise _store_error(self.path, exc) from None
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def start(self, **values: Any) -> None:
        row = {"status": "running", "started_at": now(), **values}
        self._write("INSERT OR REPLACE", row)

    def claim(self, *, hostname: str, rerun: bool = False, since: str | None = None, **values: Any) -> Claim:
        """Open a `running` row for this cell unless another live harness runs it, or it is already done.

        One transaction, so two harnesses on one store cannot both claim a cell. Without `rerun`, a final
        result with the same inputs means there is nothing to do; with it, only a final result another run
        started since `since` (this run's start) does.
        """
        row = {"status": "running", "started_at": now(), **values}
        with self._transaction() as db:
            for other in self._select_in(
                db, "WHERE cell_id = ? AND status = 'running' AND run_id != ?", (row["cell_id"], row["run_id"])
            ):
                if other.get("harness_pid") != row.get("harness_pid") and harness_alive(other, hostname):
                    return Claim(claimed=False, owner_pid=other["harness_pid"])
            done = self._newest_finished(db, row["cell_id"], row["inputs_hash"])
            done_by_another = done is not None and since is not None and done["run_id"] != row["run_id"]
            if done is not None and _final(done) and (not rerun or (done_by_another and done["started_at"] >= since)):
                return Claim(claimed=False, unchanged=True)
            encoded = _encode(row)
            db.execute(
                f"INSERT OR REPLACE INTO cell_runs ({', '.join(encoded)}) VALUES ({', '.join('?' for _ in encoded)})",
                tuple(encoded.values()),
            )
        return Claim(claimed=True)

    def update(self, run_id: str, cell_id: str, **values: Any) -> None:
        encoded = _encode(values)
        assignments = ", ".join(f"{k} = ?" for k in encoded)
        with self._transaction() as db:
            db.execute(
                f"UPDATE cell_runs SET {assignments} WHERE run_id = ? AND cell_id = ?",
                (*encoded.values(), run_id, cell_id),
            )

    def finish(self, run_id: str, cell_id: str, **values: Any) -> None:
        self.update(run_id, cell_id, status="finished", finished_at=now(), **values)

    def record(self, **values: Any) -> None:
        """A cell decided without running anything (skipped, unresolvable, predicted-fail only)."""
        stamp = now()
        self._write("INSERT OR REPLACE", {"status": "finished", "started_at": stamp, "finished_at": stamp, **values})

    def _write(self, verb: str, values: Mapping[str, Any]) -> None:
        encoded = _encode(values)
        names = ", ".join(encoded)
        marks = ", ".join("?" for _ in encoded)
        with self._transaction() as db:
            db.execute(f"{verb} INTO cell_runs ({names}) VALUES ({marks})", tuple(encoded.values()))

    def finished(self, cell_id: str, inputs_hash: str) -> Row | None:
        """The newest finished run of this cell with these inputs, if its verdict is final.

        Only the newest counts: a harness fault (`error:…`) or an interruption after a pass means the
        cell runs again, not that the older pass still stands.
        """
        done = self._newest_finished(self._db, cell_id, inputs_hash)
        return done if done is not None and _final(done) else None

    def _newest_finished(self, db: sqlite3.Connection, cell_id: str, inputs_hash: str) -> Row | None:
        rows = self._select_in(
            db,
            "WHERE cell_id = ? AND inputs_hash = ? AND status = 'finished' ORDER BY finished_at DESC, rowid DESC LIMIT 1",
            (cell_id, inputs_hash),
        )
        return rows[0] if rows else None

    def record_packed_job(self, **values: Any) -> None:
        """A job of a packed run, written when it starts and again when it ends (`PACKED_SCHEMA`)."""
        encoded = {k: json.dumps(list(v)) if k in ("gpus", "cpus") else v for k, v in values.items()}
        names = ", ".join(encoded)
        with self._transaction() as db:
            db.execute(
                f"INSERT OR REPLACE INTO packed_jobs ({names}) VALUES ({', '.join('?' for _ in encoded)})",
                tuple(encoded.values()),
            )

    def packed_jobs(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """The jobs of every packed run (or of one), in the order they started; none in a store that never
        packed (or one written before packing existed)."""
        if "packed_jobs" not in _tables(self._db):
            return []
        where, params = ("WHERE run_id = ?", (run_id,)) if run_id is not None else ("", ())
        cursor = self._db.execute(
            f"SELECT {', '.join(PACKED_COLUMNS)} FROM packed_jobs {where} ORDER BY run_id, start_s", params
        )
        jobs = [dict(zip(PACKED_COLUMNS, row, strict=True)) for row in cursor.fetchall()]
        for job in jobs:
            job["gpus"], job["cpus"] = json.loads(job["gpus"]), json.loads(job["cpus"])
        return jobs

    def running(self) -> list[Row]:
        """Rows left `running` by a harness that died: their server groups may still be alive."""
        return self._select("WHERE status = 'running'", ())

    def latest(self) -> list[Row]:
        """The newest finished row of every cell, for the report.

        One pass: rows numbered per cell, newest first (a window function, one sort), and only each cell's
        first decoded. A subquery per row made this quadratic in a cell's history (58 s for 200k rows)."""
        names = ", ".join(COLUMNS)
        cursor = self._db.execute(
            f"SELECT {names} FROM (SELECT {self._picked}, ROW_NUMBER() OVER ("
            " PARTITION BY cell_id ORDER BY finished_at DESC, rowid DESC) AS newest"
            " FROM cell_runs WHERE status = 'finished') WHERE newest = 1 ORDER BY env_id, mode"
        )
        return [self._checked(dict(zip(COLUMNS, r, strict=True))) for r in cursor.fetchall()]

    def all_rows(self) -> list[Row]:
        return self._select("ORDER BY started_at, rowid", ())

    def _select(self, where: str, params: tuple[Any, ...]) -> list[Row]:
        return self._select_in(self._db, where, params)

    def _select_in(self, db: sqlite3.Connection, where: str, params: tuple[Any, ...]) -> list[Row]:
        cursor = db.execute(f"SELECT {self._picked} FROM cell_runs {where}", params)
        return [self._checked(dict(zip(COLUMNS, r, strict=True))) for r in cursor.fetchall()]

    def _checked(self, stored: dict[str, Any]) -> Row:
        """A stored row decoded; an InputError naming the store and the row when it does not fit the schema."""
        try:
            values = _decode(stored)
        except ValueError as exc:
            raise InputError(f"{self.path}: row {stored.get('run_id')}/{stored.get('cell_id')}: {exc}") from None
        error = row_error(self.path, values)
        if error is not None:
            raise error
        return Row(values=values)

    def merge(self, inputs: Sequence[Path]) -> list[int]:
        """Copy the rows of every input in one transaction: all of them, or (on any error) none.

        Every input is checked before anything is written. A row merged while its cell still ran is
        completed by a later merge; a finished row is never rewritten. Returns the rows each input added
        or completed.
        """
        return self._merge_checked(check_merge_inputs(self.path, inputs))

    def _merge_checked(self, checked: Sequence[tuple[Path, list[str]]]) -> list[int]:
        names = ", ".join(COLUMNS)
        marks = ", ".join("?" for _ in COLUMNS)
        updates = ", ".join(f"{c} = excluded.{c}" for c in COLUMNS if c not in ("run_id", "cell_id"))
        upsert = (
            f"INSERT INTO cell_runs ({names}) VALUES ({marks}) ON CONFLICT (run_id, cell_id) DO UPDATE SET {updates}"
            " WHERE cell_runs.status = 'running' AND excluded.status = 'finished'"
        )
        added: list[int] = []
        self.merge_kept = []
        with self._transaction() as db:
            for source, columns in checked:
                before = db.total_changes
                reader = _open_read_only(source)
                read = 0
                try:
                    picked = ", ".join(c if c in columns else "NULL" for c in COLUMNS)
                    rows = reader.execute(f"SELECT {picked} FROM cell_runs")
                    for r in rows:
                        db.execute(upsert, _redact_stored(source, dict(zip(COLUMNS, r, strict=True))))
                        read += 1
                except sqlite3.DatabaseError as exc:
                    raise _store_error(source, exc) from None
                except ValueError as exc:  # a JSON column that does not parse
                    raise InputError(f"{source}: the store is corrupt (a row does not parse: {exc})") from None
                finally:
                    reader.close()
                added.append(db.total_changes - before)
                self.merge_kept.append(read - added[-1])
        return added


def merge_stores(target: Path, inputs: Sequence[Path], kept: list[int] | None = None) -> list[int]:
    """`servematrix merge`: the inputs are all checked before the target is opened or created, and a
    target this merge created is removed again if the merge fails. `kept` receives `Store.merge_kept`."""
    checked = check_merge_inputs(target, inputs)
    created = not target.exists()
    try:
        with Store(target) as store:
            added = store._merge_checked(checked)
            if kept is not None:
                kept[:] = store.merge_kept
            return added
    except BaseException:
        if created:
            for leftover in (target, target.with_name(target.name + "-wal"), target.with_name(target.name + "-shm")):
                leftover.unlink(missing_ok=True)
        raise


def check_merge_inputs(target: Path, inputs: Sequence[Path]) -> list[tuple[Path, list[str]]]:
    for source in inputs:
        if _same_file(source, target):
            raise InputError(f"{source}: is also the merge target; merge into another file")
    return [(source, check_store_file(source)) for source in inputs]


def check_store_file(path: Path) -> list[str]:
    """The columns of a store that can be merged; InputError naming the file if it is not one."""
    if not path.is_file():
        raise InputError(f"{path}: no such store")
    if path.stat().st_size == 0:
        raise InputError(f"{path}: not a servematrix store (empty file)")
    try:
        reader = _open_read_only(path)
    except sqlite3.Error as exc:
        raise _store_error(path, exc) from None
    try:
        if "cell_runs" not in _tables(reader):
            raise InputError(f"{path}: not a servematrix store (no cell_runs table)")
        columns = _columns(reader, "main")
        missing = [c for c in REQUIRED_COLUMNS if c not in columns]
        if missing:
            raise InputError(f"{path}: not a servematrix store (cell_runs lacks {', '.join(missing)})")
        unknown = [c for c in columns if c not in COLUMNS]
        if unknown:  # a newer schema: merging would drop these columns
            raise InputError(
                f"{path}: written by a newer servematrix (columns {', '.join(unknown[:5])} are unknown here); "
                "merge it with that version"
            )
        problems = [r[0] for r in reader.execute("PRAGMA quick_check").fetchall()]
        if problems != ["ok"]:
            raise InputError(f"{path}: the store is corrupt ({'; '.join(problems[:3])})")
    except sqlite3.DatabaseError as exc:
        raise _store_error(path, exc) from None
    finally:
        reader.close()
    return columns


def _open_read_only(path: Path) -> sqlite3.Connection:
    uri = path.resolve().as_uri()
    reader = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=30)
    try:
        reader.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return reader
    except sqlite3.OperationalError:
        # A WAL store on a path this user cannot write (an artifact, a read-only mount) cannot even be read
        # the usual way: SQLite wants its -shm beside it. With no unmerged -wal, the file alone is the store.
        reader.close()
        wal = path.with_name(path.name + "-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise
        return sqlite3.connect(f"{uri}?immutable=1", uri=True, timeout=30)


def _tables(db: sqlite3.Connection) -> set[str]:
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _columns(db: sqlite3.Connection, schema: str) -> list[str]:
    return [r[1] for r in db.execute(f"PRAGMA {schema}.table_info(cell_runs)")]


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def _store_error(path: Path, exc: sqlite3.Error) -> InputError:
    text = str(exc)
    if "not a database" in text:
        return InputError(f"{path}: not a servematrix store (file is not a database)")
    if "malformed" in text or "corrupt" in text:
        return InputError(f"{path}: the store is corrupt ({text})")
    if "readonly" in text or "read-only" in text:
        return InputError(f"{path}: the store is read-only ({text})")
    if "locked" in text or "busy" in text:
        return InputError(
            f"{path}: the store is locked by another process (waited {_LOCK_WAIT_S:.0f} s); try again when it is done"
        )
    if "unable to open" in text:
        return InputError(f"{path}: cannot open the store ({text}; is its directory read-only?)")
    return InputError(f"{path}: cannot use the store ({text})")


def _final(row: Row) -> bool:
    text = row.get("verdict")
    return bool(text) and Verdict.parse(text).final


def _engine_secret_flags() -> frozenset[str]:
    """Every engine's secret flags, read from engine data alone (no hooks module is imported): what the store
    masks in argv even if a caller did not."""
    from servematrix.engines import secret_flags

    return secret_flags()


def _redact_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """Decoded row values with argv, excerpt and evidence redacted (idempotent)."""
    out = dict(values)
    if out.get("argv") is not None:
        flags = _engine_secret_flags() | frozenset(out.get("redacted_flags") or ())
        out["argv"] = redact.redact_argv(out["argv"], flags)
    if out.get("excerpt"):
        out["excerpt"] = redact.redact(out["excerpt"], env={})
    if out.get("evidence"):
        out["evidence"] = [redact.redact(e, env={}) if isinstance(e, str) else e for e in out["evidence"]]
    return out


def _redact_stored(source: Path, encoded: dict[str, Any]) -> tuple[Any, ...]:
    """A row as another store holds it (JSON text), checked against the schema and redacted, in COLUMNS
    order: for merges."""
    try:
        decoded = _decode(encoded)
    except ValueError as exc:
        raise InputError(f"{source}: row {encoded.get('run_id')}/{encoded.get('cell_id')}: {exc}") from None
    error = row_error(source, decoded)
    if error is not None:
        raise error
    if encoded["argv"] is None and not encoded["excerpt"] and encoded["evidence"] in (None, "[]"):
        return tuple(encoded[c] for c in COLUMNS)
    redacted = _encode(decoded)
    return tuple(redacted[c] for c in COLUMNS)


def _encode(values: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(values) - set(COLUMNS)
    if unknown:
        raise KeyError(f"unknown store columns: {sorted(unknown)}")
    values = _redact_values(values)
    return {k: _json(v) if k in JSON_COLUMNS and v is not None else v for k, v in values.items()}


def _json(value: Any) -> str:
    """JSON text, never NaN or Infinity (JSON has neither): a figure that is not finite was not measured, and
    is stored as null."""
    try:
        return json.dumps(value, sort_keys=True, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(value), sort_keys=True, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a row may hold")


def _decode(values: dict[str, Any]) -> dict[str, Any]:
    """JSON columns parsed; NaN and Infinity (which JSON does not have) are a ValueError."""
    return {k: _parse(k, v) if k in JSON_COLUMNS and v is not None else v for k, v in values.items()}


def _parse(column: str, text: Any) -> Any:
    if not isinstance(text, str):
        raise ValueError(f"{column} is a stored {type(text).__name__}, not JSON text")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        raise ValueError(f"{column}: {exc}") from None
