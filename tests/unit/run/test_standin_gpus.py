"""The stand-in GPU inventory, a test device: `run --standin-gpus N` or SERVEMATRIX_STANDIN_GPUS=N makes the
host look as if it had N GPUs of any arch (hostinfo, where the GPUs are found); a bad value is bad input."""

from __future__ import annotations

import pytest

from servematrix.cli import main
from servematrix.planning.plan import make_plan
from servematrix.run import hostinfo
from servematrix.run.runplan import gpu_ready
from tests.conftest import MATRIX


@pytest.fixture
def fresh_host(monkeypatch):
    monkeypatch.delenv(hostinfo.STANDIN_GPUS_ENV, raising=False)
    hostinfo.host.cache_clear()
    yield
    hostinfo.host.cache_clear()


def test_standin_gpus_answer_to_every_arch_and_say_what_they_are(fresh_host, monkeypatch):
    monkeypatch.setenv(hostinfo.STANDIN_GPUS_ENV, "8")
    host = hostinfo.host()
    assert len(host.gpus) == 8 and host.count("sm_90") == 8 and host.count("sm_100") == 8
    assert host.to_dict()["gpu_sku"] == "stand-in GPU (test device)"  # every row says what ran it
    h200 = make_plan(MATRIX / "h200-smoke.toml")
    assert all(gpu_ready(c.env) for c in h200.cells)  # 1, 2, 4 and 8 GPUs: all fit on 8 stand-ins


def test_fewer_standins_than_a_kind_needs_leave_it_unready(fresh_host, monkeypatch):
    monkeypatch.setenv(hostinfo.STANDIN_GPUS_ENV, "2")
    ready = {c.env.axes["gpu"]: gpu_ready(c.env) for c in make_plan(MATRIX / "h200-smoke.toml").cells}
    assert ready == {"h200": True, "h100": True, "h200x2": True, "h200x4": False, "h200x8": False}


@pytest.mark.parametrize("value", ["0", "four", "-1", "2.5"])
def test_a_bad_standin_count_in_the_environment_is_one_line_and_exit_2(fresh_host, monkeypatch, capsys, value):
    monkeypatch.setenv(hostinfo.STANDIN_GPUS_ENV, value)
    assert main(["run", str(MATRIX / "cpu-smoke.toml"), "--stages", "resolve"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"servematrix: error: {hostinfo.STANDIN_GPUS_ENV}={value!r}: expected a number of stand-in GPUs, at least 1"
    ]


def test_the_option_is_checked_before_anything_runs(fresh_host, capsys):
    assert main(["run", str(MATRIX / "cpu-smoke.toml"), "--standin-gpus", "0"]) == 2
    assert "--standin-gpus must be at least 1" in capsys.readouterr().err
