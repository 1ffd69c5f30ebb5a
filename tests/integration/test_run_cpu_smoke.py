"""The whole pipeline for real on the CPU: uv lock, uv venv, `transformers serve`, the benchmark client,
SQLite, the table. Slow: the first run downloads torch into uv's cache."""

from __future__ import annotations

import psutil
import pytest

from servematrix.cli import main
from servematrix.report.rows import tok_s
from servematrix.store.store import Store

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_cpu_smoke_runs_every_cell_and_writes_the_table(smoke_project, test_cache, capsys):
    args = [
        "run",
        "matrix/cpu-smoke.toml",
        "--backend",
        "venv",
        "--workdir",
        str(test_cache / "work"),
        "--store",
        "results.sqlite",
        "--report",
        "compatibility.md",
    ]
    assert main(args) == 0
    with Store(smoke_project / "results.sqlite") as store:
        rows = store.all_rows()
    assert len(rows) == 4
    assert {r["verdict"] for r in rows} == {"pass"}, [(r["cell_id"], r["verdict"], r["excerpt"]) for r in rows]
    for row in rows:
        assert row["lock_hash"] and row["lock_file"]
        assert row["host"]["cpu"]
        assert row["argv"][1] == "serve"
        assert str(row["metrics"]["completion_tokens"]) and row["metrics"]["error_count"] == 0
        # No server outlives its cell.
        assert row["server_pid"] and not _alive(row["server_pid"])
    # Every level measured. Which mode is faster is a measurement, printed, not asserted: on a loaded 2-core
    # host continuous batching fell below static at 16 streams (318 vs 396 tok/s), on an idle one it was ~6x.
    assert all(tok_s(r)[1] > 0 and tok_s(r)[16] > 0 for r in rows)
    for row in sorted(rows, key=lambda r: (r["axes"]["transformers"], r["mode"])):
        print(f"transformers {row['axes']['transformers']} {row['mode']}: {tok_s(row)} tok/s (CPU)")
    table = (smoke_project / "compatibility.md").read_text()
    # The baseline passes with its answers stored; the other mode passes only with answers matching them.
    assert "| 5.24.0 | 2.9.1 | cpu | ✅ `pass (correctness: the baseline's 16 greedy answers stored" in table
    assert "✅ `pass (correctness: 16 greedy answers match the baseline's" in table
    # continuous batching changes decode: judged on decode tok/s at the highest level, every other level beside
    assert "continuous-batching / static: decode tok/s" in table and "×** decode tok/s @16 (" in table
    assert "× decode tok/s @1 (" in table
    assert "servematrix run matrix/cpu-smoke.toml --select id=" in table
    assert (smoke_project / "matrix" / "locks").is_dir()

    # A second run of the same command runs nothing.
    capsys.readouterr()
    assert main(args) == 0
    assert "0 cell(s) run (0 reused from the published results, 0 decided now), 4 unchanged" in capsys.readouterr().err
    with Store(smoke_project / "results.sqlite") as store:
        assert len(store.all_rows()) == 4


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
