"""The client's worker processes, its ceiling, level floors, speedups and CPU pinning (real subprocesses)."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from servematrix.stages import bench
from servematrix.stages.bench import (
    Ceiling,
    CeilingLevel,
    ClientPool,
    LevelSummary,
    Workload,
    measure_ceiling,
    run_workload_sync,
    speedup,
    split_cpus,
)
from tests.fakes.fake_openai_server import FakeBehavior, FakeOpenAIServer


@pytest.fixture
def fake():
    with FakeOpenAIServer() as srv:
        yield srv


def _workload(**kw) -> Workload:
    base = dict(concurrency=(4,), input_len=12, output_len=8, prompts_per_concurrency=10, warmup=4, repeats=2)
    base.update(kw)
    return Workload(**base)


def _ceiling(tok_s: float, concurrency: int = 4) -> Ceiling:
    level = CeilingLevel(concurrency=concurrency, tok_s=tok_s, cpu_s_per_1k_tokens=None, client_busy=None)
    return Ceiling(
        levels=(level,),
        client_processes=1,
        client_cpus=(),
        server_cpus=(),
        fake_processes=1,
        api="chat",
        output_len=8,
        measured_at=0.0,
    )


# -------------------------------------------------------------------------------------- worker processes


def test_several_processes_count_every_token_from_usage_and_report_cpu(fake):
    # 3 tokens per chunk and early stops: neither events nor max_tokens give the right count, only usage does.
    fake.set_behavior(FakeBehavior(tokens_per_chunk=3, early_eos_mod=5, usage="separate_chunk", send_done=True))
    w = _workload(client_processes=3, output_len=16)
    report = run_workload_sync(fake.base_url, "m", w)

    measured = fake.log[w.warmup :]
    assert report.error_count == 0 and len(measured) == w.repeats * w.prompts_per_concurrency
    assert report.completion_tokens == sum(e.completion_tokens for e in measured)
    assert report.completion_tokens != len(measured) * w.output_len  # early stops are really counted
    assert len({e.prompt for e in fake.log}) == len(fake.log)  # no prompt sent twice across workers
    level = report.levels[0]
    for run in level.runs:
        assert run.client_processes == 3 and run.completed == w.prompts_per_concurrency
        assert run.client_cpu_s > 0 and run.client_busy > 0
    assert level.client_cpu_s.min > 0 and level.client_cpu_s_per_1k_tokens > 0
    d = json.loads(json.dumps(report.to_dict()))
    assert d["levels"][0]["runs"][0]["client_cpu_s"] == level.runs[0].client_cpu_s
    assert d["client"]["processes"] == 3


def test_workers_are_pinned_to_the_client_cpus():
    cpu = max(os.sched_getaffinity(0))
    with ClientPool(2, cpus=[cpu]) as pool:
        pids = [p.pid for p in pool._procs]
        assert [os.sched_getaffinity(pid) for pid in pids] == [{cpu}, {cpu}]
    with ClientPool(1) as pool:  # no pinning asked: the workers keep this process's CPUs
        assert os.sched_getaffinity(pool._procs[0].pid) == os.sched_getaffinity(0)


def test_a_dead_worker_is_a_clear_error(fake):
    with ClientPool(1) as pool:
        pool._procs[0].kill()
        pool._procs[0].wait()
        with pytest.raises(RuntimeError, match=r"benchmark worker \d+ stopped \(exit -9\)"):
            pool.run_batch(fake.base_url + "/v1/chat/completions", [b"{}"], 1, api="chat", timeout_s=5)


# --------------------------------------------------------------------------------------------- ceiling


def test_ceiling_is_measured_against_the_fake_server():
    w = _workload(concurrency=(2,), output_len=32)
    ceiling = measure_ceiling(w, level_s=0.3, repeats=1)
    (level,) = ceiling.levels
    assert level.concurrency == 2 and level.tok_s > 0
    assert level.cpu_s_per_1k_tokens is not None and level.cpu_s_per_1k_tokens > 0
    assert ceiling.tok_s(2) == level.tok_s and ceiling.tok_s(3) is None
    assert json.loads(json.dumps(ceiling.to_dict()))["levels"][0]["tok_s"] == level.tok_s


def test_client_bound_is_flagged_near_the_ceiling(fake):
    fake.set_behavior(FakeBehavior(token_delay_s=0.002))  # a throttled server
    w = _workload(repeats=2, warmup=0)
    report = run_workload_sync(fake.base_url, "m", w)
    (level,) = report.levels
    best = level.output_tok_s.max
    assert level.client_ceiling_tok_s is None and level.client_headroom is None  # no ceiling given
    # The same measured repeats (their CPU rule set aside) against ceilings above and below 3x the best repeat.
    runs = [dataclasses.replace(r, client_busy=None) for r in level.runs]
    near = LevelSummary.of(4, runs, ceiling_tok_s=_ceiling(2 * best).tok_s(4))
    far = LevelSummary.of(4, runs, ceiling_tok_s=_ceiling(4 * best).tok_s(4))
    assert near.client_bound is True and near.client_headroom == pytest.approx(2.0)
    assert far.client_bound is False and far.client_headroom == pytest.approx(4.0)
    assert LevelSummary.of(4, runs).client_bound is None  # nothing to judge by
    # ... and end to end: the ceiling is recorded beside the level and in the report dict.
    low = run_workload_sync(fake.base_url, "m", _workload(repeats=1, warmup=0), ceiling=_ceiling(1.0))
    assert low.levels[0].client_bound is True and low.client_bound is True
    d = json.loads(json.dumps(low.to_dict()))
    assert d["client_ceiling"]["levels"][0]["tok_s"] == 1.0 and d["levels"][0]["client_ceiling_tok_s"] == 1.0
    assert d["client_bound"] is True
    high = run_workload_sync(fake.base_url, "m", _workload(repeats=1, warmup=0), ceiling=_ceiling(1e12))
    assert high.levels[0].client_headroom > 1e6
    assert high.levels[0].client_bound == (high.levels[0].client_busy >= bench.CLIENT_BOUND_FRACTION)


def test_client_bound_is_flagged_when_the_client_was_busy(fake):
    report = run_workload_sync(fake.base_url, "m", _workload(repeats=2, warmup=0))
    (level,) = report.levels
    assert level.client_busy == max(r.client_busy for r in level.runs) > 0

    def busy(*fractions: float) -> list:
        return [dataclasses.replace(r, client_busy=f) for r, f in zip(level.runs, fractions, strict=True)]

    assert LevelSummary.of(4, busy(0.1, 0.5)).client_bound is True  # one saturated repeat is enough
    assert LevelSummary.of(4, busy(0.1, 0.2)).client_bound is False
    # far from the ceiling, but busy: still flagged
    assert LevelSummary.of(4, busy(0.1, 0.5), ceiling_tok_s=1e12).client_bound is True


# ------------------------------------------------------------------------------------------ level floor


def test_each_repeat_lasts_at_least_the_level_floor(fake):
    fake.set_behavior(FakeBehavior(token_delay_s=0.01))  # >= 50 ms per 5-token request
    w = _workload(concurrency=(2,), output_len=5, prompts_per_concurrency=2, warmup=2, repeats=2, min_level_s=0.6)
    report = run_workload_sync(fake.base_url, "m", w)
    (level,) = report.levels
    assert report.error_count == 0 and level.floor_met and level.min_level_s == 0.6
    assert len(level.runs) == 2 and all(r.wall_s >= 0.6 for r in level.runs)
    assert all(r.num_requests > w.prompts_per_concurrency for r in level.runs)  # sized up from the warmup
    assert level.wall_s.min >= 0.6
    # what the server saw: warmup, discarded calibration repeats, measured repeats
    assert len(fake.log) == w.warmup + level.calibration_requests + sum(r.num_requests for r in level.runs)


def test_without_a_floor_each_repeat_has_exactly_the_requests_asked_for(fake):
    report = run_workload_sync(fake.base_url, "m", _workload())
    assert [r.num_requests for r in report.levels[0].runs] == [10, 10]
    assert report.levels[0].calibration_requests == 0


def test_the_floor_gives_up_at_max_level_requests(fake):
    fake.set_behavior(FakeBehavior(token_delay_s=0.01))
    w = _workload(concurrency=(2,), output_len=5, prompts_per_concurrency=2, warmup=2, repeats=1, min_level_s=30.0)
    w = Workload(**{**w.__dict__, "max_level_requests": 4})
    level = run_workload_sync(fake.base_url, "m", w).levels[0]
    assert level.runs[0].num_requests == 4 and not level.floor_met


# --------------------------------------------------------------------------------------------- speedup


def _report(tok_s_by_repeat: list[float], concurrency: int = 32) -> dict:
    """A pooled record: its repeats alternate between two server starts."""
    runs = [{"repeat": i // 2, "start": i % 2 + 1, "output_tok_s": v} for i, v in enumerate(tok_s_by_repeat)]
    return {"levels": [{"concurrency": concurrency, "runs": runs}]}


def test_speedup_is_decided_only_when_its_interval_over_starts_excludes_one():
    clear = speedup(_report([100, 102, 98, 101]), _report([120, 125, 118, 122]), 32)
    assert clear.verdict == "faster" and 1.0 < clear.low < clear.ratio < clear.high
    assert clear.baseline_starts == clear.treatment_starts == 2 and clear.baseline.median == 100.5

    overlap = speedup(_report([100, 110, 90, 105]), _report([105, 95, 115, 100]), 32)
    assert overlap.low < 1.0 < overlap.high and overlap.inconclusive and overlap.verdict == "indeterminate"
    assert overlap.starts_needed is not None and "starts per mode" in overlap.range_text

    slower = speedup(_report([100, 101, 99, 100]), _report([80, 82, 81, 80]), 32)
    assert slower.high < 1.0 and slower.verdict == "slower"

    one_each = speedup(_report([100]), _report([200]), 32)
    assert one_each.inconclusive and one_each.why_inconclusive == "one server start per mode"
    assert one_each.starts_needed is None and one_each.range_text == "indeterminate: one server start per mode"


def test_speedup_pools_server_starts_and_reads_reports_and_dicts(fake):
    # interleaved starts B, P, B, P: each side is a list of reports
    base = [_report([100, 104]), _report([96, 101])]
    treat = [_report([130, 128]), _report([126, 135])]
    s = speedup(base, treat, 32)
    assert s.baseline_repeats == s.treatment_repeats == 4 and s.baseline_starts == s.treatment_starts == 4
    assert s.verdict == "faster"
    real = run_workload_sync(fake.base_url, "m", _workload(concurrency=(1,), repeats=2, warmup=0))
    same = speedup(real, real.to_dict(), 1)
    assert same.ratio == pytest.approx(1.0) and same.inconclusive
    with pytest.raises(ValueError, match="no repeat"):
        speedup(real, real, 64)


def test_the_min_max_pairs_rule_is_gone():
    with pytest.raises(TypeError):
        speedup(_report([100, 101]), _report([110, 111]), 32, method="pairs")  # type: ignore[call-arg]


# ------------------------------------------------------------------------------------------ CPU pinning


def _sysfs(tmp_path, siblings: dict[int, str]):
    for cpu, text in siblings.items():
        topo = tmp_path / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "thread_siblings_list").write_text(text + "\n")
    return tmp_path


def test_split_keeps_smt_siblings_together(tmp_path):
    sysfs = _sysfs(tmp_path, {c: f"{c % 4},{c % 4 + 4}" for c in range(8)})  # cores (0,4) (1,5) (2,6) (3,7)
    split = split_cpus(2, cpus=range(8), sysfs=sysfs)
    assert split.client == (3, 7) and split.server == (0, 4, 1, 5, 2, 6)
    assert split.server_cpuset == "0-2,4-6" and split.client_cpuset == "3,7"
    split = split_cpus(3, cpus=range(8), sysfs=sysfs)
    assert split.client == (2, 3, 6, 7)  # whole cores: 3 CPUs need two of them


def test_split_without_topology_and_its_limits(tmp_path):
    split = split_cpus(2, cpus=[0, 1, 2, 3, 4, 5], sysfs=tmp_path)
    assert (split.server, split.client) == ((0, 1, 2, 3), (4, 5))
    split = split_cpus(10, cpus=[0, 1, 2], sysfs=tmp_path)
    assert split.server == (0,) and split.client == (1, 2)  # the server always keeps a core
    smt_only = split_cpus(1, cpus=[0, 1], sysfs=_sysfs(tmp_path / "s", {0: "0-1", 1: "0-1"}))
    assert (smt_only.server, smt_only.client) == ((0,), (1,))  # one core: its threads are split
    assert split_cpus(1, cpus=[3], sysfs=tmp_path) is None
    with pytest.raises(ValueError):
        split_cpus(0, cpus=[0, 1])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_pin_server_runs_the_command_on_the_server_cpus():
    split = split_cpus(1)
    argv = split.pin_server([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"])
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == list(split.server)
    assert set(split.server).isdisjoint(split.client)


def test_workload_validation_of_the_new_fields():
    with pytest.raises(ValueError):
        _workload(client_processes=0)
    with pytest.raises(ValueError):
        _workload(min_level_s=-1)
    with pytest.raises(ValueError):
        _workload(max_level_requests=5)  # below prompts_per_concurrency
    with pytest.raises(ValueError):
        _workload(client_cpus=(-1,))
    assert bench.Workload.__dataclass_params__.frozen
