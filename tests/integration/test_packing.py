"""Packing cells onto a host's GPUs, on a CPU host: the real pipeline, store and job processes, a stand-in GPU
inventory (SERVEMATRIX_STANDIN_GPUS) and the fake backend serving the FAKE multi-GPU server, which records what
each server was given (GPUs, CPUs, ports, ranks) and when it ran. What is checked is the servers' own view and
the process table, not what the harness says it did."""

from __future__ import annotations

import io
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from servematrix.cli import main
from servematrix.engines import ENGINES_PATH_ENV
from servematrix.planning.plan import make_plan
from servematrix.planning.schedule import cpu_slices, lower_bound, stored_spans
from servematrix.run import hostinfo, ports
from servematrix.run.pipeline import run_plan
from servematrix.run.runplan import RunOptions
from servematrix.store.store import Store
from tests.conftest import REPO
from tests.fakes.fake_backend import FakeBackend
from tests.fakes.fake_backend_harness import FAKE_MULTI_GPU_SERVER
from tests.unit.engines.test_engine_plugins import TOY_ENGINES

pytestmark = [pytest.mark.slow]

# One 4-GPU job, two 2-GPU jobs (tensor-parallel: ranks and their port) and four 1-GPU jobs, of different lengths.
MIXED = """
engine = "toyserve"
[model]
name = "m"
path = "m"
[axes]
toyserve = ["2.1", "2.2", "2.3", "2.4"]
gpu = ["one", "two", "four"]
mode = ["short"]
[[exclude]]
toyserve = ["2.3", "2.4"]
gpu = "two"
[[exclude]]
toyserve = ["2.2", "2.3", "2.4"]
gpu = "four"
[gpu.one]
arch = "sm_90"
count = 1
env = {{ FAKE_READY_AFTER_S = "{one}" }}
[gpu.two]
arch = "sm_90"
count = 2
tensor_parallel = true
env = {{ FAKE_READY_AFTER_S = "{two}" }}
[gpu.four]
arch = "sm_90"
count = 4
tensor_parallel = true
env = {{ FAKE_READY_AFTER_S = "{four}" }}
[server]
ready_timeout_s = 120
[bench]
concurrency = [1]
input_len = 8
output_len = 8
prompts_per_concurrency = 2
"""

# Two environments of two modes, two server starts each.
TWO_MODES = """
engine = "toyserve"
[model]
name = "m"
path = "m"
[axes]
toyserve = ["2.1", "2.2"]
gpu = ["one"]
mode = ["short", "long"]
[gpu.one]
arch = "sm_90"
count = 1
env = { FAKE_READY_AFTER_S = "1" }
[server]
ready_timeout_s = 60
[bench]
concurrency = [1]
input_len = 8
output_len = 8
prompts_per_concurrency = 2
starts = 2
"""
# Two 1-GPU jobs and a 2-GPU one at once on 4 GPUs, whose servers take long to be ready: killed meanwhile.
SLOW = """
engine = "toyserve"
[model]
name = "m"
path = "m"
[axes]
toyserve = ["2.1", "2.2"]
gpu = ["one", "two"]
mode = ["short"]
[[exclude]]
toyserve = "2.2"
gpu = "two"
[gpu.one]
arch = "sm_90"
count = 1
env = { FAKE_READY_AFTER_S = "300" }
[gpu.two]
arch = "sm_90"
count = 2
tensor_parallel = true
env = { FAKE_READY_AFTER_S = "300" }
[server]
ready_timeout_s = 600
[bench]
concurrency = [1]
input_len = 8
output_len = 8
prompts_per_concurrency = 2
"""


@pytest.fixture
def standin(monkeypatch, tmp_path):
    """A host of N stand-in GPUs (hostinfo is cached: cleared before and after), the test engine, and the
    folder the fake servers record into."""
    records = tmp_path / "records"
    records.mkdir()
    monkeypatch.setenv(ENGINES_PATH_ENV, str(TOY_ENGINES))
    monkeypatch.setenv("FAKE_GPU_RECORDS", str(records))
    monkeypatch.chdir(REPO)  # the job processes import the fake backend from here

    def host_of(gpus: int) -> Path:
        monkeypatch.setenv(hostinfo.STANDIN_GPUS_ENV, str(gpus))
        hostinfo.host.cache_clear()
        return records

    yield host_of
    hostinfo.host.cache_clear()


