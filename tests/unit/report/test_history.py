"""Each cell's history over publishes (`report.history`): the categories of a sequence of publishes through the
real command line, the page's timeline, the feed's bound over a simulated year of nightly publishes of the
product matrix, old records without history, and the pre-flight's track record from the published H200 rows.
"""

from __future__ import annotations

import json
import random
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from servematrix.cli import main
from servematrix.records.history import HistoryCell, HistoryEntry
from servematrix.report.history import record as history
from servematrix.report.history import track
from servematrix.report.regressions import load_export, published_rows
from servematrix.store.store import Row, Store
from tests.conftest import SMALL_SGLANG

REPO = Path(__file__).resolve().parents[3]
MATRIX = "matrix/cpu-smoke.toml"
AXES = {"transformers": "5.24.0", "torch": "2.9.1", "gpu": "cpu"}
LOCK = "matrix/locks/env-a.lock.txt"
REQUEST = "f" * 64  # the lock's request hash: the row's lock_hash


def write_lock(root: Path, pins: dict[str, str]) -> None:
    path = root / LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    body = "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))
    path.write_text(f"# servematrix-lock: 1\n# inputs-hash: {REQUEST}\n# env-id: env-a\n{body}")


def metrics(tok_s: tuple[float, float, float]) -> dict[str, Any]:
    low, median, high = tok_s
    return {
        "levels": [
            {
                "concurrency": 1,
                "completion_tokens": 100,
                "error_count": 0,
                "output_tok_s": {"min": low, "median": median, "max": high},
                "runs": [],
            }
        ]
    }


def publish(root: Path, run: str, finished: str, verdict: str, tok_s=(9.0, 10.0, 11.0)) -> str:
    """One nightly publish: a store holding cell a's run, published into the project's docs."""
    store = root / f"{run}.sqlite"
    with Store(store) as s:
        s.record(
            run_id=run, cell_id="a", env_id="env-a", engine="transformers", mode="static", matrix=MATRIX, axes=AXES,
            inputs_hash="h", verdict=verdict, metrics=metrics(tok_s) if verdict == "pass" else None,
            lock_hash=REQUEST, lock_file=LOCK, backend="venv", stages={"serve": 1.0, "bench": 2.0},
            started_at=finished, finished_at=finished,
        )  # fmt: skip
    assert main(["report", "--publish", "--store", str(store)]) == 0
    return (root / "docs" / "results" / "history.json").read_text()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "matrix").mkdir()
    (tmp_path / "matrix" / "m.toml").write_text(textwrap.dedent(SMALL_SGLANG).lstrip())
    return tmp_path


