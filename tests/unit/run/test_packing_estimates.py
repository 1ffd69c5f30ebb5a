"""How long a packed job is expected to take, from what the store knows: its last packed run, else its cells'
last served runs, else the mean of the others."""

from __future__ import annotations

from types import SimpleNamespace

from servematrix.run.packing import estimates, plan_jobs
from servematrix.store.store import Store


def _row(cell_id: str, env_id: str, seconds: int, *, served: bool = True) -> dict:
    return {
        "run_id": "20260101T000000-aaaaaa",
        "cell_id": cell_id,
        "env_id": env_id,
        "engine": "toyserve",
        "mode": "short",
        "matrix": "m.toml",
        "axes": {"toyserve": "2.1"},
        "inputs_hash": "h",
        "verdict": "pass" if served else "skipped:no-gpu",
        "stages": {"build": 1.0, "serve": 3.0} if served else {},
        "started_at": "2026-01-01T00:00:00+00:00",
        "finished_at": f"2026-01-01T00:00:{seconds:02d}+00:00",
    }


def _cells(env_id: str, *ids: str) -> list:
    return [SimpleNamespace(id=i, env=SimpleNamespace(gpu=SimpleNamespace(count=2))) for i in ids]


def test_a_job_is_estimated_from_its_last_packed_run_else_its_cells_last_served_runs(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        store.record_packed_job(
            run_id="r1",
            env_id="a",
            host_gpus=4,
            gpus=(0, 1),
            cpus=(0,),
            cells=2,
            estimate_s=1.0,
            start_s=3.0,
            end_s=45.0,
        )
        store.record_packed_job(  # still running (a killed run): says nothing
            run_id="r2", env_id="b", host_gpus=4, gpus=(2, 3), cpus=(1,), cells=2, estimate_s=1.0, start_s=0.0
        )
        store.record(**_row("b1", "b", 10))
        store.record(**_row("b2", "b", 5))
        store.record(**_row("c1", "c", 50, served=False))  # decided without serving: not how long serving takes
        envs = {"a": _cells("a", "a1"), "b": _cells("b", "b1", "b2"), "c": _cells("c", "c1")}
        known = estimates(store, envs)
    assert known == {"a": 42.0, "b": 15.0, "c": None}
    jobs = {job.key: job for job in plan_jobs(envs, known)}
    assert jobs["c"].estimate_s == (42.0 + 15.0) / 2  # never ran: the mean of the others
    assert {job.gpus for job in jobs.values()} == {2}


def test_with_no_history_every_job_is_alike(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        envs = {"a": _cells("a", "a1"), "b": _cells("b", "b1")}
        known = estimates(store, envs)
    assert known == {"a": None, "b": None}
    assert {job.estimate_s for job in plan_jobs(envs, known)} == {1.0}