def _records(folder: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]


def _overlap(a: dict, b: dict) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _run(tmp_path: Path, matrix_text: str, **options) -> tuple[Path, str]:
    matrix = tmp_path / "m.toml"
    matrix.write_text(matrix_text)
    out = io.StringIO()
    summary = run_plan(
        make_plan(matrix),
        FakeBackend(tmp_path, server=FAKE_MULTI_GPU_SERVER, **options.pop("backend", {})),
        RunOptions(stages=("build", "serve"), store=tmp_path / "s.sqlite", workdir=tmp_path / "work", **options),
        console=Console(file=out, width=200),
    )
    assert summary.verdicts and set(summary.verdicts.values()) == {"pass"}, out.getvalue()
    return tmp_path / "s.sqlite", out.getvalue()


def test_a_mixed_matrix_packs_onto_disjoint_gpus_cpus_and_ports_within_a_tenth_of_its_bound(standin, tmp_path):
    records_dir = standin(4)
    store_path, said = _run(tmp_path, MIXED.format(one=4, two=8, four=6))
    records = _records(records_dir)
    assert sorted(len(r["gpus"].split(",")) for r in records) == [1, 1, 1, 1, 2, 2, 4]
    cpus = sorted(os.sched_getaffinity(0))
    slices = cpu_slices(cpus, 4)
    for r in records:
        gpus = [int(g) for g in r["gpus"].split(",")]
        assert set(gpus) <= {0, 1, 2, 3}
        assert len(r["ranks"]) == len(gpus) - 1  # one rank per GPU
        assert all(1 <= p <= ports.MAX_PORT for p in r["ports"])  # each bound by the fake: free when it started
        # Each server runs on its GPUs' CPUs: disjoint from every other GPU's where the host has a CPU per GPU.
        assert r["cpus"] == sorted({c for g in gpus for c in slices[g]})
    overlapping = [(a, b) for i, a in enumerate(records) for b in records[i + 1 :] if _overlap(a, b)]
    assert overlapping  # they did run at the same time
    for a, b in overlapping:
        assert not set(a["gpus"].split(",")) & set(b["gpus"].split(",")), (a, b)
        assert not set(a["ports"]) & set(b["ports"]), (a, b)
        if len(cpus) >= 4:
            assert not set(a["cpus"]) & set(b["cpus"]), (a, b)
    if len(cpus) < 4:
        assert "this host has 2 CPU(s) for 4 GPUs: jobs on different GPUs share CPUs" in said
    # Every server and every rank is gone.
    assert not [p for r in records for p in (r["pid"], *r["ranks"]) if _alive(p)]
    # The makespan, as the store keeps it, against its lower bound.
    with Store(store_path) as store:
        jobs = store.packed_jobs()
    spans = stored_spans(jobs)
    assert len(spans) == 7 and {j["host_gpus"] for j in jobs} == {4}
    makespan = max(s.end_s for s in spans)
    bound = lower_bound(spans, 4)
    print(f"packed 7 jobs on 4 stand-in GPUs: makespan {makespan:.1f} s, lower bound {bound:.1f} s")
    assert makespan <= 1.1 * bound, said
    assert f"makespan {makespan:.1f} s, lower bound {bound:.1f} s" in said  # the run's end says it
    # ... and the report of the store shows it.
    assert main(["report", "--store", str(store_path), "--out", str(tmp_path / "report")]) == 0
    table = (tmp_path / "report" / "compatibility.md").read_text()
    assert f"makespan {makespan:.1f} s, lower bound {bound:.1f} s" in table