def test_a_sequence_of_publishes_is_sorted_and_the_page_shows_the_timeline(
    project: Path, capsys: pytest.CaptureFixture[str]
):
    write_lock(project, {"torch": "2.9.1", "transformers": "5.24.0"})
    publish(project, "r0", "2026-01-01T00:00:00+00:00", "pass")
    publish(project, "r1", "2026-01-02T00:00:00+00:00", "pass", tok_s=(9.5, 10.2, 10.8))  # within the noise
    publish(project, "r2", "2026-01-03T00:00:00+00:00", "fail:import-dependency-conflict")  # same inputs
    write_lock(project, {"torch": "2.9.1", "transformers": "5.25.0", "kernels": "0.14.1"})  # a new lock
    publish(project, "r3", "2026-01-04T00:00:00+00:00", "fail:dynamo-untraceable")
    write_lock(project, {"torch": "2.9.1", "transformers": "5.25.1", "kernels": "0.14.1"})  # the fix
    capsys.readouterr()
    feed = json.loads(publish(project, "r4", "2026-01-05T00:00:00+00:00", "pass"))

    entries = feed["cells"]["a"]["entries"]
    assert [e["category"] for e in entries] == ["new", "unchanged", "flaky", "changed-inputs", "fixed"]
    assert [e["run_id"] for e in entries] == ["r0", "r1", "r2", "r3", "r4"]
    assert "with identical inputs" in entries[2]["why"]
    assert entries[3]["lock_changes"] == {"kernels": [None, "0.14.1"], "transformers": ["5.24.0", "5.25.0"]}
    assert entries[4]["lock_changes"] == {"transformers": ["5.25.0", "5.25.1"]}
    assert entries[1]["figures"] == {"tok_s@1": [9.5, 10.2, 10.8]} and entries[1]["on"] == "cpu"
    assert feed["cells"]["a"]["since"] == "2026-01-05T00:00:00+00:00"  # passing again since the fix
    assert [p["counts"] for p in feed["publishes"]] == [
        {"new": 1}, {"unchanged": 1}, {"flaky": 1}, {"changed-inputs": 1}, {"fixed": 1}
    ]  # fmt: skip
    assert "history: 1 fixed" in capsys.readouterr().err  # the command's summary

    # The page: the cell's category, its runs newest first with what changed, and this publish's summary.
    page = (project / "docs" / "compatibility.html").read_text()
    timeline = page[page.index('class="timeline"') :]
    order = [timeline.index(f"<code>{run}</code>") for run in ("r4", "r3", "r2", "r1", "r0")]
    assert order == sorted(order)
    assert "transformers 5.24.0 → 5.25.0" in timeline and "kernels (none) → 0.14.1" in timeline
    assert 'class="history-plot"' in timeline  # the figures over time, with intervals
    assert '<span class="badge h-fixed"' in page and "Since the last publish" in page
    table = (project / "docs" / "compatibility.md").read_text()
    assert (
        "**This publish**: history: 1 fixed" in table
        and "- fixed: `a`: verdict fail:dynamo-untraceable → pass" in table
    )

    # Publishing the same run again adds nothing; the latest record kept its shape.
    before = (project / "docs" / "results" / "history.json").read_text()
    capsys.readouterr()
    assert main(["report", "--publish", "--from-published"]) == 0
    after = json.loads((project / "docs" / "results" / "history.json").read_text())
    assert after["cells"] == json.loads(before)["cells"] and after["publishes"] == json.loads(before)["publishes"]
    # ... and the page rendered again (the docs build) still says what the last publish changed.
    assert "history: the last publish (" in capsys.readouterr().err
    again = (project / "docs" / "compatibility.md").read_text()
    assert "rendered again): 1 fixed" in again and "- fixed: `a`: verdict fail:dynamo-untraceable → pass" in again
    assert "history" not in load_export(project / "docs" / "results" / "latest.json")["cells"]["a"]


def test_flaky_figures_and_identical_runs_are_compressed():
    base = HistoryEntry(inputs="i", lock="l", verdict="pass", on="NVIDIA H200", figures={"tok_s@1": [9, 10, 11]})
    moved = replace(base, figures={"tok_s@1": [5, 6, 7]})
    assert history.categorize(base, moved)[0] == "flaky"
    assert history.categorize(base, replace(moved, lock="m"))[0] == "regressed"  # lower, with a new lock
    assert history.categorize(base, replace(base, figures={"tok_s@1": [12, 13, 14]}, lock="m"))[0] == "changed-inputs"
    assert history.categorize(base, replace(base, figures={"tok_s@1": [10.5, 11, 12]}))[0] == "unchanged"
    slower = replace(base, figures={"ttft_ms@1": [10, 11, 12]})
    assert history.categorize(slower, replace(slower, figures={"ttft_ms@1": [20, 21, 22]}))[0] == "flaky"
    # A CPU prediction then a GPU run of the same stack: where it was decided changed, not the stack.
    cpu = HistoryEntry(inputs="i", verdict="skipped:no-gpu", on="cpu")
    assert history.categorize(cpu, base) == (
        "changed-inputs",
        "verdict skipped:no-gpu → pass; decided on NVIDIA H200, before on cpu",
    )


def test_a_cells_timeline_names_the_release_a_stored_bisection_named():
    from servematrix.report.bisectnote import NOTE_PREFIX
    from servematrix.report.history.page import timeline

    note = "sglang 0.5.13 is the first release that fails (0.5.12 passes)"
    shown = timeline(
        HistoryCell(entries=(HistoryEntry(verdict="fail:x", date="d", category="new"),)),
        Row.of({"evidence": [NOTE_PREFIX + note]}),
    )
    assert shown is not None and shown["bisected"] == [note] and shown["entries"][0]["verdict"] == "fail:x"


