"""`Store.latest()` on a long history: 500 cells x 40 runs (20,000 finished rows), as nightly runs grow a store.

Prints the time of `latest()` and its ratio to the query it replaced (a correlated subquery per row, run on
the same store in the same process). A benchmark, not a timed assertion: the assertions check the answer.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from servematrix.store.store import COLUMNS, Store

CELLS, RUNS = 500, 40
_OLD_QUERY = (
    f"SELECT {', '.join(COLUMNS)} FROM cell_runs WHERE status = 'finished' AND rowid IN ("
    " SELECT rowid FROM cell_runs AS c WHERE c.status = 'finished' AND c.cell_id = cell_runs.cell_id"
    " ORDER BY c.finished_at DESC, c.rowid DESC LIMIT 1) ORDER BY env_id, mode"
)


def _history(path: Path) -> None:
    with Store(path):
        pass  # the schema
    db = sqlite3.connect(path)
    rows = [
        (f"r{run:03d}", f"c{cell:04d}", f"env-{cell}", "transformers", "static", "matrix/m.toml",
         '{"gpu": "cpu"}', "h", "finished", "pass", f"2026-01-01T00:{run:02d}:00+00:00",
         f"2026-01-01T00:{run:02d}:30+00:00")
        for run in range(RUNS) for cell in range(CELLS)
    ]  # fmt: skip
    with db:
        db.executemany(
            "INSERT INTO cell_runs (run_id, cell_id, env_id, engine, mode, matrix, axes, inputs_hash, status,"
            " verdict, started_at, finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
    db.close()


def test_latest_on_a_long_history(tmp_path: Path, benchmark):
    path = tmp_path / "history.sqlite"
    _history(path)
    with Store(path) as store:
        started = time.perf_counter()
        old = store._db.execute(_OLD_QUERY).fetchall()
        old_s = time.perf_counter() - started
        latest = benchmark.pedantic(store.latest, rounds=3, iterations=1)
        new_s = benchmark.stats.stats.min if benchmark.stats else 0.0
        if not new_s:  # --benchmark-disable: time it once here
            started = time.perf_counter()
            latest = store.latest()
            new_s = time.perf_counter() - started
    assert len(latest) == len(old) == CELLS
    assert (
        {r["cell_id"]: r["run_id"] for r in latest}
        == {r[1]: r[0] for r in old}
        == {f"c{cell:04d}": f"r{RUNS - 1:03d}" for cell in range(CELLS)}
    )
    print(f"\nStore.latest() on {CELLS * RUNS} rows: {new_s:.3f} s; the per-row subquery: {old_s:.3f} s "
          f"({old_s / new_s:.0f}x)")  # fmt: skip
