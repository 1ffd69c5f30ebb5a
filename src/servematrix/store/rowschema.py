"""What a stored row is: the store's columns, the checks a row read from elsewhere must pass (a merged store,
a published record), and its encoding as SQLite text (JSON columns, secrets redacted on the way in).

The store (`store`) owns the database: claims, writes, merges. This module owns the row, so a reader of rows
(the published record) needs no database.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from servematrix.errors import InputError

# The row and its columns are named once, in records/row.py; re-exported for the store's readers.
from servematrix.records.row import COLUMNS as COLUMNS
from servematrix.records.row import JSON_COLUMNS as JSON_COLUMNS
from servematrix.records.row import Row as Row
from servematrix.store import redact

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
    preflight     TEXT,            -- JSON: pre-flight stage -> its key, outcome, verdict, evidence (reuse.py)
    prediction    TEXT,            -- a served cell's own CPU pre-flight verdict, beside what it observed
    started_at    TEXT NOT NULL,
    finished_at   TEXT,
    PRIMARY KEY (run_id, cell_id)
);
CREATE INDEX IF NOT EXISTS cell_runs_by_cell ON cell_runs (cell_id, status);
"""
# The jobs of a packed run (run/packing.py): an environment's cells on a set of GPUs, from when to when. The report
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

# Columns a row cannot be read without: an input missing one of them is not a servematrix store.
REQUIRED_COLUMNS = ("run_id", "cell_id", "env_id", "engine", "mode", "matrix", "axes", "inputs_hash", "status")
COLUMN_TYPES = dict(re.findall(r"^\s+(\w+)\s+(TEXT|INTEGER)", SCHEMA, re.MULTILINE))


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
    *("image_digest", "backend", "log_path", "started_at", "finished_at", "prediction"),
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
    for key in ("metrics", "crossed_pins", "host", "stages", "preflight"):
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
        out["excerpt"] = redact.bounded_excerpt(redact.redact(out["excerpt"], env={}))
    if out.get("evidence"):
        evidence = redact.bounded_evidence(out["evidence"])
        out["evidence"] = [redact.redact(e, env={}) if isinstance(e, str) else e for e in evidence]
    return out


def stored_row_checked(source: Path, encoded: dict[str, Any]) -> tuple[Any, ...]:
    """A row as another store holds it (JSON text), checked against the schema and redacted, in COLUMNS
    order: for merges."""
    try:
        decoded = decode_row(encoded)
    except ValueError as exc:
        raise InputError(f"{source}: row {encoded.get('run_id')}/{encoded.get('cell_id')}: {exc}") from None
    error = row_error(source, decoded)
    if error is not None:
        raise error
    where = f"{source}: row {decoded['run_id']}/{decoded['cell_id']}"
    for key in ("started_at", "finished_at"):
        if in_future(decoded.get(key)):
            raise InputError(f"{where}: {key} {decoded[key]} is in the future (a skewed clock?); not merged")
    if decoded.get("status") == "running":
        if not (decoded.get("host") or {}).get("hostname") or not decoded.get("argv"):
            raise InputError(f"{where}: running, with no host or no argv (a harness writes both); not merged")
        # Its pids name processes of the host it ran on, started by a harness that is not ours: never reaped.
        decoded = {**decoded, "server_pid": None, "server_pgid": None}
    elif encoded["argv"] is None and not encoded["excerpt"] and encoded["evidence"] in (None, "[]"):
        return tuple(encoded[c] for c in COLUMNS)
    redacted = encode_row(decoded)
    return tuple(redacted[c] for c in COLUMNS)


FUTURE_SLACK_S = 15 * 60  # clocks of one cluster's hosts differ by seconds, not by a quarter of an hour


def in_future(stamp: object) -> bool:
    """Whether an ISO time lies ahead of this host's clock (a row from a skewed clock, or crafted to pin a
    cell: the newest row wins). A time that does not parse is not in the future."""
    try:
        when = datetime.fromisoformat(str(stamp)) if stamp else None
    except ValueError:
        return False
    if when is None:
        return False
    when = when.replace(tzinfo=UTC) if when.tzinfo is None else when
    return (when - datetime.now(UTC)).total_seconds() > FUTURE_SLACK_S


def encode_row(values: Mapping[str, Any]) -> dict[str, Any]:
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


def decode_row(values: dict[str, Any]) -> dict[str, Any]:
    """JSON columns parsed; NaN and Infinity (which JSON does not have) are a ValueError."""
    return {k: _parse(k, v) if k in JSON_COLUMNS and v is not None else v for k, v in values.items()}


def _parse(column: str, text: Any) -> Any:
    if not isinstance(text, str):
        raise ValueError(f"{column} is a stored {type(text).__name__}, not JSON text")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        raise ValueError(f"{column}: {exc}") from None
