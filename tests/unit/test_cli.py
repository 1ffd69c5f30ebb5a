"""The command-line contract: shapes, exit codes, stable ids across processes and checkouts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from servematrix.cli import main
from tests.conftest import MATRIX, REPO, SMALL_SGLANG


def _plan_json_in(directory: Path, hashseed: str) -> list[dict]:
    env = {**os.environ, "PYTHONHASHSEED": hashseed, "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run(
        [sys.executable, "-m", "servematrix", "plan", "matrix/glm5-nvfp4.toml", "--format", "json"],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def test_plan_json_contract_shape(capsys):
    assert main(["plan", str(MATRIX / "glm5-nvfp4.toml"), "--format", "json"]) == 0
    cells = json.loads(capsys.readouterr().out)
    assert cells
    for cell in cells:
        assert set(cell) == {"id", "env_id", "engine", "mode", "axes", "applicable", "reason", "command", "requires"}
        # The engine's axes and the GPU kind, plus the axes the matrix declares (a flag axis, `resolution`).
        assert set(cell["axes"]) == {"sglang", "torch", "flashinfer", "cuda", "gpu", "moe_runner", "resolution"}
        assert set(cell["requires"]) == {"gpu_arch", "gpus"}
        assert isinstance(cell["command"], list)


def test_ids_are_identical_across_runs_and_checkouts(tmp_path):
    copies = []
    for name in ("checkout-a", "deeper/checkout-b"):
        target = tmp_path / name / "matrix"
        target.mkdir(parents=True)
        shutil.copy(MATRIX / "glm5-nvfp4.toml", target)
        copies.append(target.parent)
    first = _plan_json_in(copies[0], "1")
    second = _plan_json_in(copies[1], "2")
    again = _plan_json_in(copies[0], "3")
    ids = [(c["id"], c["env_id"]) for c in first]
    assert ids == [(c["id"], c["env_id"]) for c in second] == [(c["id"], c["env_id"]) for c in again]


def test_bad_matrix_exits_2_with_one_line(write_matrix, capsys):
    path = write_matrix(SMALL_SGLANG.replace("[bench]", "[bench]\nturbo = true"))
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"{path}:" in err and "bench.turbo" in err and "unknown key" in err


def test_missing_matrix_exits_2(tmp_path, capsys):
    assert main(["plan", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml" in capsys.readouterr().err


def test_bad_select_exits_2(capsys):
    assert main(["plan", str(MATRIX / "glm5-nvfp4.toml"), "--select", "flavour=mint"]) == 2
    assert "unknown key 'flavour'" in capsys.readouterr().err


def test_github_format_is_a_strategy_matrix(capsys):
    assert main(["plan", str(MATRIX / "glm5-nvfp4.toml"), "--format", "github", "--max-jobs", "3"]) == 0
    matrix = json.loads(capsys.readouterr().out)
    assert 2 <= len(matrix["include"]) <= 3
    assert {"name", "gpu", "runs-on", "select", "shard", "cells", "timeout-minutes"} <= set(matrix["include"][0])


def test_table_format_prints_every_cell(capsys):
    assert main(["plan", str(MATRIX / "cpu-smoke.toml")]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the title may wrap at a narrow terminal
    assert "4 cells" in out and "2 environments" in out


def test_starts_outside_the_matrix_bound_exits_2_before_anything_runs(tmp_path, capsys):
    for given, said in (("0", "at least 1"), ("11", "at most 10")):
        store = tmp_path / f"s{given}.sqlite"
        assert main(["run", str(MATRIX / "cpu-smoke.toml"), "--starts", given, "--store", str(store)]) == 2
        err = capsys.readouterr().err
        assert f"--starts must be {said}" in err and "Traceback" not in err
        assert not store.exists()