def row(cell: str, run: str, day: int, verdict: str, **extra: Any) -> Row:
    return Row.of(
        {
            "cell_id": cell, "run_id": run, "env_id": f"env-{cell}", "matrix": MATRIX, "mode": "static",
            "axes": AXES, "inputs_hash": "h", "verdict": verdict, "finished_at": f"2026-01-{day:02d}T00:00:00+00:00",
            **extra,
        }
    )  # fmt: skip


def test_identical_runs_count_on_one_entry_and_the_bound_keeps_since(tmp_path: Path):
    found = None
    for day in range(1, 31):
        found = history.advance(found.history if found else None, [row("a", f"r{day}", day, "unresolvable")],
                                date=f"d{day}", root=tmp_path)  # fmt: skip
    entries = found.history.cells["a"].entries
    assert len(entries) == 1 and entries[0].repeats == 30 and entries[0].last_run_id == "r30"
    # rendered again without a new run: the last publish called the cell unchanged, not what its entry first was
    again = history.advance(found.history, [row("a", "r30", 30, "unresolvable")], date="later", root=tmp_path)
    assert entries[0].category == "new" and again.again == "d30"
    assert again.categories == {"a": ("unchanged", "")} and "rendered again): 1 unchanged" in again.summary()
    for day in range(1, history.MAX_ENTRIES + 11):  # a distinct figure every night: the bound cuts
        m = metrics((day, day + 0.5, day + 1.0))
        found = history.advance(found.history, [row("a", f"s{day}", day % 28 + 1, "pass", metrics=m)],
                                date=f"e{day}", root=tmp_path)  # fmt: skip
    cell = found.history.cells["a"]
    assert len(cell.entries) == history.MAX_ENTRIES and cell.dropped == 11
    assert cell.first == "2026-01-01T00:00:00+00:00" and cell.since == "2026-01-02T00:00:00+00:00"
    # A cell no longer published (pruned) leaves the history; its lock's versions with it.
    found = history.advance(found.history, [row("b", "t1", 1, "pass")], date="f", root=tmp_path)
    assert set(found.history.cells) == {"b"} and found.categories == {"b": ("new", "first run in the history")}


def test_a_stopped_run_is_undecided_and_the_next_decided_run_is_compared_past_it(tmp_path: Path):
    """A GPU cell stopped by a device call's time limit (`interrupted`) and finished by the next run, with the
    same inputs, was called flaky (verdict interrupted → pass): the stop is no move of the stack."""
    m = metrics((9.0, 10.0, 11.0))
    found = history.advance(None, [row("a", "r1", 1, "interrupted")], date="d1", root=tmp_path)
    assert found.categories["a"][0] == "undecided" and "decided nothing about the stack" in found.categories["a"][1]
    found = history.advance(found.history, [row("a", "r2", 2, "pass", metrics=m)], date="d2", root=tmp_path)
    assert found.categories == {"a": ("new", "first decided run in the history")}
    assert found.history.cells["a"].since == "2026-01-02T00:00:00+00:00"
    # Stopped again, then passing within the same noise: unchanged against the pass, and `since` kept.
    found = history.advance(found.history, [row("a", "r3", 3, "error:gpu-lost")], date="d3", root=tmp_path)
    assert found.categories["a"][0] == "undecided" and found.lines() == [
        "undecided: cell a: error:gpu-lost: decided nothing about the stack; the cell runs again"
    ]
    found = history.advance(found.history, [row("a", "r4", 4, "pass", metrics=m)], date="d4", root=tmp_path)
    assert found.categories == {"a": ("unchanged", "")}
    assert found.history.cells["a"].since == "2026-01-02T00:00:00+00:00"
    # ... and a failure after a stop is still told against the pass before the stop.
    found = history.advance(found.history, [row("a", "r5", 5, "interrupted")], date="d5", root=tmp_path)
    found = history.advance(found.history, [row("a", "r6", 6, "fail:scheduler-died")], date="d6", root=tmp_path)
    assert found.categories["a"] == ("flaky", "verdict pass → fail:scheduler-died with identical inputs")
    assert found.history.cells["a"].since == "2026-01-06T00:00:00+00:00"
    assert [e.category for e in found.history.cells["a"].entries] == [
        "undecided", "new", "undecided", "unchanged", "undecided", "flaky"
    ]  # fmt: skip


