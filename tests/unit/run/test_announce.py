"""What `run` announces before it starts is what it will do: the cells it will run (not those unchanged since
their last finished run), only the stages they will go through, and the costly steps with their totals."""

from __future__ import annotations

import dataclasses
import json

import pytest

from servematrix.planning.plan import make_plan
from servematrix.run import hostinfo
from servematrix.run.runplan import RunOptions, cell_stages, inputs_hash, planned_work, preamble
from servematrix.store.store import Store
from tests.conftest import MATRIX, SMALL_SGLANG


def _host(monkeypatch: pytest.MonkeyPatch, *archs: str) -> None:
    gpus = tuple(hostinfo.Gpu(name="NVIDIA test", arch=arch, driver="580") for arch in archs)
    fake = hostinfo.Host(hostname="h", cpu="c", cpus=2, os="Linux", gpus=gpus)
    monkeypatch.setattr(hostinfo, "host", lambda: fake)


def _finish_all(plan, options: RunOptions) -> None:
    with Store(options.store) as store:
        for cell in plan.cells:
            store.record(
                run_id="r1",
                cell_id=cell.id,
                env_id=cell.env_id,
                engine=cell.env.engine,
                mode=cell.mode,
                matrix=str(plan.spec.path),
                axes=dict(cell.env.axes),
                inputs_hash=inputs_hash(plan, cell, options.stages),
                verdict="skipped:no-gpu",
            )


def test_a_gpu_matrix_on_a_cpu_host_announces_only_the_cpu_stages(monkeypatch, tmp_path, write_matrix):
    _host(monkeypatch)
    plan = make_plan(write_matrix(SMALL_SGLANG), [], None)
    options = RunOptions(workdir=tmp_path, store=tmp_path / "s.sqlite", lock_dir=tmp_path / "locks")
    work = planned_work(plan, options)
    assert work.stages == ("resolve", "import", "probe")  # not build, serve, bench: they cannot run here
    assert work.to_run == len(plan.cells)
    (step,) = work.steps
    # No lock yet: every import check waits on its resolve, so each is counted as one that may run.
    assert (step.stage, step.count, step.maybe) == ("import", 0, len({c.env_id for c in plan.cells if c.applicable}))
    assert not (tmp_path / "s.sqlite").exists()  # announcing creates no store


def test_an_unchanged_rerun_announces_nothing_to_install(monkeypatch, tmp_path, write_matrix):
    _host(monkeypatch)
    plan = make_plan(write_matrix(SMALL_SGLANG), [], None)
    options = RunOptions(workdir=tmp_path, store=tmp_path / "s.sqlite")
    before = "\n".join(preamble(plan, options))
    assert "import:" in before and "trace probe" in before
    _finish_all(plan, options)
    lines = preamble(plan, options)
    assert (
        lines[1]
        == f"nothing to run: {len(plan.cells)} unchanged since their last finished run (--rerun runs them again)"
    )
    text = "\n".join(lines)
    assert "import:" not in text and "trace probe" not in text and "GB of disk" not in text
    rerun = "\n".join(preamble(plan, RunOptions(workdir=tmp_path, store=options.store, rerun=True)))
    assert "import:" in rerun  # --rerun runs them all again, and says so


def test_a_lock_whose_import_check_is_cached_is_not_counted(monkeypatch, tmp_path, write_matrix):
    from servematrix.stages import importcheck

    _host(monkeypatch)
    plan = make_plan(write_matrix(SMALL_SGLANG), [], None)
    locks = tmp_path / "locks"
    locks.mkdir()
    env_ids = sorted({c.env_id for c in plan.cells if c.applicable})
    for env_id in env_ids:
        (locks / f"{env_id}.lock.txt").write_text(f"# header\npkg-{env_id}==1.0 \\\n    --hash=sha256:00\n")
    options = RunOptions(workdir=tmp_path, lock_dir=locks, store=tmp_path / "s.sqlite")
    (step,) = planned_work(plan, options).steps
    assert (step.count, step.maybe) == (len(env_ids), 0)
    first = locks / f"{env_ids[0]}.lock.txt"
    key = importcheck.lock_key(first, plan.spec.engine)
    result = tmp_path / "cache" / "import" / "results" / f"{key}.json"
    result.parent.mkdir(parents=True)
    checked = importcheck.ImportCheck(outcome="pass", evidence="imported sglang")
    result.write_text(json.dumps({"schema": importcheck.RESULT_SCHEMA, "result": dataclasses.asdict(checked)}))
    assert importcheck.recorded(first, plan.spec.engine, cache_dir=tmp_path / "cache") is not None
    (step,) = planned_work(plan, options).steps
    assert (step.count, step.maybe) == (len(env_ids) - 1, 0)


def test_the_cpu_engine_announces_the_stages_it_runs(monkeypatch, tmp_path):
    _host(monkeypatch)
    plan = make_plan(MATRIX / "cpu-smoke.toml", [], None)
    work = planned_work(plan, RunOptions(workdir=tmp_path, store=tmp_path / "s.sqlite"))
    # The CPU engine has no pre-flight of its own, and the import check runs only where GPUs are lacking.
    assert work.stages == ("resolve", "build", "serve", "bench")
    assert work.steps == () and work.lacking == ()


def test_serve_needs_a_build_and_bench_a_serve(monkeypatch, write_matrix):
    _host(monkeypatch, *["sm_100"] * 8)
    plan = make_plan(write_matrix(SMALL_SGLANG), [], None)
    cell = next(c for c in plan.cells if c.applicable)
    assert cell_stages(plan, cell, ("resolve", "serve", "bench")) == ("resolve",)
    assert cell_stages(plan, cell, ("resolve", "build", "probe", "serve", "bench")) == (
        "resolve",
        "build",
        "probe",
        "serve",
        "bench",
    )
    assert cell_stages(plan, cell, ("resolve", "import")) == ("resolve",)  # with the GPUs here, no import check
