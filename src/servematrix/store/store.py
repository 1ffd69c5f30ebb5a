"""The result store: SQLite in WAL mode, one row per cell run, with provenance.

A row is written when a harness claims a cell (status `running`, with the harness's pid; the server's pid
and process group follow when it starts) and completed when the cell ends, so a harness killed mid-cell
leaves a row the next run can find: it kills the orphaned server group and runs the cell again. The
claim is also the cell's lock: a second harness on the same store skips a cell a live harness owns.
Finished rows are never rewritten by a later run; a new run adds rows.

Merging shards is all-or-nothing as far as the inputs go: every row of every input is checked first, then the
rows go in by transactions of a bounded size (a long merge must not hold a run's writes off), an upsert on
(run_id, cell_id) that only completes rows still running, hence idempotent: a merge killed midway is
completed by running it again. A write waits while another process holds the store, up to ten minutes.

Nothing secret is stored: argv, excerpts and evidence are redacted on their way in (written or merged).
A file that is not a servematrix store, a corrupt one, or one that cannot be written is an InputError.
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from servematrix.errors import InputError
from servematrix.formats.verdict import Verdict
from servematrix.store.rowschema import (
    COLUMN_TYPES,
    COLUMNS,
    PACKED_COLUMNS,
    PACKED_SCHEMA,
    REQUIRED_COLUMNS,
    SCHEMA,
    Row,
    decode_row,
    encode_row,
    row_error,
    stored_row_checked,
)
from servematrix.util import DEFAULT_WORKDIR

DEFAULT_STORE = DEFAULT_WORKDIR / "results.sqlite"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# started_at has one-second resolution and a process starts just before its row: allow for both.
_OWNER_START_SLACK_S = 2.0
_LOCK_WAIT_S = 30.0  # how long a harness waits for another that holds the store, per try
_WRITE_WAIT_S = 600.0  # how long a write keeps trying, in all
_MERGE_BATCH = 5000  # rows per transaction of a merge


@dataclass(frozen=True, kw_only=True)
class Claim:
    """The outcome of claiming a cell: ours to run, owned by another live harness, or already done."""

    claimed: bool
    owner_pid: int | None = None  # the live harness that runs this cell now
    unchanged: bool = False  # a final result with the same inputs exists


def harness_alive(row: Row, hostname: str) -> bool:
    """Whether the harness that wrote a running row is still running it (on this host, not a reused pid)."""
    if row.on_host.hostname not in (None, hostname):
        return False  # a row merged from another machine: its pids mean nothing here
    pid = row.harness_pid
    if not pid:
        return False
    try:
        created = psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True
    started = row.started_at
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
                    db.execute(f"ALTER TABLE cell_runs ADD COLUMN {name} {COLUMN_TYPES.get(name, 'TEXT')}")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        # Each try waits the connection's busy timeout; a write (a run's finished verdict above all) keeps trying
        # while another process holds the store, up to _WRITE_WAIT_S in all.
        deadline = time.monotonic() + _WRITE_WAIT_S
        while True:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                break
            except sqlite3.OperationalError as exc:
                if not ("locked" in str(exc) or "busy" in str(exc)) or time.monotonic() >= deadline:
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

    def claim(
        self,
        *,
        hostname: str,
        rerun: bool = False,
        since: str | None = None,
        counts: Callable[[Row], bool] | None = None,
        **values: Any,
    ) -> Claim:
        """Open a `running` row for this cell unless another live harness runs it, or it is already done.

        One transaction, so two harnesses on one store cannot both claim a cell. Without `rerun`, a final
        result with the same inputs means there is nothing to do; with it, only a final result another run
        started since `since` (this run's start) does. A final result `counts` refuses is no finished run.
        """
        row = Row.of({"status": "running", "started_at": now(), **values})
        with self._transaction() as db:
            for other in self._select_in(
                db, "WHERE cell_id = ? AND status = 'running' AND run_id != ?", (row.cell_id, row.run_id)
            ):
                if other.harness_pid != row.harness_pid and harness_alive(other, hostname):
                    return Claim(claimed=False, owner_pid=other.harness_pid)
            done = self._newest_finished(db, row.cell_id, str(row.inputs_hash))
            done_by_another = done is not None and since is not None and done.run_id != row.run_id
            if done is not None and counts is not None and not counts(done):
                done = None
            if (
                done is not None
                and _final(done)
                and (not rerun or (done_by_another and since is not None and (done.started_at or "") >= since))
            ):
                return Claim(claimed=False, unchanged=True)
            encoded = encode_row(row.values)
            db.execute(
                f"INSERT OR REPLACE INTO cell_runs ({', '.join(encoded)}) VALUES ({', '.join('?' for _ in encoded)})",
                tuple(encoded.values()),
            )
        return Claim(claimed=True)

    def update(self, run_id: str, cell_id: str, **values: Any) -> None:
        encoded = encode_row(values)
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
        encoded = encode_row(values)
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

    def undecided(self, cell_id: str, inputs_hash: str, *, before_run: str) -> Row | None:
        """The newest row of this cell with these inputs from an earlier run, when that run did not decide it (it
        was stopped, or its harness died): the server starts it finished may be resumed."""
        rows = self._select(
            "WHERE cell_id = ? AND inputs_hash = ? AND run_id != ? ORDER BY started_at DESC, rowid DESC LIMIT 1",
            (cell_id, inputs_hash, before_run),
        )
        return rows[0] if rows and not _final(rows[0]) else None

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
            values = decode_row(stored)
        except ValueError as exc:
            raise InputError(f"{self.path}: row {stored.get('run_id')}/{stored.get('cell_id')}: {exc}") from None
        error = row_error(self.path, values)
        if error is not None:
            raise error
        return Row.of(values)

    def merge(self, inputs: Sequence[Path]) -> list[int]:
        """Copy the rows of every input: all of them, or (on any error in any input) none.

        Every input is checked before anything is written. A row merged while its cell still ran is
        completed by a later merge; a finished row is never rewritten. Returns the rows each input added
        or completed.
        """
        return self._merge_checked(check_merge_inputs(self.path, inputs))

    def _merge_checked(self, checked: Sequence[tuple[Path, list[str]]]) -> list[int]:
        """Every input's rows are read and checked into a staging file first: an error there writes nothing.
        Then they go in `_MERGE_BATCH` rows per transaction, so a long merge holds the write lock a moment at a
        time, and a run writing beside it waits no more than one batch (one transaction for 300k rows held it
        85 s, and the run lost its verdict). A merge killed between batches leaves some rows in; merging again
        completes it (rows are keyed by run and cell)."""
        names = ", ".join(COLUMNS)
        updates = ", ".join(f"{c} = excluded.{c}" for c in COLUMNS if c not in ("run_id", "cell_id"))
        upsert = (
            f"INSERT INTO cell_runs ({names}) SELECT {names} FROM staged.cell_runs WHERE rowid > ? AND rowid <= ?"
            f" ON CONFLICT (run_id, cell_id) DO UPDATE SET {updates}"
            " WHERE cell_runs.status = 'running' AND excluded.status = 'finished'"
        )
        added: list[int] = []
        self.merge_kept = []
        with tempfile.TemporaryDirectory(prefix=".servematrix-merge-", dir=self.path.parent) as folder:
            staged = [
                _stage(source, columns, Path(folder) / f"{i}.sqlite") for i, (source, columns) in enumerate(checked)
            ]
            for path, count in staged:
                self._db.execute("ATTACH DATABASE ? AS staged", (str(path),))
                changed = 0
                try:
                    for first in range(0, count, _MERGE_BATCH):
                        with self._transaction() as db:
                            before = db.total_changes
                            db.execute(upsert, (first, first + _MERGE_BATCH))
                            changed += db.total_changes - before
                finally:
                    self._db.execute("DETACH DATABASE staged")
                added.append(changed)
                self.merge_kept.append(count - changed)
        return added


def _stage(source: Path, columns: Sequence[str], path: Path) -> tuple[Path, int]:
    """The rows of `source`, checked and redacted (`stored_row_checked`), in a staging store at `path`, in order
    (rowid 1..count); the count."""
    names = ", ".join(COLUMNS)
    insert = f"INSERT INTO cell_runs ({names}) VALUES ({', '.join('?' for _ in COLUMNS)})"
    writer = sqlite3.connect(path, isolation_level=None)
    reader = _open_read_only(source)
    count = 0
    try:
        writer.executescript(SCHEMA)
        writer.execute("BEGIN")
        picked = ", ".join(c if c in columns else "NULL" for c in COLUMNS)
        for r in reader.execute(f"SELECT {picked} FROM cell_runs"):
            writer.execute(insert, stored_row_checked(source, dict(zip(COLUMNS, r, strict=True))))
            count += 1
        writer.execute("COMMIT")
    except sqlite3.DatabaseError as exc:
        raise _store_error(source, exc) from None
    except ValueError as exc:  # a JSON column that does not parse
        raise InputError(f"{source}: the store is corrupt (a row does not parse: {exc})") from None
    finally:
        reader.close()
        writer.close()
    return path, count


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
            f"{path}: the store is locked by another process (waited {max(_LOCK_WAIT_S, _WRITE_WAIT_S):.0f} s); "
            "try again when it is done"
        )
    if "unable to open" in text:
        return InputError(f"{path}: cannot open the store ({text}; is its directory read-only?)")
    return InputError(f"{path}: cannot use the store ({text})")


def _final(row: Row) -> bool:
    return bool(row.verdict) and Verdict.parse(str(row.verdict)).final
