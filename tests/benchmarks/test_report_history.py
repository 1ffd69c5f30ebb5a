"""`report --publish` from a store of 200,000 rows (500 cells x 400 nightly runs) into a site whose history is
full (60 entries for every cell, the bound), as a year of nightly publishes leaves it.

Prints the publish's time, the part the history takes (advancing it and writing the feed, timed alone on the
same rows) and the sizes of `results/latest.json` and `results/history.json`. A benchmark, not a timed
assertion: the assertions check the answer. Run on a tree without the history (it skips what it cannot
import), it gives the time before.
"""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from servematrix.cli import main
from servematrix.store.store import Store

CELLS, RUNS = 500, 400
DAY0 = datetime(
    2024, 1, 1, 3, tzinfo=UTC
)  # 400 daily runs end before today: a run ahead of the clock is never published
MEASURED = 10  # one cell in ten passed with figures; the rest failed before serving


def _metrics(cell: int, run: int) -> str:
    tok = 100.0 + cell + (run % 7)
    level = {"concurrency": 1, "completion_tokens": 100, "error_count": 0, "runs": [],
             "output_tok_s": {"min": tok - 2, "median": tok, "max": tok + 2}}  # fmt: skip
    return json.dumps({"levels": [level]})


def _rows(runs: range) -> list[tuple]:
    return [
        (f"r{run:03d}", f"c{cell:04d}", f"env{cell:04d}", "transformers", "continuous-batching", "matrix/cpu-smoke.toml",
         json.dumps({"gpu": "cpu", "torch": "2.9.1", "transformers": f"5.{cell}.0"}), "h", "finished",
         "pass" if cell % MEASURED == 0 else "fail:import-dependency-conflict",
         _metrics(cell, run) if cell % MEASURED == 0 else None,
         "2024-01-01T00:00:00+00:00", (DAY0 + timedelta(days=run)).isoformat())
        for run in runs for cell in range(CELLS)
    ]  # fmt: skip


def _insert(path: Path, runs: range) -> None:
    db = sqlite3.connect(path)
    with db:
        db.executemany(
            "INSERT INTO cell_runs (run_id, cell_id, env_id, engine, mode, matrix, axes, inputs_hash, status,"
            " verdict, metrics, started_at, finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            _rows(runs),
        )
    db.close()


def _full_history(site: Path) -> None:
    """60 distinct entries per cell, written as the site's feed (skipped on a tree without the history)."""
    record = pytest.importorskip("servematrix.report.history.record")
    from servematrix.report.publish import store_rows

    rows = store_rows(site.parent / "results.sqlite")
    found = None
    for night in range(record.MAX_ENTRIES):
        nightly = [r.replace(run_id=f"h{night:03d}", verdict="pass" if night % 2 else "unresolvable") for r in rows]
        found = record.advance(found.history if found else None, nightly, date=f"n{night}", root=site.parent)
    record.write_history(found.history, site / record.HISTORY)


def test_publish_of_a_200k_row_store_with_a_full_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    monkeypatch.chdir(tmp_path)
    store = tmp_path / "results.sqlite"
    with Store(store):
        pass  # the schema
    _insert(store, range(RUNS - 1))
    assert main(["report", "--publish", "--store", str(store)]) == 0  # the site, as the night before left it
    try:
        _full_history(tmp_path / "docs")
        with_history = True
    except pytest.skip.Exception:
        with_history = False
    feed = tmp_path / "docs" / "results" / "history.json"
    before = feed.read_text() if with_history else ""
    _insert(store, range(RUNS - 1, RUNS))  # tonight's run of every cell: 200,000 rows in all
    capsys.readouterr()
    started = time.perf_counter()
    assert main(["report", "--publish", "--store", str(store)]) == 0
    publish_s = time.perf_counter() - started
    err = capsys.readouterr().err
    assert f"published {CELLS} cell(s)" in err and f"0 new, {CELLS} replaced by a newer run" in err, err
    record = json.loads((tmp_path / "docs" / "results" / "latest.json").read_text())
    assert {e["run_id"] for e in record["cells"].values()} == {f"r{RUNS - 1:03d}"}
    sizes = f"latest.json {(tmp_path / 'docs' / 'results' / 'latest.json').stat().st_size:,} bytes"
    history_s = 0.0
    if with_history:
        from servematrix.report.history import record as history
        from servematrix.report.publish import store_rows

        cells = json.loads(feed.read_text())["cells"]
        assert len(cells) == CELLS and all(len(c["entries"]) == history.MAX_ENTRIES for c in cells.values())
        assert cells["c0000"]["entries"][-1]["run_id"] == f"r{RUNS - 1:03d}"
        assert f"history: {CELLS} " in err
        rows = store_rows(store)
        started = time.perf_counter()
        (tmp_path / "before.json").write_text(before)
        advanced = history.advance(history.load_history(tmp_path / "before.json"), rows, date="again", root=tmp_path)
        history.dumps(advanced.history)
        history_s = time.perf_counter() - started
        sizes += f", history.json {feed.stat().st_size:,} bytes"
    print(
        f"\nreport --publish from {CELLS * RUNS:,} rows ({CELLS} cells): {publish_s:.2f} s"
        + (f"; the history's part (advance + feed, timed alone): {history_s:.2f} s" if with_history else
           " (no history in this tree)")
        + f"; {sizes}"
    )  # fmt: skip
