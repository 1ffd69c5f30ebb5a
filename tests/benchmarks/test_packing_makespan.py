"""Packing on a host of several GPUs: the makespan of a packed run against its lower bound, and against running
the same cells one environment at a time (the runner without packing), both measured in this run.

A CPU host with 4 stand-in GPUs (SERVEMATRIX_STANDIN_GPUS) and the fake backend serving the FAKE multi-GPU
server (tests/fakes/fake_multi_gpu_server.py), which is ready after a delay per GPU kind: one 4-GPU job, two
2-GPU jobs and four 1-GPU jobs. The times include what a job costs besides its server (a process, the plan,
the store), as on a GPU host; the servers' delays stand in for model loading and benchmarking.
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from rich.console import Console

from servematrix.planning.plan import make_plan
from servematrix.planning.schedule import lower_bound, makespan, stored_spans
from servematrix.run.pipeline import run_plan
from servematrix.run.runplan import RunOptions
from servematrix.store.store import Store
from tests.fakes.fake_backend import FakeBackend
from tests.fakes.fake_backend_harness import FAKE_MULTI_GPU_SERVER
from tests.integration.test_packing import MIXED, standin  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.slow]


def _run(tmp_path: Path, name: str, select: tuple[str, ...] = ()) -> float:
    matrix = tmp_path / "m.toml"
    plan = make_plan(matrix, select)
    started = time.perf_counter()
    summary = run_plan(
        plan,
        FakeBackend(tmp_path, server=FAKE_MULTI_GPU_SERVER),
        RunOptions(stages=("build", "serve"), store=tmp_path / f"{name}.sqlite", workdir=tmp_path / f"wd-{name}"),
        console=Console(file=io.StringIO()),
    )
    seconds = time.perf_counter() - started
    assert set(summary.verdicts.values()) == {"pass"}
    return seconds


def test_packed_makespan_against_its_lower_bound_and_one_at_a_time(standin, tmp_path):  # noqa: F811
    standin(4)
    (tmp_path / "m.toml").write_text(MIXED.format(one=2, two=4, four=3))
    envs = make_plan(tmp_path / "m.toml").environments
    packed_s = _run(tmp_path, "packed")
    with Store(tmp_path / "packed.sqlite") as store:
        spans = stored_spans(store.packed_jobs())
    one_at_a_time_s = sum(_run(tmp_path, f"alone-{env}", (f"env={env}",)) for env in envs)
    bound = lower_bound(spans, 4)
    print(
        f"\n{len(envs)} environments (one 4-GPU, two 2-GPU, four 1-GPU) on 4 stand-in GPUs, CPU host: packed "
        f"makespan {makespan(spans):.1f} s (the run {packed_s:.1f} s), lower bound {bound:.1f} s "
        f"({makespan(spans) / bound:.2f}x); one environment at a time {one_at_a_time_s:.1f} s "
        f"({one_at_a_time_s / packed_s:.2f}x the packed run)"
    )
    assert len(spans) == len(envs) == 7
    assert packed_s < one_at_a_time_s
