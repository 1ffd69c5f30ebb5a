"""Regressions against the published results: verdict flips and throughput drops beyond the measured noise.

The end-to-end case measures a real server with the real benchmark client twice, the second time THROTTLED
ON PURPOSE (the fake server waits three times longer per token): that slowdown must be flagged, in the
returned list, the markdown and the HTML page, and an unchanged re-run must not be.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servematrix.report.regressions import (
    detect_regressions,
    export_results,
    load_export,
    portable_argv,
    published_rows,
    spreads,
    write_export,
)
from servematrix.report.site import build_report
from servematrix.stages.bench import Workload, run_workload_sync
from servematrix.store.store import Row
from tests.fakes.fake_openai_server import FakeBehavior, FakeOpenAIServer


def level(concurrency: int, lo: float, med: float, hi: float) -> dict[str, Any]:
    return {
        "concurrency": concurrency,
        "completion_tokens": 100,
        "error_count": 0,
        "output_tok_s": {"min": lo, "median": med, "max": hi},
        "runs": [],
    }


def row(cell: str = "c1", verdict: str = "pass", run: str = "r1", levels: list | None = None, **extra: Any) -> Row:
    return Row.of(
        {
            "run_id": run,
            "cell_id": cell,
            "env_id": "e1",
            "engine": "transformers",
            "mode": "static",
            "matrix": "matrix/cpu-smoke.toml",
            "axes": {"gpu": "cpu", "torch": "2.9.1", "transformers": "5.24.0"},
            "verdict": verdict,
            "metrics": {"levels": levels} if levels is not None else None,
            "finished_at": f"2026-01-01T00:00:0{len(run)}+00:00",
            **extra,
        }
    )


def published(*rows: Row) -> dict[str, Any]:
    return export_results(list(rows))


# ------------------------------------------------------------------------------------------- verdicts


@pytest.mark.parametrize("after", ["fail:cpu-oom", "unresolvable"])
def test_a_pass_that_now_fails_is_a_regression(after: str):
    before = row(levels=[level(1, 9, 10, 11)])
    found = detect_regressions([row(verdict=after, run="r2")], published(before))
    assert [(r.kind, r.before, r.after) for r in found] == [("verdict", "pass", after)]
    assert "pass -> " + after in str(found[0])


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("fail:cpu-oom", "pass"),  # fixed: good news, not a regression
        ("fail:cpu-oom", "fail:python-exception"),  # still failing
        ("pass", "error:harness"),  # says nothing about the stack; it runs again next time
        ("pass", "interrupted"),
        ("pass", "skipped:no-gpu"),  # not measured here (a CPU host reporting against GPU results)
        ("pass", "predicted-fail:dynamo-untraceable"),  # like with like: a prediction never regresses a GPU pass
    ],
)
def test_other_verdict_changes_are_not_regressions(before: str, after: str):
    assert detect_regressions([row(verdict=after, run="r2")], published(row(verdict=before))) == []


def test_cells_new_to_the_matrix_and_no_baseline_compare_with_nothing():
    assert detect_regressions([row(cell="new", verdict="fail:x", run="r2")], published(row())) == []
    assert detect_regressions([row(verdict="fail:x")], None) == []


# ----------------------------------------------------------------------------------------- throughput


def test_another_workloads_figures_are_never_a_regression():
    """M7: two matrices that differ only in their workload share cell ids; the one with output_len 8 measures
    a tenth of the other's tok/s. Its figures are not compared with the other's, in the record or in a
    summary carried over from an earlier render; the same workload is compared as before."""
    long = {"input_len": 8, "output_len": 64, "concurrency": [1]}
    short = {**long, "output_len": 8}

    def measured(run: str, tok_s: float, workload: dict[str, Any]) -> Row:
        r = row(run=run, levels=[level(1, tok_s * 0.99, tok_s, tok_s * 1.01)])
        return Row.of({**r.values, "metrics": {**r.values["metrics"], "workload": workload}})

    before = published(measured("r1", 100.0, long))
    assert detect_regressions([measured("r2", 10.0, short)], before) == []
    # The record as a later render reads it: the cell's previous run kept as a summary.
    rerendered = export_results([measured("r2", 10.0, short)], previous=before)
    assert detect_regressions([measured("r2", 10.0, short)], rerendered) == []
    found = detect_regressions([measured("r3", 10.0, long)], before)
    assert [r.kind for r in found] == ["throughput"]


def test_a_drop_within_the_measured_noise_is_not_flagged():
    # Old repeats spread 80..120 (40 % noise); the median fell 25 %, and the ranges overlap.
    before = row(levels=[level(16, 80, 100, 120)])
    after = row(run="r2", levels=[level(16, 70, 75, 90)])
    assert detect_regressions([after], published(before)) == []


def test_a_drop_beyond_the_noise_is_flagged_with_its_numbers():
    before = row(levels=[level(1, 98, 100, 102), level(16, 380, 400, 420)])
    after = row(run="r2", levels=[level(1, 97, 99, 101), level(16, 240, 250, 260)])
    found = detect_regressions([after], published(before))
    assert len(found) == 1
    reg = found[0]
    assert (reg.kind, reg.concurrency, reg.before, reg.after) == ("throughput", 16, "400.0", "250.0")
    assert reg.drop == pytest.approx(0.375)
    assert reg.threshold == pytest.approx(0.10)  # both spreads are under 10 %
    assert "@16 400.0 -> 250.0 (-38%" in reg.reason


def test_ranges_apart_by_the_margin_are_flagged_even_when_noise_is_large():
    # Both runs noisy (67 % and 55 % spread): the median drop (50 %) is within that noise, but the new best
    # repeat (89) is more than 10 % below the old worst (100).
    before = row(levels=[level(16, 100, 150, 200)])
    after = row(run="r2", levels=[level(16, 50, 70, 89)])
    found = detect_regressions([after], published(before))
    assert [r.concurrency for r in found] == [16]
    assert "new max 89.0 < old min 100.0" in found[0].reason


def test_small_drops_need_more_than_ten_percent():
    before = row(levels=[level(1, 100, 100, 100)])
    assert detect_regressions([row(run="r2", levels=[level(1, 91, 91, 91)])], published(before)) == []
    assert len(detect_regressions([row(run="r2", levels=[level(1, 85, 85, 85)])], published(before))) == 1


def test_a_faster_run_or_a_level_measured_only_once_is_not_flagged():
    before = row(levels=[level(1, 100, 100, 100)])
    after = row(run="r2", levels=[level(1, 150, 160, 170), level(64, 1, 1, 1)])
    assert detect_regressions([after], published(before)) == []


def test_rendering_the_same_results_again_flags_the_same_cells(tmp_path: Path):
    """The record remembers what each run was compared with: a re-render keeps the flag, a new run does not
    inherit it."""
    first = row(levels=[level(1, 100, 100, 100)])
    slow = row(run="r2", levels=[level(1, 50, 50, 50)])
    record = write_export(published(first), tmp_path / "latest.json")
    flagged = detect_regressions([slow], load_export(record))
    assert len(flagged) == 1
    write_export(export_results([slow], previous=load_export(record)), record)
    again = detect_regressions([slow], load_export(record))
    assert [r.reason for r in again] == [r.reason for r in flagged]
    write_export(export_results([slow], previous=load_export(record)), record)  # a third render
    assert [r.reason for r in detect_regressions([slow], load_export(record))] == [r.reason for r in flagged]
    # The next run is compared with the slow one it follows.
    same_as_slow = row(run="r3", levels=[level(1, 50, 50, 50)])
    assert detect_regressions([same_as_slow], load_export(record)) == []


def test_the_record_keeps_no_host_paths_and_pids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    model = tmp_path / ".servematrix" / "models" / "tiny-llama"
    r = row(
        metrics={"model": str(model), "base_url": "http://127.0.0.1:4000", "levels": [level(1, 1, 2, 3)]},
        argv=["transformers", "serve", str(model), "--port", "4000", "/models/glm5"],
        log_path=str(tmp_path / "logs" / "c1.log"),
        server_pid=123,
        harness_pid=456,
    )
    record = export_results([r])
    cell = record["cells"]["c1"]
    assert cell["argv"] == ["transformers", "serve", ".servematrix/models/tiny-llama", "--port", "4000", "/models/glm5"]
    assert str(tmp_path) not in json.dumps(record)
    assert "server_pid" not in cell and "log_path" not in cell
    assert spreads(cell["metrics"]) == {1: {"min": 1.0, "median": 2.0, "max": 3.0}}
    assert published_rows(record)[0]["verdict"] == "pass"
    assert portable_argv(["/elsewhere/x"], tmp_path) == ["/elsewhere/x"]
    # A run in another folder (a worktree) built its model in its own workdir: published from there on.
    assert portable_argv(["--model-path", "/wt/.servematrix/models/m"], tmp_path) == [
        "--model-path",
        ".servematrix/models/m",
    ]


def test_a_file_that_is_not_a_record_is_refused(tmp_path: Path):
    path = tmp_path / "latest.json"
    assert load_export(path) is None
    path.write_text('{"cells": []}')
    with pytest.raises(ValueError, match="not a servematrix results export"):
        load_export(path)


# --------------------------------------------------------------- a real slowdown, made on purpose


WORKLOAD = Workload(
    concurrency=(1, 4), input_len=8, output_len=24, prompts_per_concurrency=8, warmup=1, repeats=3, api="chat"
)
TOKEN_DELAY_S = 0.004
THROTTLE = 3  # the deliberate slowdown: three times the per-token delay


def measured(server: FakeOpenAIServer, run_id: str) -> Row:
    """A row as the pipeline stores it, with metrics from the real benchmark client."""
    report = run_workload_sync(server.base_url, "fake", WORKLOAD)
    assert report.error_count == 0
    return row(cell="fake-cell", run=run_id, metrics=report.to_dict(), argv=["fake-server", "--port", "0"])


@pytest.mark.slow
def test_a_server_throttled_on_purpose_is_flagged_and_an_unchanged_rerun_is_not(tmp_path: Path):
    docs = tmp_path / "docs"
    record = docs / "results" / "latest.json"
    with FakeOpenAIServer(FakeBehavior(token_delay_s=TOKEN_DELAY_S)) as server:
        first = measured(server, "run-1")
        unchanged = measured(server, "run-2-unchanged")
        # THROTTLED ON PURPOSE: the same server, now waiting three times as long per token.
        server.set_behavior(FakeBehavior(token_delay_s=TOKEN_DELAY_S * THROTTLE))
        throttled = measured(server, "run-3-throttled-on-purpose")

    initial = build_report([first], docs, baseline=record)
    assert initial.baseline is None and initial.regressions == ()

    rerun = build_report([unchanged], docs, baseline=record)
    assert rerun.baseline == record
    assert rerun.regressions == (), [str(r) for r in rerun.regressions]
    assert "No regressions against the published results (results/latest.json)." in rerun.markdown.read_text()

    slowed = build_report([throttled], docs, baseline=record)
    assert {r.concurrency for r in slowed.regressions} == {1, 4}, [str(r) for r in slowed.regressions]
    for reg in slowed.regressions:
        assert reg.kind == "throughput" and reg.cell_id == "fake-cell"
        assert reg.drop is not None and reg.drop > 0.5  # a third of the speed, give or take the overhead
    text = slowed.markdown.read_text()
    assert "**🔻 2 regression(s)** against the published results (results/latest.json):" in text
    assert "| 🔻 |" not in text and " 🔻 |" in text  # the slower tok/s values carry the mark
    html = slowed.html.read_text()
    assert "🔻 2 regression(s) against the published results" in html
    assert 'data-regressed="1"' in html

    # Rendering the throttled results again still flags them; the record says what they were compared with.
    again = build_report([throttled], docs, baseline=record)
    assert [r.reason for r in again.regressions] == [r.reason for r in slowed.regressions]
    assert json.loads(record.read_text())["cells"]["fake-cell"]["previous"]["run_id"] == "run-2-unchanged"


def test_the_published_record_names_no_host_path():
    from servematrix.report.regressions import scrub_host_paths

    frame = 'File "/tmp/site/kernels/layer/layer.py", line 117'
    venv = 'File "/work/x/.servematrix/cache/import/venvs/ab/lib/python3.12/site-packages/transformers/a.py"'
    assert scrub_host_paths(frame) == 'File ".../kernels/layer/layer.py", line 117'
    assert scrub_host_paths(venv) == 'File ".../site-packages/transformers/a.py"'
    assert scrub_host_paths("existing environment /tmp/py-kernels: 3 differences") == (
        "existing environment .../py-kernels: 3 differences"
    )
    assert scrub_host_paths("sglang 0.5.12, 1/2 starts, http://127.0.0.1:30000/v1") == (
        "sglang 0.5.12, 1/2 starts, http://127.0.0.1:30000/v1"
    )
    exported = export_results([row(verdict="fail:x", excerpt=frame, evidence=["existing environment /tmp/py"])])
    assert "/tmp/" not in json.dumps(exported)