def test_a_class_named_again_from_the_log_changes_its_runs_entry_in_place(tmp_path: Path):
    """`servematrix reclassify` renames a stored failure's class; published again from the same run, the
    run's entry takes the new class and says what it was: no new entry, no category (not a new run)."""
    first = history.advance(None, [row("a", "r1", 1, "fail:scheduler-died")], date="d1", root=tmp_path)
    again = history.advance(first.history, [row("a", "r1", 1, "fail:graph-capture-failed")], date="d2",
                            root=tmp_path)  # fmt: skip
    (entry,) = again.history.cells["a"].entries
    assert entry.verdict == "fail:graph-capture-failed" and entry.run_id == "r1"
    assert entry.named_again == {"was": "fail:scheduler-died", "on": "d2"}
    assert again.no_new_run == 1 and again.again == "d1"
    # A run's verdict that moved otherwise (a pass now a failure) is no renaming: the entry stays as it was.
    moved = history.advance(again.history, [row("a", "r1", 1, "pass")], date="d3", root=tmp_path)
    assert moved.history.cells["a"].entries[0].verdict == "fail:graph-capture-failed"


def _product_rows() -> list[dict[str, Any]]:
    record = json.loads((REPO / "docs" / "results" / "latest.json").read_text())
    rows = [
        {k: v for k, v in e.items() if k != "previous"}  # a published cell's comparison is no row field
        for e in record["cells"].values()
        if e["matrix"] == "matrix/glm5-nvfp4.toml"
    ]
    assert len(rows) >= 100
    return rows


