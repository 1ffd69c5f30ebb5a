"""Publishing is an explicit act: `run` and a plain `report` never touch the published site; `report --publish`
merges into it and never shrinks it silently; a missing, empty or unfinished store is an error (exit 2).

Real SQLite stores and the real command line, in a temporary project with a published site of its own.
"""

from __future__ import annotations

import json
import sqlite3
import textwrap
from pathlib import Path
from typing import Any

import pytest

from servematrix.cli import main
from servematrix.records.row import Row
from servematrix.report.markdown import reproduce
from servematrix.store.store import Store
from tests.conftest import SMALL_SGLANG

MATRIX = "matrix/cpu-smoke.toml"
AXES = {"transformers": "5.24.0", "torch": "2.9.1", "gpu": "cpu"}


def levels(tok_s: float) -> dict[str, Any]:
    return {
        "levels": [
            {
                "concurrency": 1,
                "completion_tokens": 100,
                "error_count": 0,
                "output_tok_s": {"min": tok_s, "median": tok_s, "max": tok_s},
                "runs": [],
            }
        ]
    }


def record(store: Store, cell: str, *, run: str, finished: str, verdict: str = "pass", tok_s: float = 10.0) -> None:
    store.record(
        run_id=run,
        cell_id=cell,
        env_id=f"env-{cell}",
        engine="transformers",
        mode="static",
        matrix=MATRIX,
        axes=AXES,
        inputs_hash="h",
        verdict=verdict,
        metrics=levels(tok_s) if verdict == "pass" else None,
        backend="venv",
        started_at=finished,
        finished_at=finished,
    )


def make_store(path: Path, *cells: tuple[str, str, str]) -> Path:
    """A store holding (cell, run, finished_at) rows."""
    with Store(path) as store:
        for cell, run, finished in cells:
            record(store, cell, run=run, finished=finished)
    return path


def published(site: Path) -> dict[str, Any]:
    return json.loads((site / "results" / "latest.json").read_text())["cells"]


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


T0, T1, T2 = "2026-01-01T00:00:00+00:00", "2026-01-02T00:00:00+00:00", "2026-01-03T00:00:00+00:00"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project directory with a published site (docs/results/latest.json holding cells a and b)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "matrix").mkdir()
    (tmp_path / "matrix" / "m.toml").write_text(textwrap.dedent(SMALL_SGLANG).lstrip())
    first = make_store(tmp_path / "first.sqlite", ("a", "r1", T1), ("b", "r1", T1))
    assert main(["report", "--publish", "--store", str(first)]) == 0
    assert set(published(tmp_path / "docs")) == {"a", "b"}
    return tmp_path


# ------------------------------------------------------------------------------------- nothing by default


def test_a_run_writes_the_store_and_nothing_under_docs(project: Path, capsys: pytest.CaptureFixture[str]):
    before = tree(project / "docs")
    # --stages serve on a host without the matrix's 8 B200s: every cell is recorded skipped:no-gpu, at once.
    run = ["run", "matrix/m.toml", "--select", "sglang=0.5.9", "--stages", "serve", "--backend", "venv"]
    assert main([*run, "--store", "run.sqlite"]) == 0
    assert tree(project / "docs") == before
    assert not (project / ".servematrix" / "report").exists()
    with Store(project / "run.sqlite") as store:
        rows = store.latest()
    assert rows and {r["backend"] for r in rows} == {"venv"}  # the backend it ran on, for the reproduce command

    # A report only where the user names it; it carries the backend in its reproduce commands.
    assert main([*run, "--store", "run.sqlite", "--rerun", "--report", "preview"]) == 0
    table = (project / "preview" / "compatibility.md").read_text()
    assert f"--select id={rows[0]['cell_id']} --backend venv --rerun" in table
    assert not (project / "preview" / "results").exists()  # a preview publishes no record
    assert tree(project / "docs") == before

    # Naming the published site is refused before anything runs.
    capsys.readouterr()
    assert main([*run, "--store", "other.sqlite", "--report", "docs/compatibility.md"]) == 2
    err = capsys.readouterr().err
    assert "docs holds published results" in err and "report --publish" in err
    assert not (project / "other.sqlite").exists()
    assert tree(project / "docs") == before


def test_report_previews_outside_docs_by_default(project: Path, capsys: pytest.CaptureFixture[str]):
    before = tree(project / "docs")
    make_store(project / ".servematrix" / "results.sqlite", ("c", "r2", T2))
    assert main(["report"]) == 0
    preview = project / ".servematrix" / "report"
    assert "`c`" in (preview / "compatibility.md").read_text()
    assert not (preview / "results").exists()
    assert tree(project / "docs") == before
    assert "a preview: nothing published" in capsys.readouterr().err
    # Twice is fine (a preview dir holds no record), but --out docs without --publish is refused.
    assert main(["report"]) == 0
    assert main(["report", "--out", "docs"]) == 2
    assert tree(project / "docs") == before


