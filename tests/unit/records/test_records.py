"""The typed records: a stored row, the published cell. Their fields are named once; a row read back is what was
stored, and a malformed record is refused naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servematrix.records.published import PublishedCell, PublishedRecord, cell_problem, results_json_schema
from servematrix.records.row import COLUMNS, JSON_COLUMNS, Row
from servematrix.report.regressions import EXPORTED, export_results, load_export, published_rows, write_export
from servematrix.store.rowschema import COLUMN_TYPES
from servematrix.store.store import Store
from tests.conftest import REPO


def _values(**extra: object) -> dict[str, object]:
    return {
        "run_id": "r1",
        "cell_id": "c1",
        "env_id": "e1",
        "engine": "transformers",
        "mode": "static",
        "matrix": "matrix/m.toml",
        "axes": {"transformers": "5.24.0", "gpu": "cpu"},
        "inputs_hash": "h1",
        "status": "finished",
        "verdict": "pass",
        "evidence": ["server starts: 3"],
        "stages": {"serve": 1.5},
        "started_at": "2026-01-01T00:00:00+00:00",
        "finished_at": "2026-01-01T00:10:00+00:00",
        **extra,
    }


def test_the_rows_fields_are_the_stores_columns_in_order():
    # Old stores keep reading: the SQL table is the one it was, and the row's fields are its columns.
    assert tuple(COLUMN_TYPES) == COLUMNS
    assert set(COLUMNS) >= JSON_COLUMNS
    assert {"evidence_model", "own_verdict"}.isdisjoint(COLUMNS)  # shown beside a row, never stored


def test_a_row_reads_back_from_the_store_as_it_was_written(tmp_path: Path):
    values = _values(metrics={"levels": [{"concurrency": 1, "output_tok_s": {"median": 10.0}}]})
    with Store(tmp_path / "s.sqlite") as store:
        store.record(**values)
        (row,) = store.latest()
    assert row.cell_id == "c1" and row.axes == {"transformers": "5.24.0", "gpu": "cpu"}
    assert row.metrics == values["metrics"] and row.stages == {"serve": 1.5}
    assert {k: v for k, v in row.values.items() if v is not None} == values


def test_a_row_gives_back_exactly_the_columns_it_was_given():
    row = Row.of({"cell_id": "c1", "verdict": "pass"})
    assert row.values == {"cell_id": "c1", "verdict": "pass"}
    assert row.get("metrics") is None and row.metrics is None
    with pytest.raises(KeyError):
        row["metrics"]  # not given: as the mapping a row once was
    assert row.replace(verdict="fail:x").values == {"cell_id": "c1", "verdict": "fail:x"}


def test_a_key_that_is_no_row_field_is_refused_by_name():
    with pytest.raises(KeyError, match="not a row field: verdikt"):
        Row.of({"cell_id": "c1", "verdikt": "pass"})


def test_row_to_published_json_and_back_is_unchanged(tmp_path: Path):
    row = Row.of(_values(argv=["serve", "--port", "1"], lock_file="matrix/locks/e1.lock.txt"))
    record = tmp_path / "latest.json"
    write_export(export_results([row], root=tmp_path), record)
    loaded = load_export(record)
    assert loaded is not None
    (again,) = published_rows(loaded)
    assert {k: v for k, v in again.values.items() if v is not None} == {
        k: v for k, v in row.values.items() if v is not None
    }
    write_export(export_results([again], previous=loaded, root=tmp_path), tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == record.read_text()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"preflight": {"resolve": "resolved"}}, "preflight.resolve"),
        ({"previous": {"run_id": "r0", "tok_s": {"1": "fast"}}}, "previous.tok_s.1"),
        ({"verdikt": "pass"}, "verdikt"),
        ({"host": {"hostname": 7}}, "host.hostname"),
    ],
)
def test_a_malformed_published_cell_is_refused_naming_its_field(tmp_path: Path, change: dict, field: str):
    record = tmp_path / "latest.json"
    write_export(export_results([Row.of(_values())], root=tmp_path), record)
    data = json.loads(record.read_text())
    data["cells"]["c1"].update(change)
    record.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f"cell 'c1': {field}"):
        load_export(record)


def test_the_published_record_and_its_schema_come_from_the_model():
    published = json.loads((REPO / "docs" / "results" / "latest.json").read_text())
    record = PublishedRecord.model_validate(published)
    assert record.cells and all(cell_problem(entry) is None for entry in published["cells"].values())
    schema = results_json_schema()
    cell = schema["$defs"]["PublishedCell"]
    # Every field the export writes is in the schema, and the schema names no other.
    assert set(cell["properties"]) == {*EXPORTED, "metrics", "previous"} == set(PublishedCell.model_fields)
    assert set(cell["required"]) == {"cell_id", "run_id", "env_id", "engine", "mode", "matrix", "axes"}
    assert cell["additionalProperties"] is False
    assert schema["properties"]["schema"]["const"] == 1
    with pytest.raises(ValueError, match="schema"):
        PublishedRecord.model_validate({**published, "schema": 2})


def test_the_published_history_reads_and_writes_back_byte_for_byte():
    from servematrix.report.history import record

    path = REPO / "docs" / "results" / "history.json"
    loaded = record.load_history(path)
    assert loaded is not None and loaded.cells
    assert record.dumps(loaded) == path.read_text(encoding="utf-8")


def test_a_history_entry_keeps_a_field_it_does_not_know_and_writes_unknowns_as_null_only_where_always_shown():
    from servematrix.records.history import HistoryEntry

    written = {"date": "d", "run_id": "r", "inputs": None, "verdict": "pass", "on": None, "newer_field": [1]}
    entry = HistoryEntry.from_json(written)
    assert entry.verdict == "pass" and entry.lock is None and entry.repeated == 1
    assert entry.to_json() == written  # `lock`, `why`, ... absent stay absent; the unknown key is kept


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"verdict": 5}, "cell 'a': entry 0: verdict is 5, not text"),
        ({"repeats": -1}, "cell 'a': entry 0: repeats is -1, not a whole number"),
        ({"figures": {"tok_s@1": [1, 2]}}, r"cell 'a': entry 0: figure tok_s@1 is \[1, 2\], not three finite"),
        ({"named_again": "yes"}, "cell 'a': entry 0: named_again is not a table"),
    ],
)
def test_a_malformed_history_entry_is_refused_naming_its_cell_entry_and_field(
    tmp_path: Path, entry: dict, message: str
):
    from servematrix.report.history import record

    path = tmp_path / "history.json"
    path.write_text(json.dumps({"schema": 1, "cells": {"a": {"entries": [{"date": "d", **entry}]}}}))
    with pytest.raises(ValueError, match=message):
        record.load_history(path)


def test_an_older_store_without_the_newer_columns_still_reads_into_rows(tmp_path: Path):
    # A store written before `preflight`, `prediction` and `redacted_flags` existed: its table as it was then.
    import sqlite3

    old = [c for c in COLUMNS if c not in ("preflight_hash", "preflight", "prediction", "redacted_flags")]
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute(f"CREATE TABLE cell_runs ({', '.join(old)}, PRIMARY KEY (run_id, cell_id))")
    values = {**_values(), "axes": json.dumps({"gpu": "cpu"}), "evidence": "[]", "stages": '{"serve": 1.5}'}
    db.execute(
        f"INSERT INTO cell_runs ({', '.join(values)}) VALUES ({', '.join('?' for _ in values)})",
        tuple(values.values()),
    )
    db.commit()
    db.close()
    with Store(path, read_only=True) as store:
        (row,) = store.latest()
    assert row.cell_id == "c1" and row.axes == {"gpu": "cpu"} and row.stages == {"serve": 1.5}
    assert row.preflight is None and row.prediction is None and row.redacted_flags is None