def test_a_year_of_nightly_publishes_of_the_product_matrix_stays_small(tmp_path: Path):
    """365 nightly CPU pre-flights of the product matrix (its published rows as the template): each night new
    run ids; every 30 days a tenth of the environments get a new lock (a package bumped, verdicts of half of
    their cells move); three cells flip their verdict with identical inputs each week. Then the worst case:
    every cell served with new figures every night (no entry repeats)."""
    rng = random.Random(37)
    template = _product_rows()
    locks = sorted({r["lock_file"] for r in template if r.get("lock_file")})
    for lock in locks:
        (tmp_path / lock).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / lock).write_bytes((REPO / lock).read_bytes())
    record_bytes = len((REPO / "docs" / "results" / "latest.json").read_bytes())
    flaky = {r["cell_id"] for r in rng.sample(template, 3)}
    verdicts = {r["cell_id"]: r["verdict"] for r in template}
    found = None
    for night in range(365):
        if night and night % 30 == 0:
            for lock in rng.sample(locks, max(1, len(locks) // 10)):
                path = tmp_path / lock
                path.write_text(path.read_text() + f"servematrix-bump=={night}\n")
                for r in template:
                    if r.get("lock_file") == lock and rng.random() < 0.5:
                        verdicts[r["cell_id"]] = rng.choice(["unresolvable", "predicted-fail:dynamo-untraceable"])
        rows = []
        for r in template:
            verdict = verdicts[r["cell_id"]]
            if r["cell_id"] in flaky and night % 7 == 3:
                verdict = "skipped:no-gpu" if verdict != "skipped:no-gpu" else "predicted-fail:dynamo-untraceable"
            rows.append(Row.of({**r, "run_id": f"n{night:03d}", "verdict": verdict,
                                    "finished_at": f"2026-{1 + night // 31 % 12:02d}-{1 + night % 28:02d}T03:00:00+00:00"}))  # fmt: skip
        found = history.advance(found.history if found else None, rows, date=f"night {night}", root=tmp_path)
    nightly = len(history.dumps(found.history).encode())
    counts = {}
    for entry in (e for c in found.history.cells.values() for e in c.entries):
        counts[entry.category] = counts.get(entry.category, 0) + 1

    worst = found.history  # frozen: advancing it leaves it as it was
    for night in range(history.MAX_ENTRIES + 5):
        rows = [
            Row.of({**r, "run_id": f"g{night:03d}", "verdict": "pass", "stages": {"serve": 1.0},
                        "host": {"gpu_sku": "NVIDIA H200"},
                        "metrics": metrics((900.0 + night, 1000.0 + night * 1.37, 1100.0 + night)) | {
                            "prefill": {"levels": [{"concurrency": 1, "ttft_mean_s": {"min": 0.011, "median": 0.012 + night / 1e5, "max": 0.013}}]}}})
            for r in template
        ]  # fmt: skip
        worst = history.advance(worst, rows, date=f"gpu {night}", root=tmp_path).history
    full = len(history.dumps(worst).encode())
    print(
        f"\nlatest.json (the published record, unchanged by the history): {record_bytes:,} bytes\n"
        f"history.json after 365 nightly publishes of {len(template)} cells: {nightly:,} bytes "
        f"(entries by category: {counts}; {len(found.history.locks)} lock(s) kept)\n"
        f"worst case (every cell a distinct GPU run with figures every night, {history.MAX_ENTRIES} entries each): "
        f"{full:,} bytes"
    )
    # The bound per cell, so that it holds as the product matrix grows (104 cells, then 180): measured 2.5 kB and
    # 2.2 kB a cell for a year of nightly runs, 18 kB for the worst case.
    assert nightly < 3_000 * len(template)
    assert full < 33_000 * len(template) and all(len(c.entries) <= history.MAX_ENTRIES for c in worst.cells.values())


def test_an_old_record_without_history_loads_and_starts_from_previous(project: Path):
    write_lock(project, {"torch": "2.9.1"})
    publish(project, "r0", "2026-01-01T00:00:00+00:00", "pass")
    publish(project, "r1", "2026-01-02T00:00:00+00:00", "pass")
    (project / "docs" / "results" / "history.json").unlink()  # a site published before the history
    assert main(["report", "--publish", "--from-published"]) == 0
    entries = json.loads((project / "docs" / "results" / "history.json").read_text())["cells"]["a"]["entries"]
    assert (entries[0]["run_id"], entries[0]["inputs"]) == ("r0", None)  # the one-step `previous`
    assert entries[-1]["run_id"] == "r1" and entries[-1]["category"] == "unchanged"


def test_a_malformed_history_is_exit_2_and_nothing_is_written(project: Path):
    write_lock(project, {"torch": "2.9.1"})
    publish(project, "r0", "2026-01-01T00:00:00+00:00", "pass")
    feed = project / "docs" / "results" / "history.json"
    feed.write_text('{"schema": 1, "cells": {"a": {"entries": "nope"}}}')
    before = {p: p.read_bytes() for p in (project / "docs").rglob("*") if p.is_file()}
    with Store(project / "r9.sqlite") as s:
        s.record(run_id="r9", cell_id="a", env_id="env-a", engine="transformers", mode="static", matrix=MATRIX,
                 axes=AXES, inputs_hash="h", verdict="unresolvable")  # fmt: skip
    assert main(["report", "--publish", "--store", "r9.sqlite"]) == 2
    assert {p: p.read_bytes() for p in (project / "docs").rglob("*") if p.is_file()} == before


def test_the_track_record_from_the_published_h200_rows():
    """The published H200 rows, each after a CPU prediction of the same inputs (as a CPU pre-flight of the same
    cells records it: nothing served, the same cell, lock and image): passes predicted `skipped:no-gpu` (passed
    the pre-flights), failures predicted with their class, and one pass that the CPU predicted to fail."""
    published = json.loads((REPO / "docs" / "results" / "latest.json").read_text())
    # Served there: a cell skipped on the H200 host (a mode its release lacks) observed nothing.
    observed = [
        r
        for r in published_rows(published)
        if (r.get("host") or {}).get("gpu_sku") == "NVIDIA H200" and not r["verdict"].startswith("skipped")
    ]
    assert len(observed) >= 5 and {r["verdict"].partition(":")[0] for r in observed} == {"pass", "fail"}
    wrong = next(r for r in observed if r["verdict"] == "pass")
    predictions = []
    for r in observed:
        verdict = "skipped:no-gpu" if r["verdict"] == "pass" else "predicted-" + r["verdict"]
        if r is wrong:
            verdict = "predicted-fail:dynamo-untraceable"
        predictions.append(Row.of({**r.values, "run_id": "cpu-" + r["run_id"], "verdict": verdict,
                                       "metrics": None, "stages": {"resolve": 1.0}, "host": {"gpus": []}}))  # fmt: skip
    found = history.advance(None, predictions, date="cpu", root=REPO)
    found = history.advance(found.history, observed, date="h200", root=REPO)
    record = track.track_record(found.history, observed)
    passes = sum(1 for r in observed if r["verdict"] == "pass")
    assert record.compared == len(observed) and record.held == len(observed) - 1
    assert record.line().startswith(f"CPU predictions confirmed on a GPU: {len(observed) - 1} of {len(observed)} (")
    assert record.by_class["passed the pre-flights"] == (passes - 1, passes - 1)
    assert record.by_class["dynamo-untraceable"] == (0, 1)
    (contradicted,) = record.contradicted
    assert contradicted.cell_id == wrong["cell_id"] and contradicted.observed.on == "NVIDIA H200"
    assert contradicted.predicted.verdict == "predicted-fail:dynamo-untraceable"
    text = track.track_record_markdown(found.history, observed)
    assert f"`{wrong['cell_id']}`: predicted `predicted-fail:dynamo-untraceable` on a CPU" in text

    # The published record as it is: no H200 row has a CPU prediction of the same inputs yet.
    assert track.track_record(None, published_rows(published)).line().endswith("(insufficient data)")


def test_recommend_shows_the_track_record_of_the_published_site(project: Path, capsys: pytest.CaptureFixture[str]):
    write_lock(project, {"torch": "2.9.1"})
    publish(project, "r0", "2026-01-01T00:00:00+00:00", "pass")
    capsys.readouterr()
    assert main(["recommend"]) == 0
    assert "CPU predictions confirmed on a GPU: no cell has both" in capsys.readouterr().out


KILLED_AFTER_HISTORY = """
import os, signal, sys
from servematrix.cli import main
from servematrix.report import publish
real = os.replace
def replace(src, dst):
    real(src, dst)
    if str(dst).endswith("history.json") and ".servematrix-staging-" not in str(dst):
        os.kill(os.getpid(), signal.SIGKILL)  # killed between history.json and latest.json
publish.os.replace = replace  # the os module's: every move of the site's files
sys.exit(main(["report", "--publish", "--store", sys.argv[1]]))
"""


def _store(root: Path, run: str, finished: str, verdict: str, cell: str = "a") -> Path:
    store = root / f"{run}.sqlite"
    with Store(store) as s:
        s.record(
            run_id=run, cell_id=cell, env_id=f"env-{cell}", engine="transformers", mode="static", matrix=MATRIX,
            axes=AXES, inputs_hash="h", verdict=verdict, metrics=metrics((9.0, 10.0, 11.0)) if verdict == "pass" else None,
            backend="venv", stages={"serve": 1.0, "bench": 2.0}, started_at=finished, finished_at=finished,
        )  # fmt: skip
    return store


def test_a_publish_killed_between_history_and_latest_is_finished_by_the_next(project: Path):
    """M6: history.json and latest.json are one change. A publish SIGKILLed right after moving history.json
    (r2) and before latest.json leaves a journal; the next publish (of another store) finishes the move first,
    so the record says r2 and the history holds r1 and r2 once each, never r1 filed again as flaky."""
    import subprocess
    import sys

    results = project / "docs" / "results"
    assert (
        main(
            ["report", "--publish", "--store", str(_store(project, "r1", "2026-02-01T00:00:00+00:00", "fail:cpu-oom"))]
        )
        == 0
    )
    r2 = _store(project, "r2", "2026-02-02T00:00:00+00:00", "pass")
    killed = subprocess.run([sys.executable, "-c", KILLED_AFTER_HISTORY, str(r2)], cwd=project, check=False)
    assert killed.returncode == -9
    assert json.loads((results / "latest.json").read_text())["cells"]["a"]["run_id"] == "r1"  # torn, for now
    other = _store(project, "r3", "2026-02-03T00:00:00+00:00", "pass", cell="z")
    assert main(["report", "--publish", "--store", str(other)]) == 0
    latest = json.loads((results / "latest.json").read_text())["cells"]
    assert latest["a"]["run_id"] == "r2" and latest["a"]["verdict"] == "pass" and "z" in latest
    entries = json.loads((results / "history.json").read_text())["cells"]["a"]["entries"]
    assert [e["run_id"] for e in entries] == ["r1", "r2"], entries
    assert not list((project / "docs").glob(".servematrix-*"))


def test_another_workloads_figures_are_filed_as_changed_inputs_never_regressed():
    """M7: the same cell id measured by a matrix that differs only in its workload (output_len 8: a tenth of
    the tok/s) is a change of inputs in the history, not a regression of the stack."""

    def entry(run: str, tok_s: float, output_len: int) -> dict[str, Any]:
        row = {
            "run_id": run, "cell_id": "a", "inputs_hash": f"h{output_len}", "verdict": "pass",
            "finished_at": "2026-02-01T00:00:00+00:00", "stages": {"serve": 1.0, "bench": 2.0},
            "metrics": {**metrics((tok_s * 0.99, tok_s, tok_s * 1.01)), "workload": {"output_len": output_len}},
        }  # fmt: skip
        return history.entry_of(Row.of(row))

    category, why = history.categorize(entry("r1", 100.0, 64), entry("r2", 10.0, 8))
    assert category == "changed-inputs" and "workload changed" in why
    assert history.categorize(entry("r1", 100.0, 64), entry("r3", 10.0, 64))[0] == "flaky"


@pytest.mark.parametrize(
    ("figure", "message"),
    [
        ("NaN", "not three finite numbers"),
        ('"fast"', "not three finite numbers"),
        ("[1, 2]", "not three finite numbers"),
        ("[1, 2, Infinity]", "not three finite numbers"),
    ],
)
def test_a_malformed_figure_in_the_history_is_exit_2_naming_it(project: Path, capsys, figure: str, message: str):
    """L9: a figure that is NaN, text or two numbers ended every publish (and the docs build) in a traceback."""
    write_lock(project, {"torch": "2.9.1"})
    publish(project, "r0", "2026-01-01T00:00:00+00:00", "pass")
    feed = project / "docs" / "results" / "history.json"
    text = feed.read_text()
    data = json.loads(text)
    data["cells"]["a"]["entries"][0]["figures"] = {"tok_s@1": "PLACEHOLDER"}
    feed.write_text(json.dumps(data).replace('"PLACEHOLDER"', figure))
    before = {p: p.read_bytes() for p in (project / "docs").rglob("*") if p.is_file()}
    capsys.readouterr()
    assert (
        main(["report", "--publish", "--store", str(_store(project, "r9", "2026-02-01T00:00:00+00:00", "pass"))]) == 2
    )
    err = capsys.readouterr().err
    assert "history.json" in err and "cell 'a': entry 0: figure tok_s@1" in err and message in err
    assert "Traceback" not in err
    assert {p: p.read_bytes() for p in (project / "docs").rglob("*") if p.is_file()} == before


def test_the_bound_applies_to_a_history_as_it_is_read(tmp_path: Path):
    """L10: a history with far more entries than the bound is cut to it as it is read."""
    entries = [{"date": "d", "run_id": f"r{i}", "verdict": "pass", "category": "unchanged"} for i in range(5000)]
    path = tmp_path / "history.json"
    path.write_text(json.dumps({"schema": history.SCHEMA, "cells": {"a": {"entries": entries, "dropped": 3}}}))
    loaded = history.load_history(path)
    assert loaded is not None
    cell = loaded.cells["a"]
    assert len(cell.entries) == history.MAX_ENTRIES and cell.dropped == 3 + 5000 - history.MAX_ENTRIES
    assert cell.entries[-1].run_id == "r4999"
