"""The runner's decisions for one cell, through the real pipeline and store, with the test-defined engine
`toyserve` (its own pre-flight) and the fake backend: what ends a cell where, and what a pre-flight that
cannot run, or that has a bug, does to it."""

from __future__ import annotations

import dataclasses
import io
import sys

import pytest
from rich.console import Console

from servematrix.engines import ENGINES_PATH_ENV
from servematrix.engines.hooks import PreflightUnavailable
from servematrix.formats.verdict import Verdict
from servematrix.planning.plan import make_plan
from servematrix.run import hostinfo
from servematrix.run.pipeline import run_plan
from servematrix.run.runplan import RunOptions, cell_stages, planned_work
from servematrix.store.store import Store
from tests.fakes import toy_engine
from tests.fakes.fake_backend import FakeBackend
from tests.unit.engines.test_engine_plugins import TOY_ENGINES, TOY_MATRIX


@pytest.fixture
def toy(monkeypatch, tmp_path):
    monkeypatch.setenv(ENGINES_PATH_ENV, str(TOY_ENGINES))

    def run(matrix_text: str = TOY_MATRIX, stages=("probe", "build", "serve"), **options):
        matrix = tmp_path / "toy.toml"
        matrix.write_text(matrix_text)
        plan = make_plan(matrix)
        out = io.StringIO()
        summary = run_plan(
            plan,
            FakeBackend(tmp_path),
            RunOptions(stages=stages, store=tmp_path / "s.sqlite", workdir=tmp_path / "work", **options),
            console=Console(file=out, width=200),
        )
        by_key = {(c.env.version, c.mode): summary.verdicts.get(c.id) for c in plan.cells}
        return by_key, out.getvalue()

    return run


def test_a_preflight_failure_ends_its_cell_and_the_others_are_served(toy):
    verdicts, _ = toy()
    assert verdicts == {
        ("1.4", "short"): "pass",
        ("1.4", "long"): "fail:context-too-long",
        ("2.1", "short"): "pass",
        ("2.1", "long"): "pass",
    }


def test_a_preflight_that_cannot_run_here_predicts_nothing_and_says_so(toy, monkeypatch):
    def unavailable(inp):
        raise PreflightUnavailable(f"the wheel of {inp.cell.env.version} could not be downloaded")

    monkeypatch.setitem(toy_engine.PREFLIGHTS, "context-limit", unavailable)
    verdicts, said = toy()
    assert set(verdicts.values()) == {"pass"}  # the serving stages decided
    # Each reason once (two versions, four cells), on one line.
    lines = [line for line in said.splitlines() if "context-limit pre-flight could not run" in line]
    assert len(lines) == 2 and [("1.4" in lines[0]), ("2.1" in lines[1])] == [True, True]


def test_a_bug_in_a_preflight_is_a_harness_error_not_a_silent_pass(toy, monkeypatch):
    def buggy(inp):
        raise KeyError("max_len")

    monkeypatch.setitem(toy_engine.PREFLIGHTS, "context-limit", buggy)
    verdicts, _ = toy()
    assert set(verdicts.values()) == {"error:harness"}  # retried next run, never published as a verdict


def test_on_a_host_without_the_gpus_the_preflight_decides_and_the_rest_is_skipped(toy, monkeypatch):
    monkeypatch.setattr(hostinfo, "host", lambda: hostinfo.Host(hostname="h", cpu="c", cpus=2, os="Linux", gpus=()))
    gpu_matrix = TOY_MATRIX.replace('gpu = ["cpu"]', 'gpu = ["b200"]').replace(
        '[gpu.cpu]\narch = "cpu"\ncount = 0', '[gpu.b200]\narch = "sm_100"\ncount = 8'
    )
    verdicts, _ = toy(gpu_matrix)
    assert verdicts[("1.4", "long")] == "fail:context-too-long"  # known without a GPU
    assert {v for k, v in verdicts.items() if k != ("1.4", "long")} == {"skipped:no-gpu"}


def test_stages_left_out_end_a_cell_as_skipped_not_passed(toy, tmp_path):
    verdicts, _ = toy(stages=("probe", "build"))
    assert verdicts[("1.4", "long")] == "fail:context-too-long"
    assert {v for k, v in verdicts.items() if k != ("1.4", "long")} == {"skipped:stages"}
    with Store(tmp_path / "s.sqlite") as store:
        assert not [r for r in store.all_rows() if r["verdict"] == "pass"]


def test_a_mode_the_version_does_not_have_is_skipped_with_the_engines_reason(toy, tmp_path):
    verdicts, _ = toy(TOY_MATRIX.replace('toyserve = ["1.4", "2.1"]', 'toyserve = ["0.9"]'))
    assert verdicts == {("0.9", "short"): "pass", ("0.9", "long"): "skipped:not-applicable"}
    with Store(tmp_path / "s.sqlite") as store:
        row = next(r for r in store.all_rows() if r["mode"] == "long")
    assert row["excerpt"] == "toyserve has no long context before 1.0"


class _StreamingBackend(FakeBackend):
    """The fake backend, serving the fake streaming server (servematrix.stages.bench_fake) so the bench runs."""

    def launch(self, built, argv, env, port, *, model_dir):
        spec = super().launch(built, argv, env, port, model_dir=model_dir)
        return dataclasses.replace(
            spec, argv=(sys.executable, "-m", "servematrix.stages.bench_fake", "--port", str(port))
        )