# --------------------------------------------------------------------------------------------- publishing


def test_publishing_merges_cell_by_cell(project: Path, capsys: pytest.CaptureFixture[str]):
    # a: a newer run replaces the published one; b: the store's run is older than the published one, kept;
    # c: new. Nothing the store lacks goes.
    store = make_store(project / "second.sqlite", ("a", "r2", T2), ("b", "r0", T0), ("c", "r2", T2))
    capsys.readouterr()
    assert main(["report", "--publish", "--store", str(store)]) == 0
    cells = published(project / "docs")
    assert {cell: entry["run_id"] for cell, entry in cells.items()} == {"a": "r2", "b": "r1", "c": "r2"}
    err = capsys.readouterr().err
    assert "published 3 cell(s)" in err and "1 new, 1 replaced by a newer run" in err
    assert "1 kept (the published run is newer than the store's)" in err
    table = (project / "docs" / "compatibility.md").read_text()
    assert all(f"`{cell}`" in table for cell in "abc")

    # A store with only c: a and b stay.
    only_c = make_store(project / "third.sqlite", ("c", "r3", T2))
    assert main(["report", "--publish", "--store", str(only_c)]) == 0
    assert set(published(project / "docs")) == {"a", "b", "c"}
    assert "2 kept (not in the store; --prune removes them)" in capsys.readouterr().err


def test_a_run_that_decided_nothing_never_unpublishes_a_verdict(project: Path, capsys: pytest.CaptureFixture[str]):
    # A GPU rerun stopped by its job's time limit (interrupted) or lost to the harness (error) is newer than the
    # published pass, but says nothing about the stack: the pass and its figures stay, and the summary says why.
    store = project / "stopped.sqlite"
    with Store(store) as s:
        record(s, "a", run="r2", finished=T2, verdict="interrupted")
        record(s, "b", run="r2", finished=T2, verdict="error:gpu-lost")
        record(s, "c", run="r2", finished=T2, verdict="interrupted")  # new to the record: published as it is
    capsys.readouterr()
    assert main(["report", "--publish", "--store", str(store)]) == 0
    cells = published(project / "docs")
    assert {cell: (entry["run_id"], entry["verdict"]) for cell, entry in cells.items()} == {
        "a": ("r1", "pass"), "b": ("r1", "pass"), "c": ("r2", "interrupted")
    }  # fmt: skip
    assert "2 kept (the store's run decided nothing: error or interrupted)" in capsys.readouterr().err
    # ... and a run that decides the cell again replaces it, whatever it decided.
    again = project / "again.sqlite"
    with Store(again) as s:
        record(s, "a", run="r3", finished=T2, verdict="fail:scheduler-died")
        record(s, "c", run="r3", finished=T2)
    assert main(["report", "--publish", "--store", str(again)]) == 0
    cells = published(project / "docs")
    assert cells["a"]["verdict"] == "fail:scheduler-died" and cells["c"]["verdict"] == "pass"


def test_prune_removes_what_the_store_lacks_and_says_how_many(project: Path, capsys: pytest.CaptureFixture[str]):
    only_b = make_store(project / "b.sqlite", ("b", "r2", T2))
    capsys.readouterr()
    assert main(["report", "--publish", "--prune", "--store", str(only_b)]) == 0
    assert set(published(project / "docs")) == {"b"}
    assert "1 pruned (not in the store)" in capsys.readouterr().err
    assert "`a`" not in (project / "docs" / "compatibility.md").read_text()
    assert main(["report", "--prune", "--store", str(only_b)]) == 2  # pruning is publishing


def _missing(path: Path) -> None:
    pass


def _zero_bytes(path: Path) -> None:
    path.write_bytes(b"")


def _not_a_database(path: Path) -> None:
    path.write_text("# README\n\nnot a store\n")


def _no_rows(path: Path) -> None:
    Store(path).close()


def _only_running_rows(path: Path) -> None:
    with Store(path) as store:
        store.start(
            run_id="r9", cell_id="a", env_id="env-a", engine="transformers", mode="static", matrix=MATRIX,
            axes=AXES, inputs_hash="h",
        )  # fmt: skip