def test_on_two_gpus_and_two_cpus_packed_environments_get_disjoint_cpus_share_their_build_and_interleave(
    standin, tmp_path
):
    """Both modes of an environment, two server starts each, in one job: built once, started short, long,
    short, long; the two jobs at once, each on its GPU and its own CPU of this host."""
    records_dir = standin(2)
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    builds = tmp_path / "builds.txt"
    _run(tmp_path, TWO_MODES, backend={"builds": builds})
    built = builds.read_text().split()
    assert len(built) == 2 and len(set(built)) == 2  # once per environment, shared by its modes
    records = _records(records_dir)
    assert len(records) == 8
    by_gpu: dict[str, list[dict]] = {}
    for r in sorted(records, key=lambda r: r["start"]):
        by_gpu.setdefault(r["gpus"], []).append(r)
    assert set(by_gpu) == {"0", "1"}
    for starts in by_gpu.values():
        lengths = [r["argv"][r["argv"].index("--max-len") + 1] for r in starts]
        assert lengths == ["512", "4096", "512", "4096"]  # interleaved
    zero, one = by_gpu["0"], by_gpu["1"]
    assert any(_overlap(a, b) for a in zero for b in one)
    # A server gets the harness's environment, not its import path (an environment's Python would read this
    # Python's stdlib and packages from there).
    assert {r["pythonpath"] for r in records} == {os.environ.get("PYTHONPATH")}
    assert not {c for r in zero for c in r["cpus"]} & {c for r in one for c in r["cpus"]}


def test_teardown_leaves_no_rank_of_a_tensor_parallel_server_after_each_cell(standin, tmp_path):
    """A 2-GPU server has a rank outside its process tree; after each of its cells, before the next one starts
    on those GPUs, neither the server nor its rank is in the process table."""
    records_dir = standin(2)
    text = TWO_MODES.replace('toyserve = ["2.1", "2.2"]', 'toyserve = ["2.1"]')
    text = text.replace("count = 1\n", "count = 2\ntensor_parallel = true\n")
    _run(tmp_path, text)
    records = sorted(_records(records_dir), key=lambda r: r["start"])
    assert len(records) == 4  # two modes, two starts each
    for earlier, later in itertools.pairwise(records):
        assert len(later["ranks"]) == 1 and later["start"] > earlier["end"]
        assert later["left_before"] == []  # every process of the servers before it was gone
    assert not [p for r in records for p in (r["pid"], *r["ranks"]) if _alive(p)]


def _harness(matrix: Path, tmp_path: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.fakes.fake_backend_harness",
            str(matrix),
            str(tmp_path / "s.sqlite"),
            str(tmp_path / "work"),
        ],
        cwd=REPO,
        stdout=(tmp_path / "harness.log").open("wb"),
        stderr=subprocess.STDOUT,
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killing_the_harness_mid_pack_leaves_no_server_on_any_standin_gpu(standin, tmp_path, sig):
    records_dir = standin(4)
    matrix = tmp_path / "m.toml"
    matrix.write_text(SLOW)
    harness = _harness(matrix, tmp_path)
    deadline = time.monotonic() + 120
    while len(_records(records_dir)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    records = _records(records_dir)
    assert len(records) == 3, (tmp_path / "harness.log").read_text()  # 2 x 1 GPU and 1 x 2 GPUs, at once
    servers = [p for r in records for p in (r["pid"], *r["ranks"])]
    assert len(servers) == 4 and all(_alive(p) for p in servers)
    jobs = [p for p in psutil.Process(harness.pid).children() if "servematrix.run.packjob" in " ".join(p.cmdline())]
    assert len(jobs) == 3
    harness.send_signal(sig)
    code = harness.wait(timeout=120)
    assert code == (130 if sig == signal.SIGTERM else -signal.SIGKILL)
    # The jobs stop their servers, every rank included, also when the harness could not tell them (SIGKILL).
    deadline = time.monotonic() + 60
    while any(_alive(p) for p in [*servers, *(j.pid for j in jobs)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in servers if _alive(p)]
    assert not [j.pid for j in jobs if _alive(j.pid)]
    with Store(tmp_path / "s.sqlite") as store:
        rows = store.all_rows()
    assert (
        len(rows) == 3
        and {r["verdict"] for r in rows} == {"interrupted"}
        and {r["status"] for r in rows} == {"finished"}
    )
