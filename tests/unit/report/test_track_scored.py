"""The scores of GPU runs' own predictions (report/history/track.py `scored`, issue 47): what counts as a
pre-flight's prediction, and a prediction that rests on no pre-flight that ran."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from servematrix.planning.plan import make_plan
from servematrix.records.row import Row
from servematrix.report.history import track
from servematrix.report.publish import store_rows
from servematrix.run.pipeline import run_plan
from servematrix.run.runplan import RunOptions
from tests.fakes.fake_backend import MATRIX, FakeBackend

RESOLVED = {"key": "k", "outcome": "resolved"}
UNAVAILABLE = {"key": "k", "outcome": "unavailable", "evidence": ["no interpreter in a container"]}


def _row(prediction: str, verdict: str = "pass", **preflight: Any) -> Row:
    return Row.of(
        {
            "cell_id": "c1",
            "run_id": "r1",
            "engine": "toyserve",
            "verdict": verdict,
            "prediction": prediction,
            "preflight": preflight,
            "host": {"gpu_sku": "h100"},
            "stages": {"build": 1.0, "serve": 2.0},
            "finished_at": "2026-12-06T10:00:00Z",
        }
    )


def test_resolve_is_no_pre_flight_prediction():
    """Every served cell resolved: that stage predicts nothing about serving, and was scored 'not comparable:
    it could not run there (resolved)' beside each real pre-flight."""
    found = track.scored([_row("pass", resolve=RESOLVED, trace={"key": "k", "outcome": "passed"})])
    assert found.by_engine == {"toyserve": {track.CONFIRMED: 1}}
    assert set(found.by_preflight) == {("toyserve", "trace")}
    assert found.why == {}


def test_a_pass_predicted_by_no_pre_flight_that_ran_is_not_comparable():
    """Each pre-flight could not run on the served interpreter: its `pass` was no prediction, not a confirmed
    one (neither in the per-engine scores nor in the record's 'passed the pre-flights' class)."""
    rows = [_row("pass", resolve=RESOLVED, load=UNAVAILABLE)]
    found = track.scored(rows)
    assert found.by_engine == {"toyserve": {track.NOT_COMPARABLE: 1}}
    assert found.why[track.NOTHING_RAN] == 1
    assert found.by_preflight[("toyserve", "load")] == {track.NOT_COMPARABLE: 1}
    assert track.track_record(None, rows).compared == 0
    # A predicted failure is a prediction whatever else could not run.
    failed = [_row("predicted-fail:x", resolve=RESOLVED, load=UNAVAILABLE)]
    assert track.scored(failed).by_engine == {"toyserve": {track.CONTRADICTED: 1}}
    assert track.track_record(None, failed).compared == 1


def test_a_cell_whose_engine_has_no_pre_flight_stores_no_prediction(tmp_path):
    """cpu-smoke's shape (transformers on the CPU; its data lists no pre-flight): nothing ran on the served
    interpreter, so its row has no prediction and no 'predicted pass on this interpreter: confirmed'."""
    matrix = tmp_path / "m.toml"
    matrix.write_text(MATRIX.format(server=""))
    store = tmp_path / "s.sqlite"
    options = RunOptions(stages=("build", "probe", "serve"), store=store, workdir=tmp_path / "work")
    plan = make_plan(matrix, ["mode=static", "transformers=5.24.0"])
    summary = run_plan(plan, FakeBackend(tmp_path), options, console=Console(file=io.StringIO()))
    assert set(summary.verdicts.values()) == {"pass"}
    (row,) = store_rows(store)
    assert row["prediction"] is None
    assert not any("on this interpreter" in line for line in row["evidence"])