@pytest.mark.parametrize("make", [_missing, _zero_bytes, _not_a_database, _no_rows, _only_running_rows])
@pytest.mark.parametrize("publish", [True, False])
def test_a_store_with_nothing_to_report_is_exit_2_and_changes_nothing(
    project: Path, capsys: pytest.CaptureFixture[str], make: Any, publish: bool
):
    store = project / "lost.sqlite"
    make(store)
    before = tree(project / "docs")
    capsys.readouterr()
    args = ["report", "--store", str(store), "--fail-on-regression", *(["--publish"] if publish else [])]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"servematrix: error: {store}:"), err
    assert tree(project / "docs") == before
    assert not (project / ".servematrix" / "report").exists()
    if make is _missing:
        assert not store.exists()  # not created by looking


def test_from_published_renders_the_record_alone(project: Path, capsys: pytest.CaptureFixture[str]):
    """The docs build (`nox -s docs`): no store, the published results rendered again, unchanged."""
    record = project / "docs" / "results" / "latest.json"
    before = record.read_bytes()
    (project / "docs" / "compatibility.md").unlink()
    assert main(["report", "--publish", "--from-published"]) == 0
    assert "`a`" in (project / "docs" / "compatibility.md").read_text()
    assert record.read_bytes() == before
    assert main(["report", "--from-published"]) == 2  # it is a publish
    assert main(["report", "--publish", "--from-published", "--store", "x.sqlite"]) == 2
    assert main(["report", "--publish", "--from-published", "--out", "empty-site"]) == 2  # nothing published there
    assert "no published results" in capsys.readouterr().err


@pytest.mark.parametrize("publish", [True, False])
def test_a_named_baseline_that_is_missing_or_not_a_record_is_exit_2(
    project: Path, capsys: pytest.CaptureFixture[str], publish: bool
):
    store = make_store(project / "s.sqlite", ("a", "r2", T2))
    (project / "bad.json").write_text("{not json")
    before = tree(project / "docs")
    for baseline in ("missing.json", "bad.json"):
        capsys.readouterr()
        args = ["report", "--store", str(store), "--baseline", baseline, "--fail-on-regression"]
        assert main([*args, *(["--publish"] if publish else [])]) == 2
        assert capsys.readouterr().err.startswith("servematrix: error:")
    assert tree(project / "docs") == before


def test_a_regression_still_fails_the_gate_when_publishing(project: Path):
    slower = project / "slow.sqlite"
    with Store(slower) as store:
        record(store, "a", run="r2", finished=T2, tok_s=1.0)  # published at 10 tok/s
    assert main(["report", "--publish", "--store", str(slower), "--fail-on-regression"]) == 3


# ------------------------------------------------------------------------------------ the backend column

OLD_SCHEMA = """
CREATE TABLE cell_runs (
    run_id TEXT NOT NULL, cell_id TEXT NOT NULL, env_id TEXT NOT NULL, engine TEXT NOT NULL, mode TEXT NOT NULL,
    matrix TEXT NOT NULL, axes TEXT NOT NULL, inputs_hash TEXT NOT NULL, status TEXT NOT NULL, verdict TEXT,
    excerpt TEXT, evidence TEXT, metrics TEXT, argv TEXT, lock_hash TEXT, lock_file TEXT, crossed_pins TEXT,
    image_digest TEXT, host TEXT, harness_pid INTEGER, server_pid INTEGER, server_pgid INTEGER, log_path TEXT,
    stages TEXT, started_at TEXT NOT NULL, finished_at TEXT, PRIMARY KEY (run_id, cell_id)
);
"""


def _old_store(path: Path) -> Path:
    """A store written before rows recorded their backend."""
    db = sqlite3.connect(path)
    db.executescript(OLD_SCHEMA)
    db.execute(
        "INSERT INTO cell_runs (run_id, cell_id, env_id, engine, mode, matrix, axes, inputs_hash, status, verdict,"
        " started_at, finished_at) VALUES ('r0', 'old', 'e0', 'transformers', 'static', ?, ?, 'h', 'finished',"
        " 'pass', ?, ?)",
        (MATRIX, json.dumps(AXES), T0, T0),
    )
    db.commit()
    db.close()
    return path


def test_reproduce_names_the_backend_and_invents_none_for_old_rows(tmp_path: Path):
    old = _old_store(tmp_path / "old.sqlite")
    assert main(["merge", str(tmp_path / "merged.sqlite"), str(old)]) == 0  # an old shard merges
    with Store(tmp_path / "merged.sqlite") as merged:
        (row,) = merged.latest()
    assert row["backend"] is None
    assert reproduce(row) == f"servematrix run {MATRIX} --select id=old --rerun"
    with Store(old) as reopened:  # an old store opens, and gains the column
        (row,) = reopened.latest()
        record(reopened, "new", run="r1", finished=T1)
        new = next(r for r in reopened.latest() if r["cell_id"] == "new")
    assert row["backend"] is None
    assert reproduce(new) == f"servematrix run {MATRIX} --select id=new --backend venv --rerun"


