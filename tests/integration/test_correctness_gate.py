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


class _CountsStarts(_HealthyBackend):
    launches = 0

    def launch(self, built, argv, env, port, *, model_dir):
        type(self).launches += 1
        return super().launch(built, argv, env, port, model_dir=model_dir)


def _stopped_after_one_start_per_mode(monkeypatch, tmp_path):
    """A two-start toy matrix whose first run is stopped when its third start is launched: each mode served
    once. Returns the plan and the store's rows of that run, by mode."""
    monkeypatch.setenv(ENGINES_PATH_ENV, str(TOY_ENGINES))
    matrix = tmp_path / "toy.toml"
    matrix.write_text(
        TOY_MATRIX.replace('toyserve = ["1.4", "2.1"]', 'toyserve = ["2.1"]').replace(
            "prompts_per_concurrency = 2", "prompts_per_concurrency = 2\nstarts = 2"
        )
    )
    options = RunOptions(stages=("build", "serve", "bench"), store=tmp_path / "s.sqlite", workdir=tmp_path / "w")
    _StopsAtThirdStart.launches = 0
    with pytest.raises((KeyboardInterrupt, SystemExit)):
        run_plan(make_plan(matrix), _StopsAtThirdStart(tmp_path), options, console=Console(file=io.StringIO()))
    with Store(tmp_path / "s.sqlite") as store:
        return matrix, {r["mode"]: r for r in store.all_rows()}


def test_a_run_stopped_between_starts_keeps_the_figures_of_the_starts_that_ended(monkeypatch, tmp_path):
    _, rows = _stopped_after_one_start_per_mode(monkeypatch, tmp_path)
    for mode in ("short", "long"):  # each served once before the stop: its start's figures are in its row
        metrics = rows[mode]["metrics"]
        assert metrics["levels"][0]["runs"] and metrics["correctness"]["key"]["prompt_set"] == "greedy-v1"


@pytest.mark.parametrize("rerun", [False, True])
def test_the_next_run_serves_only_the_starts_a_stopped_run_left(monkeypatch, tmp_path, rerun):
    """A device call's or a job's time limit must not cost the starts that ended: the next run resumes them
    (their figures, proof and the baseline's answers), unless --rerun asks for everything again."""
    matrix, stopped = _stopped_after_one_start_per_mode(monkeypatch, tmp_path)
    first_runs = {mode: stopped[mode]["metrics"]["levels"][0]["runs"] for mode in ("short", "long")}
    _CountsStarts.launches = 0
    options = RunOptions(
        stages=("build", "serve", "bench"), store=tmp_path / "s.sqlite", workdir=tmp_path / "w", rerun=rerun
    )
    summary = run_plan(make_plan(matrix), _CountsStarts(tmp_path), options, console=Console(file=io.StringIO()))

    assert sorted(summary.verdicts.values()) == ["pass", "pass"]
    assert _CountsStarts.launches == (4 if rerun else 2)
    with Store(tmp_path / "s.sqlite") as store:
        rows = {r["mode"]: r for r in store.latest()}
    for mode in ("short", "long"):
        row = rows[mode]
        metrics = row["metrics"]
        assert row["run_id"] == summary.run_id and metrics["starts"] == 2
        assert "finished_starts" not in metrics  # the decided record holds the pooled figures alone
        runs = metrics["levels"][0]["runs"]
        assert {run["start"] for run in runs} == {1, 2}
        first = [{k: v for k, v in run.items() if k != "start"} for run in runs if run["start"] == 1]
        stored = [{k: v for k, v in run.items() if k != "start"} for run in first_runs[mode]]
        assert (first == stored) is not rerun  # resumed: start 1 is the stopped run's, figure for figure
        resumed = [e for e in row["evidence"] if "resumed from run" in e]
        assert resumed == (
            []
            if rerun
            else [f"1 server start(s) resumed from run {stopped[mode]['run_id']}, stopped before it decided the cell"]
        )
    # The resumed baseline's answers were this run's: the other mode was checked against them.
    assert "unchecked" not in rows["long"]["metrics"]["correctness"]["summary"]


class _OtherInstalledSet(_CountsStarts):
    """The same inputs served from other packages, as `--backend existing` sees a changed bundle."""

    def build(self, request, log_path):
        return dataclasses.replace(super().build(request, log_path), lock_hash="another installed set")


def test_starts_served_from_another_installed_set_are_not_resumed(monkeypatch, tmp_path):
    matrix, _ = _stopped_after_one_start_per_mode(monkeypatch, tmp_path)
    _OtherInstalledSet.launches = 0
    options = RunOptions(stages=("build", "serve", "bench"), store=tmp_path / "s.sqlite", workdir=tmp_path / "w")
    out = io.StringIO()
    summary = run_plan(make_plan(matrix), _OtherInstalledSet(tmp_path), options, console=Console(file=out, width=300))
    assert sorted(summary.verdicts.values()) == ["pass", "pass"]
    assert _OtherInstalledSet.launches == 4  # every start again
    assert "are not resumed: they were served from another installed set (fake, now another installed set)" in (
        out.getvalue()
    )


class _FallsBackInOneMode(_HealthyBackend):
    """The toy engine's `long` mode prints the two lines sglang 0.5.15 printed on the H200 when its own
    model module did not import and it served through its Transformers fallback, then serves all the same."""

    def launch(self, built, argv, env, port, *, model_dir):
        spec = super().launch(built, argv, env, port, model_dir=model_dir)
        if "4096" not in argv:
            return spec
        lines = (
            "[2026-12-05 04:10:12] Ignore import error when loading sglang.srt.models.deepseek_v2: "
            "No module named 'cutlass'\n"
            "[2026-12-05 04:10:20] GlmMoeDsaForCausalLM has no SGLang implementation, falling back to "
            "Transformers implementation. Some features may not be supported and performance may not be optimal.\n"
        )
        return dataclasses.replace(spec, argv=("sh", "-c", 'printf "%s" "$0"; exec "$@"', lines, *spec.argv))


def test_a_server_that_answered_through_a_fallback_fails_its_cell(monkeypatch, tmp_path):
    """The toy engine is given sglang's signature data (it has none of its own): the mode whose server fell
    back fails `transformers-fallback` with the skipped import as evidence and no figures; the other passes."""
    from servematrix.classify import scanner

    monkeypatch.setenv(ENGINES_PATH_ENV, str(TOY_ENGINES))
    sglang = scanner.load_signatures("sglang")
    monkeypatch.setattr(scanner, "load_signatures", lambda engine: sglang)
    summary = _run(tmp_path, _FallsBackInOneMode(tmp_path))
    assert sorted(summary.verdicts.values()) == ["fail:transformers-fallback", "pass"]
    with Store(tmp_path / "s.sqlite") as store:
        rows = {r["mode"]: r for r in store.latest()}
    fell_back = rows["long"]
    assert "sglang skipped its model modules: No module named 'cutlass'" in fell_back["evidence"]
    assert fell_back["excerpt"].startswith("the server answered, but:") and not fell_back["metrics"]