def test_a_mode_that_changes_prefill_makes_every_cell_run_the_prefill_profile(monkeypatch, tmp_path):
    # The toy engine with its `long` mode declared a prefill feature: every served cell (the other mode too,
    # which it is compared with) runs [bench.prefill] before the decode profile, and both are stored.
    engines = tmp_path / "engines"
    engines.mkdir()
    data = (TOY_ENGINES / "toyserve.toml").read_text()
    (engines / "toyserve.toml").write_text(
        data.replace("[requirements]", '[phases]\nlong = "prefill"\n\n[requirements]')
    )
    monkeypatch.setenv(ENGINES_PATH_ENV, f"{engines}:{TOY_ENGINES}")
    matrix = tmp_path / "toy.toml"
    matrix.write_text(
        TOY_MATRIX.replace('toyserve = ["1.4", "2.1"]', 'toyserve = ["2.1"]')
        + "[bench.prefill]\nconcurrency = [1, 2]\ninput_len = 64\nprompts_per_concurrency = 2\nwarmup = 0\nrepeats = 2\n"
    )
    plan = make_plan(matrix)
    options = RunOptions(stages=("build", "serve", "bench"), store=tmp_path / "s.sqlite", workdir=tmp_path / "w")
    summary = run_plan(plan, _StreamingBackend(tmp_path), options, console=Console(file=io.StringIO()))
    assert set(summary.verdicts.values()) == {"pass"}
    with Store(tmp_path / "s.sqlite") as store:
        rows = store.latest()
    assert {r["mode"] for r in rows} == {"short", "long"}
    for row in rows:
        metrics = row["metrics"]
        assert metrics["workload"]["profile"] == "decode" and [lv["concurrency"] for lv in metrics["levels"]] == [1]
        prefill = metrics["prefill"]
        assert prefill["workload"]["profile"] == "prefill" and prefill["workload"]["input_len"] == 64
        assert prefill["workload"]["output_len"] == 1
        assert [lv["concurrency"] for lv in prefill["levels"]] == [1, 2]
        assert all(run["ttft"]["mean"] > 0 and run["input_tok_s"] > 0 for lv in prefill["levels"] for run in lv["runs"])


def test_what_a_passing_preflight_found_stands_in_the_skipped_cells_evidence(toy, monkeypatch, tmp_path):
    # A pre-flight that passes with evidence (the FP4 trace probe's "traces for sm_100") lets the cell go on,
    # and a host without the GPUs shows it: the reason the CPU did not rule the cell out.
    monkeypatch.setattr(hostinfo, "host", lambda: hostinfo.Host(hostname="h", cpu="c", cpus=2, os="Linux", gpus=()))

    def looked(inp):
        return toy_engine.context_limit(inp) or Verdict(kind="pass", evidence=(f"context: fine for {inp.cell.mode}",))

    monkeypatch.setitem(toy_engine.PREFLIGHTS, "context-limit", looked)
    gpu_matrix = TOY_MATRIX.replace('gpu = ["cpu"]', 'gpu = ["b200"]').replace(
        '[gpu.cpu]\narch = "cpu"\ncount = 0', '[gpu.b200]\narch = "sm_100"\ncount = 8'
    )
    verdicts, _ = toy(gpu_matrix)
    assert verdicts[("1.4", "long")] == "fail:context-too-long"  # a failure still ends the cell
    with Store(tmp_path / "s.sqlite") as store:
        rows = {(r["axes"]["toyserve"], r["mode"]): r for r in store.latest()}
    assert rows[("2.1", "long")]["verdict"] == "skipped:no-gpu"
    assert rows[("2.1", "long")]["evidence"][0] == "context: fine for long"
    assert rows[("1.4", "short")]["evidence"][0] == "context: fine for short"


@pytest.mark.parametrize("gpus_here", [True, False], ids=["gpus-here", "no-gpus"])
def test_each_cell_goes_through_the_stages_the_run_announced(toy, monkeypatch, tmp_path, gpus_here):
    """One decision (`runplan.cell_stages`): the announcement counts it and the runner follows it, so the
    stages a cell's row timed are those the run said it would go through, on a host with its GPUs or without."""
    matrix = TOY_MATRIX
    if not gpus_here:
        monkeypatch.setattr(hostinfo, "host", lambda: hostinfo.Host(hostname="h", cpu="c", cpus=2, os="Linux", gpus=()))
        matrix = TOY_MATRIX.replace('gpu = ["cpu"]', 'gpu = ["b200"]').replace(
            '[gpu.cpu]\narch = "cpu"\ncount = 0', '[gpu.b200]\narch = "sm_100"\ncount = 8'
        )
    stages = ("probe", "build", "serve")
    toy(matrix, stages=stages)
    plan = make_plan(tmp_path / "toy.toml")
    announced = planned_work(plan, RunOptions(stages=stages, store=tmp_path / "none.sqlite", workdir=tmp_path / "w"))
    assert announced.stages == (("build", "probe", "serve") if gpus_here else ("probe",))
    timed = {"resolve", "import", "build", "probe"}  # the stages a row times (serve and bench keep their own)
    with Store(tmp_path / "s.sqlite") as store:
        ran_by_cell = {r.cell_id: set(r.stages or {}) for r in store.all_rows()}
    for cell in (c for c in plan.cells if c.applicable):
        ran = ran_by_cell[cell.id]
        assert ran & timed == set(cell_stages(plan, cell, stages)) & timed, (cell.env.version, cell.mode, ran)
