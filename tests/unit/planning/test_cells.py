"""Expansion, ids, the sglang flag table, and select/shard."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from servematrix.config.spec import load_spec
from servematrix.errors import InputError
from servematrix.planning.cells import expand
from servematrix.planning.plan import github_matrix, make_plan
from tests.conftest import MATRIX, REPO, SMALL_SGLANG

GLM5 = MATRIX / "glm5-nvfp4.toml"


def _cell(cells, sglang, mode, flashinfer="pinned", gpu="b200", moe_runner="cutlass", resolution="today"):
    (found,) = [
        c
        for c in cells
        if c.env.axes["sglang"] == sglang
        and c.mode == mode
        and c.env.axes["flashinfer"] == flashinfer
        and c.env.axes["gpu"] == gpu
        and c.env.axes.get("resolution", "today") == resolution
        and (gpu != "rtx-pro-6000" or c.env.axes["moe_runner"] == moe_runner)
    ]
    return found


@pytest.fixture(scope="module")
def glm5_cells():
    return expand(load_spec(GLM5))


def test_piecewise_flags_follow_the_version_table(glm5_cells):
    assert "--enable-piecewise-cuda-graph" in _cell(glm5_cells, "0.5.9", "piecewise").command
    assert "--enable-piecewise-cuda-graph" not in _cell(glm5_cells, "0.5.9", "baseline").command
    base12, piece12 = _cell(glm5_cells, "0.5.12", "baseline"), _cell(glm5_cells, "0.5.12", "piecewise")
    assert "--disable-piecewise-cuda-graph" in base12.command
    assert "--enforce-piecewise-cuda-graph" in piece12.command
    assert "--enforce-piecewise-cuda-graph" in _cell(glm5_cells, "0.5.10", "piecewise").command
    piece14 = _cell(glm5_cells, "0.5.14", "piecewise").command
    i = piece14.index("--cuda-graph-backend-prefill")
    assert piece14[i + 1] == "tc_piecewise"
    assert "--enable-piecewise-cuda-graph" not in piece14
    base17 = _cell(glm5_cells, "0.5.17", "baseline").command
    assert base17[base17.index("--cuda-graph-backend-prefill") + 1] == "disabled"


def test_not_applicable_has_a_reason_and_no_command(glm5_cells):
    cell = _cell(glm5_cells, "0.5.23", "piecewise")
    assert cell.applicable is False
    assert "tc_piecewise" in cell.reason
    assert cell.command == ()
    assert _cell(glm5_cells, "0.5.23", "baseline").applicable


def test_version_between_listed_rows_resolves_by_range():
    engine = load_spec(GLM5).engine
    assert engine.mode_flags_for("piecewise", "0.5.11").args == ("--enforce-piecewise-cuda-graph",)
    assert engine.mode_flags_for("piecewise", "0.5.20").args == ("--cuda-graph-backend-prefill", "tc_piecewise")
    # The real 0.5.22 wheel already rejects tc_piecewise.
    assert not engine.mode_flags_for("piecewise", "0.5.22").applicable
    assert engine.mode_flags_for("piecewise", "0.5.7").args == ("--enable-piecewise-cuda-graph",)
    assert not engine.mode_flags_for("piecewise", "0.5.3").applicable
    assert not engine.mode_flags_for("piecewise", "0.6.0").applicable


def test_recipe_flags_are_spelled_for_the_version(glm5_cells):
    old = _cell(glm5_cells, "0.5.12", "baseline").command
    new = _cell(glm5_cells, "0.5.14", "baseline").command
    assert "--nsa-decode-backend" in old and "--dsa-decode-backend" not in old
    assert "--dsa-decode-backend" in new and "--nsa-decode-backend" not in new
    rtx = _cell(glm5_cells, "0.5.14", "baseline", gpu="rtx-pro-6000")
    assert "--dsa-decode-backend" not in rtx.command
    assert rtx.server_env["SGLANG_ENABLE_DEEP_GEMM"] == "0"


def test_command_is_a_list_of_arguments(glm5_cells):
    cell = _cell(glm5_cells, "0.5.12", "piecewise")
    assert cell.command[:3] == ("python", "-m", "sglang.launch_server")
    assert all(isinstance(a, str) and " " not in a for a in cell.command)


def test_both_modes_share_the_environment_and_ids_differ(glm5_cells):
    base, piece = _cell(glm5_cells, "0.5.12", "baseline"), _cell(glm5_cells, "0.5.12", "piecewise")
    assert base.env_id == piece.env_id
    assert base.id != piece.id
    assert len({c.id for c in glm5_cells}) == len(glm5_cells)


def test_exclusions_apply(glm5_cells):
    assert not [c for c in glm5_cells if c.env.axes["sglang"] == "0.5.14" and c.env.axes["flashinfer"] == "0.6.12"]
    assert {c.env.axes["cuda"] for c in glm5_cells if c.env.axes["sglang"] == "0.5.9"} == {"12.8"}


def test_ids_depend_on_server_arguments(write_matrix):
    a = expand(load_spec(write_matrix(SMALL_SGLANG, "a.toml")))
    b = expand(load_spec(write_matrix(SMALL_SGLANG + '[server]\nargs = ["--tp", "4"]\n', "b.toml")))
    assert [c.env_id for c in a] == [c.env_id for c in b]
    assert not {c.id for c in a} & {c.id for c in b}


def test_exclude_that_matches_nothing_warns(write_matrix, capsys):
    path = write_matrix(SMALL_SGLANG + '[[exclude]]\nsglang = "0.5.99"\n')
    cells = expand(load_spec(path))
    assert len(cells) == 8
    err = capsys.readouterr().err
    assert "exclude[0]" in err and "matches no cell" in err and f"{path}:" in err


def test_include_adds_an_environment(write_matrix):
    text = (
        SMALL_SGLANG
        + '[[include]]\nsglang = "0.5.14"\ntorch = "pinned"\nflashinfer = "pinned"\ncuda = "13.0"\ngpu = "b200"\n'
    )
    cells = expand(load_spec(write_matrix(text)))
    assert len([c for c in cells if c.env.axes["sglang"] == "0.5.14"]) == 2


def test_select_expressions():
    plan = make_plan(GLM5, ["sglang>=0.5.10,<0.5.14", "mode=piecewise", "gpu=b200"])
    assert plan.cells
    assert {c.env.axes["sglang"] for c in plan.cells} == {
        "0.5.10",
        "0.5.10.post1",
        "0.5.11",
        "0.5.12",
        "0.5.12.post1",
        "0.5.13",
    }
    assert {c.mode for c in plan.cells} == {"piecewise"}
    both = make_plan(GLM5, ["gpu=b200|rtx-pro-6000", "sglang=0.5.9"])
    assert {c.env.axes["gpu"] for c in both.cells} == {"b200", "rtx-pro-6000"}
    # `pinned` compares as the release's pin: 0.5.9 pins flashinfer 0.6.3.
    pinned = make_plan(GLM5, ["flashinfer<0.6.5", "sglang=0.5.9"])
    assert {c.env.axes["flashinfer"] for c in pinned.cells} == {"pinned"}
    env = plan.cells[0].env_id
    assert {c.env_id for c in make_plan(GLM5, [f"env={env[:6]}"]).cells} == {env}


@pytest.mark.parametrize("bad", ["sglang", "colour=red", "sglang>=x.y", "mode=piecewise,"])
def test_bad_select_is_input_error(bad):
    with pytest.raises(InputError):
        make_plan(GLM5, [bad])


def test_shards_partition_by_environment():
    full = make_plan(GLM5)
    parts = [make_plan(GLM5, shard_text=f"{i}/3") for i in (1, 2, 3)]
    ids = [c.id for p in parts for c in p.cells]
    assert sorted(ids) == sorted(c.id for c in full.cells)
    envs = [{c.env_id for c in p.cells} for p in parts]
    assert not (envs[0] & envs[1]) and not (envs[1] & envs[2]) and not (envs[0] & envs[2])
    assert max(len(e) for e in envs) - min(len(e) for e in envs) <= 1


@pytest.mark.parametrize("bad", ["0/3", "4/3", "1-3", "1/0"])
def test_bad_shard(bad):
    with pytest.raises(InputError):
        make_plan(GLM5, shard_text=bad)


def test_github_matrix_groups_modes_and_respects_max_jobs():
    plan = make_plan(GLM5)
    for max_jobs in (2, 5, 256):
        jobs = github_matrix(plan, max_jobs)["include"]
        assert 2 <= len(jobs) <= max_jobs
        assert sum(j["cells"] for j in jobs) == len(plan.cells)
        for job in jobs:
            part = make_plan(GLM5, [job["select"]], job["shard"])
            assert len(part.cells) == job["cells"]
            modes = {}
            for c in part.cells:
                modes.setdefault(c.env_id, set()).add(c.mode)
            assert all(m == {"baseline", "piecewise", "breakable", "full"} for m in modes.values())  # one job per env
    b200 = [j for j in github_matrix(plan)["include"] if j["gpu"] == "b200"]
    assert b200[0]["runs-on"] == ["self-hosted", "linux", "x64", "gpu-b200x8"]
    assert b200[0]["timeout-minutes"] == 150


# ---- the cell limit --------------------------------------------------------------------------------


def _wide_matrix(write_matrix, sglang: int, torch: int, flashinfer: int, cuda: int) -> Path:
    def versions(prefix: str, n: int) -> str:
        return ", ".join(f'"{prefix}.{i}"' for i in range(n))

    return write_matrix(
        f"""
        engine = "sglang"
        [model]
        name = "m"
        path = "org/model"
        [axes]
        sglang = [{versions("0.5", sglang)}]
        torch = [{versions("2", torch)}]
        flashinfer = [{versions("0.6", flashinfer)}]
        cuda = [{versions("12", cuda)}]
        gpu = ["b200"]
        mode = ["baseline", "piecewise"]
        [gpu.b200]
        arch = "sm_100"
        count = 8
        [bench]
        concurrency = [1]
        input_len = 8
        output_len = 8
        prompts_per_concurrency = 2
        """
    )


def test_a_matrix_over_the_default_limit_is_an_input_error(write_matrix):
    path = _wide_matrix(write_matrix, 25, 10, 10, 5)  # 25,000 cells
    with pytest.raises(InputError) as info:
        make_plan(path)
    err = info.value
    assert err.location.file == path and err.location.key == "axes" and err.location.line == 5
    assert "25,000 cells" in err.message and "limit of 20,000" in err.message and "--max-cells" in err.message
    assert "25 sglang x 10 torch x 10 flashinfer x 5 cuda x 1 gpu x 2 mode" in err.message


def test_the_limit_can_be_raised_and_lowered(write_matrix):
    path = write_matrix(SMALL_SGLANG)  # 8 cells
    assert len(make_plan(path, max_cells=8).cells) == 8
    with pytest.raises(InputError, match="up to 8 cells"):
        make_plan(path, max_cells=7)


def test_includes_count_towards_the_limit(write_matrix):
    text = (
        SMALL_SGLANG
        + '[[include]]\nsglang = "0.5.14"\ntorch = "pinned"\nflashinfer = "pinned"\ncuda = "13.0"\ngpu = "b200"\n'
    )
    path = write_matrix(text)
    assert len(make_plan(path, max_cells=10).cells) == 10
    with pytest.raises(InputError, match=r"up to 10 cells .*\+ 2 included"):
        make_plan(path, max_cells=9)


def test_two_million_cells_exit_2_before_expanding(write_matrix):
    """2,000,000 cells took 5.9 GB and ended in a MemoryError traceback. With 1 GiB of address space
    the command must still answer: the limit is checked from the axis sizes, before anything is made."""
    path = _wide_matrix(write_matrix, 100, 100, 100, 1)
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
        "from servematrix.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "plan", str(path), "--format", "json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "2,000,000 cells" in line and "--max-cells" in line
