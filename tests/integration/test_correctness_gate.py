"""The correctness gate through the real pipeline and store (issue 35): every mode's greedy answers against
the baseline mode's before any figure. A FAKE server (servematrix.stages.bench_fake) with a fault injected into
one mode (garbage tokens from position 3) must fail that mode `fail:wrong-output` with no figures, while the
baseline passes with its answers stored, and a later run checks a mode against those stored answers. The
real comparison (cpu-smoke's static and continuous batching on transformers serve) is in
test_interleaved_bench.py, which serves both modes anyway."""

from __future__ import annotations

import dataclasses
import io
import sys

import pytest
from rich.console import Console

from servematrix.engines import ENGINES_PATH_ENV
from servematrix.planning.plan import make_plan
from servematrix.run.pipeline import run_plan
from servematrix.run.runplan import RunOptions
from servematrix.store.store import Store
from tests.fakes.fake_backend import FakeBackend
from tests.unit.engines.test_engine_plugins import TOY_ENGINES, TOY_MATRIX

pytestmark = [pytest.mark.integration]


class _FaultyModeBackend(FakeBackend):
    """Serves the FAKE streaming server; the toy engine's `long` mode (`--max-len 4096`) serves garbage tokens."""

    def launch(self, built, argv, env, port, *, model_dir):
        spec = super().launch(built, argv, env, port, model_dir=model_dir)
        fake = [sys.executable, "-m", "servematrix.stages.bench_fake", "--port", str(port)]
        if "4096" in argv:
            fake += ["--wrong-tokens-from", "3"]
        return dataclasses.replace(spec, argv=tuple(fake))


class _HealthyBackend(FakeBackend):
    def launch(self, built, argv, env, port, *, model_dir):
        spec = super().launch(built, argv, env, port, model_dir=model_dir)
        return dataclasses.replace(
            spec, argv=(sys.executable, "-m", "servematrix.stages.bench_fake", "--port", str(port))
        )


def _run(tmp_path, backend, select: str = ""):
    matrix = tmp_path / "toy.toml"
    text = TOY_MATRIX.replace('toyserve = ["1.4", "2.1"]', 'toyserve = ["2.1"]')
    if select:  # leave a mode out
        text = text.replace("[gpu.cpu]", f'[[exclude]]\nmode = "{select}"\n\n[gpu.cpu]')
    matrix.write_text(text + "[bench.correctness]\nmax_tokens = 8\n")
    options = RunOptions(stages=("build", "serve", "bench"), store=tmp_path / "s.sqlite", workdir=tmp_path / "w")
    return run_plan(make_plan(matrix), backend, options, console=Console(file=io.StringIO()))


def test_a_mode_serving_wrong_tokens_fails_and_publishes_no_figures(monkeypatch, tmp_path):
    monkeypatch.setenv(ENGINES_PATH_ENV, str(TOY_ENGINES))
    summary = _run(tmp_path, _FaultyModeBackend(tmp_path))
    assert sorted(summary.verdicts.values()) == ["fail:wrong-output", "pass"]
    with Store(tmp_path / "s.sqlite") as store:
        rows = {r["mode"]: r for r in store.latest()}
    wrong = rows["long"]
    assert wrong["verdict"] == "fail:wrong-output" and not wrong["metrics"]
    assert "position 3" in wrong["excerpt"] and "'<pad>'" in wrong["excerpt"] and "top-k" in wrong["excerpt"]
    base = rows["short"]
    assert base["verdict"] == "pass" and base["metrics"]["levels"]
    stored = base["metrics"]["correctness"]
    assert stored["key"]["model"] == "m" and stored["key"]["prompt_set"] == "greedy-v1"
    assert set(stored["answers"]) == {"1", "2"} and any(
        "baseline's 16 greedy answers stored" in e for e in base["evidence"]
    )


def test_a_later_run_checks_a_mode_against_the_stored_baseline(monkeypatch, tmp_path):
    monkeypatch.setenv(ENGINES_PATH_ENV, str(TOY_ENGINES))
    first = _run(tmp_path, _HealthyBackend(tmp_path), select="long")  # the baseline alone
    assert list(first.verdicts.values()) == ["pass"]
    later = _run(tmp_path, _FaultyModeBackend(tmp_path), select="short")  # the faulty mode alone, later
    assert list(later.verdicts.values()) == ["fail:wrong-output"]


class _StopsAtThirdStart(_HealthyBackend):
    """The run is stopped (as a job's time limit would) when the third server start is launched."""

    launches = 0

    def launch(self, built, argv, env, port, *, model_dir):
        type(self).launches += 1
        if type(self).launches == 3:
            raise KeyboardInterrupt
        return super().launch(built, argv, env, port, model_dir=model_dir)


def test_a_run_stopped_between_starts_keeps_the_figures_of_the_starts_that_ended(monkeypatch, tmp_path):
    monkeypatch.setenv(ENGINES_PATH_ENV, str(TOY_ENGINES))
    matrix = tmp_path / "toy.toml"
    matrix.write_text(
        TOY_MATRIX.replace('toyserve = ["1.4", "2.1"]', 'toyserve = ["2.1"]').replace(
            "prompts_per_concurrency = 2", "prompts_per_concurrency = 2\nstarts = 2"
        )
    )
    options = RunOptions(stages=("build", "serve", "bench"), store=tmp_path / "s.sqlite", workdir=tmp_path / "w")
    with pytest.raises((KeyboardInterrupt, SystemExit)):
        run_plan(make_plan(matrix), _StopsAtThirdStart(tmp_path), options, console=Console(file=io.StringIO()))
    with Store(tmp_path / "s.sqlite") as store:
        rows = {r["mode"]: r for r in store.all_rows()}
    for mode in ("short", "long"):  # each served once before the stop: its start's figures are in its row
        metrics = rows[mode]["metrics"]
        assert metrics["levels"][0]["runs"] and metrics["correctness"]["key"]["prompt_set"] == "greedy-v1"
