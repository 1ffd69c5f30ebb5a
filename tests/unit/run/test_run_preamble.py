"""What `run` says before and while it works: the up-front plan on a host without the matrix's GPUs, which
environments it will build, and plain progress lines when there is no terminal (CI logs)."""

from __future__ import annotations

import pytest

from servematrix.planning.plan import make_plan
from servematrix.run import hostinfo
from servematrix.run.runplan import RunOptions, builds_here, preamble
from tests.conftest import MATRIX, SMALL_SGLANG


def _host(monkeypatch: pytest.MonkeyPatch, *archs: str) -> None:
    gpus = tuple(hostinfo.Gpu(name="NVIDIA test", arch=arch, driver="580") for arch in archs)
    fake = hostinfo.Host(hostname="h", cpu="c", cpus=2, os="Linux", gpus=gpus)
    monkeypatch.setattr(hostinfo, "host", lambda: fake)


def test_a_gpu_matrix_on_a_cpu_host_says_what_it_will_do(monkeypatch, tmp_path, write_matrix):
    _host(monkeypatch)
    plan = make_plan(write_matrix(SMALL_SGLANG), [], None)
    lines = preamble(plan, RunOptions(workdir=tmp_path))
    text = "\n".join(lines)
    assert "no NVIDIA GPU found" in text
    assert f"{len(plan.cells)} cell(s) need GPUs this host lacks: b200 (8x sm_100)" in text
    assert "skipped:no-gpu" in text and "resolve,probe" in text
    assert "matrix/cpu-smoke.toml" in text
    # 0.5.9 on sm_100 reaches the plain FP4 entry: one probe venv per (torch, flashinfer) pair, none built.
    assert "The FP4 trace probe builds" in text and "--stages resolve skips the probe" in text


def test_the_preamble_counts_only_probe_venvs_not_built_yet(monkeypatch, tmp_path, write_matrix):
    from servematrix.engines.sglang import traceprobe as probe

    _host(monkeypatch)
    plan = make_plan(write_matrix(SMALL_SGLANG), [], None)
    first = "\n".join(preamble(plan, RunOptions(workdir=tmp_path)))
    count = int(first.split("The FP4 trace probe builds ")[1].split()[0])
    assert count >= 1
    # Mark every pair built: the probe line goes away.
    for cell in plan.cells:
        torch = cell.env.effective("torch", plan.spec.engine.pins)
        flashinfer = cell.env.effective("flashinfer", plan.spec.engine.pins)
        if torch and flashinfer:
            venv = probe.venv_dir(tmp_path / "cache", torch, flashinfer)
            venv.mkdir(parents=True, exist_ok=True)
            (venv / probe._READY).write_text("{}")
    again = "\n".join(preamble(plan, RunOptions(workdir=tmp_path)))
    assert "trace probe" not in again


def test_the_cpu_smoke_pointer_counts_only_applicable_cells(monkeypatch, tmp_path):
    # The product matrix has not-applicable cells (no piecewise from 0.5.22): every cell that could run
    # needs a GPU, so the pointer to the CPU matrix is given.
    _host(monkeypatch)
    plan = make_plan(MATRIX / "glm5-nvfp4.toml", [], None)
    assert not all(c.applicable for c in plan.cells)
    assert "nox -s matrix -- matrix/cpu-smoke.toml" in "\n".join(preamble(plan, RunOptions(workdir=tmp_path)))


def test_with_the_gpus_present_nothing_is_said_about_skipping(monkeypatch, tmp_path, write_matrix):
    _host(monkeypatch, *["sm_100"] * 8)
    plan = make_plan(write_matrix(SMALL_SGLANG), [], None)
    text = "\n".join(preamble(plan, RunOptions(workdir=tmp_path, stages=("resolve", "build", "serve"))))
    assert "8x sm_100" in text
    assert "lacks" not in text and "cpu-smoke" not in text


def test_builds_here_only_for_gpus_present_and_only_with_the_build_stage(monkeypatch, write_matrix):
    plan = make_plan(write_matrix(SMALL_SGLANG), [], None)
    _host(monkeypatch)
    assert builds_here(plan, ("resolve", "build", "probe")) == []
    _host(monkeypatch, *["sm_100"] * 8)
    envs = list(dict.fromkeys(c.env_id for c in plan.cells if c.applicable))
    assert builds_here(plan, ("resolve", "build")) == envs
    assert builds_here(plan, ("resolve", "probe")) == []
    cpu = make_plan(MATRIX / "cpu-smoke.toml", [], None)
    _host(monkeypatch)
    assert len(builds_here(cpu, ("resolve", "build"))) == 2  # the CPU engine builds anywhere


def test_a_kind_that_names_its_card_runs_only_on_that_card(monkeypatch, tmp_path):
    # The device tool lends an H100 when an H200 was asked for; both are sm_90. The GLM-5 lane names both
    # kinds with their cards: on an H100 its h100 cells run and its h200 cells wait for an H200, so no row
    # says h200 of what an H100 served. A stand-in GPU is any card.
    from servematrix.run.runplan import gpu_ready

    plan = make_plan(MATRIX / "h200-glm5.toml", ["sglang=0.5.15"], None)
    by_kind = {c.env.axes["gpu"]: c.env for c in plan.cells}
    h100 = hostinfo.Gpu(name="NVIDIA H100 80GB HBM3", arch="sm_90", driver="580")
    monkeypatch.setattr(hostinfo, "host", lambda: hostinfo.Host(hostname="h", cpu="c", cpus=2, os="L", gpus=(h100,)))
    assert gpu_ready(by_kind["h100"]) and not gpu_ready(by_kind["h200"])
    text = "\n".join(preamble(plan, RunOptions(workdir=tmp_path)))
    assert "this host: 1x sm_90 NVIDIA H100 80GB HBM3" in text
    assert "4 cell(s) need GPUs this host lacks: h200 (1x sm_90 NVIDIA H200)" in text
    assert builds_here(plan, ("resolve", "build")) == [by_kind["h100"].env_id]
    standin = hostinfo.Gpu(name="stand-in GPU (test device)", arch=hostinfo.STANDIN_ARCH, driver="none")
    monkeypatch.setattr(hostinfo, "host", lambda: hostinfo.Host(hostname="h", cpu="c", cpus=2, os="L", gpus=(standin,)))
    assert gpu_ready(by_kind["h100"]) and gpu_ready(by_kind["h200"])


def test_a_card_is_named_by_nvidia_smi_s_name_or_its_start_before_an_edition():
    from servematrix.run.hostinfo import is_card

    assert is_card("NVIDIA RTX PRO 6000 Blackwell Server Edition", "NVIDIA RTX PRO 6000 Blackwell")
    assert is_card("NVIDIA H200 NVL", "nvidia h200") and is_card("NVIDIA H200", "NVIDIA H200")
    assert not is_card("NVIDIA H2000", "NVIDIA H200") and not is_card("NVIDIA H100 80GB HBM3", "NVIDIA H200")
    assert is_card("anything", "")
