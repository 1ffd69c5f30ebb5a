"""Tensor parallelism as data: a GPU kind of several GPUs that asks for it gets the engine's tensor-parallel
args, the size from its count and its ranks' port from the server's; other kinds, and their cell ids, do not
change."""

from __future__ import annotations

import re

import pytest

from servematrix.config.spec import load_spec
from servematrix.errors import InputError
from servematrix.planning.cells import expand
from servematrix.planning.plan import make_plan
from servematrix.run.serving import build_argv
from tests.conftest import MATRIX

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _value(argv: tuple[str, ...], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_the_tp_size_is_the_gpu_kinds_count_and_the_ranks_port_is_above_the_servers():
    plan = make_plan(MATRIX / "h200-smoke.toml")
    by_kind: dict[str, list] = {}
    for cell in plan.cells:
        by_kind.setdefault(cell.env.axes["gpu"], []).append(cell)
    assert set(by_kind) == {"h200", "h100", "h200x2", "h200x4", "h200x8"}
    for cell in [*by_kind["h200"], *by_kind["h100"]]:
        assert "--tp-size" not in cell.command and "--nccl-port" not in cell.command
    for kind in ("h200x2", "h200x4", "h200x8"):
        for cell in by_kind[kind]:
            assert _value(cell.command, "--tp-size") == str(cell.env.gpu.count)
            assert int(_value(cell.command, "--nccl-port")) == int(_value(cell.command, "--port")) + 1
            assert cell.to_contract()["requires"]["gpus"] == cell.env.gpu.count
            assert MULTICAST_OFF.items() <= cell.server_env.items()
            # The run's own port: the ranks' port follows it.
            argv = build_argv(plan, cell, model="/m", port=41000, host="127.0.0.1")
            assert _value(argv, "--port") == "41000" and _value(argv, "--nccl-port") == "41001"


def test_the_single_gpu_cells_keep_their_ids_when_tensor_parallel_kinds_are_added(tmp_path):
    text = (MATRIX / "h200-smoke.toml").read_text()
    single = re.sub(r'gpu = \["h200", [^\]]*\]', 'gpu = ["h200"]', text)
    single = re.sub(r"\[\[exclude\]\]\nsglang = \"<0.5.15\"\ngpu = \[[^\]]*\]\n", "", single)
    single = re.sub(r"\n\[gpu\.h200x\d\]\n(?:[^\[\n][^\n]*\n)*", "\n", single)
    assert "[gpu.h200x" not in single and 'gpu = ["h200"]' in single and 'gpu = ["h200x' not in single
    path = tmp_path / "h200-smoke.toml"
    path.write_text(single)
    before = {c.id: c.command for c in make_plan(path).cells}
    after = {c.id: c.command for c in make_plan(MATRIX / "h200-smoke.toml").cells if c.env.axes["gpu"] == "h200"}
    assert before == after and len(before) == 12  # 3 environments x 4 modes


def test_the_ranks_port_is_a_derived_port_of_a_tensor_parallel_server():
    spec = load_spec(MATRIX / "h200-smoke.toml")
    single = spec.engine.port_offsets("0.5.15")
    assert 1 not in single and 10000 in single
    assert set(spec.engine.port_offsets("0.5.15", ranks=8)) == {*single, 1}


def test_a_kind_that_asks_for_tensor_parallelism_of_an_engine_without_its_data_is_refused(tmp_path):
    matrix = tmp_path / "m.toml"
    matrix.write_text(
        'engine = "transformers"\n[model]\nname = "m"\npath = "m"\n[axes]\ntransformers = ["5.24.0"]\n'
        'torch = ["2.9.1"]\ngpu = ["pair"]\nmode = ["static"]\n[gpu.pair]\narch = "sm_90"\ncount = 2\n'
        "tensor_parallel = true\n[bench]\nconcurrency = [1]\ninput_len = 8\noutput_len = 8\n"
        "prompts_per_concurrency = 2\n"
    )
    with pytest.raises(InputError) as caught:
        load_spec(matrix)
    assert "gpu.pair.tensor_parallel" in str(caught.value) and ":13:" in str(caught.value)
    assert "transformers 5.24.0 does not say how to serve tensor-parallel" in str(caught.value)


def test_a_kind_without_tensor_parallelism_keeps_its_argv_whatever_its_count():
    """The product matrix's 8-GPU kinds name their own --tp 8 in their args: nothing is added to them."""
    spec = load_spec(MATRIX / "glm5-nvfp4.toml")
    for cell in expand(spec):
        if cell.applicable:
            assert cell.env.gpu.count == 8 and cell.env.ranks == 1
            assert "--tp-size" not in cell.command and cell.command.count("--tp") == 1
