"""The runner's decisions for one cell, through the real pipeline and store, with the test-defined engine
`toyserve` (its own pre-flight) and the fake backend: what ends a cell where, and what a pre-flight that
cannot run, or that has a bug, does to it."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from servematrix import hostinfo
from servematrix.engines import ENGINES_PATH_ENV, PreflightUnavailable
from servematrix.pipeline import RunOptions, run_plan
from servematrix.plan import make_plan
from servematrix.store import Store
from tests.fakes import toy_engine
from tests.fakes.fake_backend import FakeBackend
from tests.unit.test_engine_plugins import TOY_ENGINES, TOY_MATRIX


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
