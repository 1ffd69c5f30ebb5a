"""The result store: SQLite in WAL mode, one row per cell run, with provenance.

A row is written when a cell starts (status `running`, with the server's pid and process group) and
completed when it ends, so a harness killed mid-cell leaves a row the next run can find: it kills the
orphaned server group and runs the cell again. Finished rows are never rewritten by a later run; a new
run adds rows. Merging shards is INSERT OR IGNORE on (run_id, cell_id), hence idempotent.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

DEFAULT_STORE = Path(".servematrix/results.sqlite")

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
    argv          TEXT,            -- JSON list: the exact server argv that ran
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
    started_at    TEXT NOT NULL,
    finished_at   TEXT,
    PRIMARY KEY (run_id, cell_id)
);
CREATE INDEX IF NOT EXISTS cell_runs_by_cell ON cell_runs (cell_id, status);
"""

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
    "started_at",
    "finished_at",
)
JSON_COLUMNS = frozenset({"axes", "evidence", "metrics", "argv", "crossed_pins", "host", "stages"})


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True, kw_only=True)
class Row:
    values: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


class Store:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        _add_missing_columns(self._db, "main")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def start(self, **values: Any) -> None:
        row = {"status": "running", "started_at": now(), **values}
        self._write("INSERT OR REPLACE", row)

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
        """The newest finished run of this cell with these inputs, if its verdict is final."""
        rows = self._select(
            "WHERE cell_id = ? AND inputs_hash = ? AND status = 'finished'"
            " AND verdict NOT LIKE 'error%' AND verdict != 'interrupted'"
            " ORDER BY finished_at DESC, rowid DESC LIMIT 1",
            (cell_id, inputs_hash),
        )
        return rows[0] if rows else None

    def running(self) -> list[Row]:
        """Rows left `running` by a harness that died: their server groups may still be alive."""
        return self._select("WHERE status = 'running'", ())

    def latest(self) -> list[Row]:
        """The newest finished row of every cell, for the report."""
        return self._select(
            "WHERE status = 'finished' AND rowid IN ("
            " SELECT rowid FROM cell_runs AS c WHERE c.status = 'finished' AND c.cell_id = cell_runs.cell_id"
            " ORDER BY c.finished_at DESC, c.rowid DESC LIMIT 1) ORDER BY env_id, mode",
            (),
        )

    def all_rows(self) -> list[Row]:
        return self._select("ORDER BY started_at, rowid", ())

    def _select(self, where: str, params: tuple[Any, ...]) -> list[Row]:
        cursor = self._db.execute(f"SELECT {', '.join(COLUMNS)} FROM cell_runs {where}", params)
        return [Row(values=_decode(dict(zip(COLUMNS, r, strict=True)))) for r in cursor.fetchall()]

    def merge_from(self, other: Path) -> int:
        """Copy rows of another store; rows already present (same run and cell) are kept as they are."""
        before = self._db.total_changes
        self._db.execute("ATTACH DATABASE ? AS other", (str(other),))
        try:
            with self._transaction() as db:
                names = ", ".join(COLUMNS)
                updates = ", ".join(f"{c} = excluded.{c}" for c in COLUMNS if c not in ("run_id", "cell_id"))
                # A row merged while its cell still ran is completed by a later merge; a finished row is
                # never rewritten. (`WHERE true` lets SQLite's parser accept the upsert after a SELECT.)
                db.execute(
                    f"INSERT INTO cell_runs ({names}) SELECT {_readable(db, 'other')} FROM other.cell_runs WHERE true"
                    f" ON CONFLICT (run_id, cell_id) DO UPDATE SET {updates}"
                    " WHERE cell_runs.status = 'running' AND excluded.status = 'finished'"
                )
        finally:
            self._db.execute("DETACH DATABASE other")
        return self._db.total_changes - before


# Columns added after the first release, with their type: an older store gets them on open, and an older
# shard merges with NULL in them.
ADDED_COLUMNS = {"backend": "TEXT"}


def _present(db: sqlite3.Connection, schema: str) -> set[str]:
    return {r[1] for r in db.execute(f"PRAGMA {schema}.table_info(cell_runs)")}


def _add_missing_columns(db: sqlite3.Connection, schema: str) -> None:
    for name, kind in ADDED_COLUMNS.items():
        if name not in _present(db, schema):
            db.execute(f"ALTER TABLE {schema}.cell_runs ADD COLUMN {name} {kind}")


def _readable(db: sqlite3.Connection, schema: str) -> str:
    """COLUMNS as a select list over `schema`'s cell_runs, NULL for a column an older store lacks."""
    present = _present(db, schema)
    return ", ".join(c if c in present else f"NULL AS {c}" for c in COLUMNS)


def _encode(values: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(values) - set(COLUMNS)
    if unknown:
        raise KeyError(f"unknown store columns: {sorted(unknown)}")
    return {k: json.dumps(v, sort_keys=True) if k in JSON_COLUMNS and v is not None else v for k, v in values.items()}


def _decode(values: dict[str, Any]) -> dict[str, Any]:
    return {k: json.loads(v) if k in JSON_COLUMNS and v is not None else v for k, v in values.items()}