def test_a_cpu_preflight_never_overwrites_nor_regresses_a_gpu_observation():
    from servematrix.report.publish import merge_published
    from servematrix.report.regressions import detect_regressions

    observed = {"cell_id": "c", "run_id": "gpu", "env_id": "e", "mode": "piecewise", "matrix": "m.toml",
                "axes": {"gpu": "b200"}, "verdict": "pass", "finished_at": "2026-12-01T00:00:00+00:00"}  # fmt: skip
    predicted = {**observed, "run_id": "cpu", "verdict": "predicted-fail:dynamo-untraceable",
                 "finished_at": "2026-12-03T00:00:00+00:00"}  # fmt: skip
    published = {"cells": {"c": observed}}
    merged = merge_published(published, [Row.of(predicted)])
    assert merged.kept_observed == 1 and merged.rows[0].verdict == "pass"
    assert detect_regressions([Row.of(predicted)], published) == []
    # A GPU run's failure is a regression as before.
    failed = {**observed, "run_id": "gpu2", "verdict": "fail:cuda-oom", "finished_at": "2026-12-03T00:00:00+00:00"}
    assert merge_published(published, [Row.of(failed)]).rows[0].verdict == "fail:cuda-oom"
    assert [r.kind for r in detect_regressions([Row.of(failed)], published)] == ["verdict"]


def test_a_huge_excerpt_is_bounded_where_it_is_published(project: Path):
    """M8: a store whose excerpt and evidence were written unbounded (by another tool, or an older harness)
    publishes a bounded excerpt: the record and the page stay small."""
    store = project / "huge.sqlite"
    with Store(store) as s:
        record(s, "a", run="r2", finished=T2, verdict="fail:server-exited")
    huge = "exit code 1; last lines:\n" + "\n".join(f"{i} " + "z" * 300_000 for i in range(30))
    with sqlite3.connect(store) as db:
        db.execute("UPDATE cell_runs SET excerpt = ?, evidence = ?", (huge, json.dumps(["ev" * 3000] * 5000)))
    assert main(["report", "--publish", "--store", str(store)]) == 0
    cell = published(project / "docs")["a"]
    assert cell["verdict"] == "fail:server-exited"
    assert len(cell["excerpt"]) < 40_000 and cell["excerpt"].startswith("exit code 1; last lines:")
    assert len(cell["evidence"]) <= 40 and all(len(e) <= 1000 for e in cell["evidence"])
    assert (project / "docs" / "results" / "latest.json").stat().st_size < 500_000
    assert (project / "docs" / "compatibility.html").stat().st_size < 2_000_000


def test_a_store_row_ahead_of_the_clock_is_kept_out_with_its_true_reason(project: Path, capsys):
    """M9: a runner's clock 20 minutes ahead: its row is neither called older than the published one (a false
    reason) nor allowed to pin the cell; the summary says its time is ahead of this host's clock."""
    from datetime import UTC, datetime, timedelta

    ahead = (datetime.now(UTC) + timedelta(minutes=20)).isoformat(timespec="seconds")
    store = project / "ahead.sqlite"
    with Store(store) as s:
        record(s, "a", run="r9", finished=ahead, verdict="fail:cpu-oom")
    capsys.readouterr()
    assert main(["report", "--publish", "--store", str(store)]) == 0
    err = capsys.readouterr().err
    assert "0 kept (the published run is newer than the store's)" in err
    assert "1 kept (the store's run finished after this host's clock says it is now" in err
    assert f"cell a: the store's run r9 finished at {ahead}, ahead of this host's clock" in err
    assert published(project / "docs")["a"]["run_id"] == "r1"


def test_no_bidi_control_reaches_the_markdown_table(project: Path):
    """L3: a row's host CPU name, argv and excerpt holding U+202E (right-to-left override) and U+2066: the
    Markdown table, which GitHub and the docs site render, holds none (the HTML page already had none)."""
    store = project / "bidi.sqlite"
    with Store(store) as s:
        record(s, "a", run="r2", finished=T2, verdict="fail:server-exited")
    with sqlite3.connect(store) as db:
        db.execute(
            "UPDATE cell_runs SET excerpt = ?, argv = ?, host = ?",
            (
                "exit code 1\nboom \u202eexe.live\u202c",
                json.dumps(["python", "-m", "srv", "--name", "\u2066evil\u2069"]),
                json.dumps({"hostname": "h", "cpu": "Xeon \u202eevil"}),
            ),
        )
    assert main(["report", "--publish", "--store", str(store)]) == 0
    table = (project / "docs" / "compatibility.md").read_text()
    assert not any(c in table for c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f")
    assert "evil" in table or "exe.live" in table  # the text stays, only its controls go
