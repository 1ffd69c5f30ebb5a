"""Unit tests of the load pre-flight (engines/sglang/loadprobe.py): the request built from a cell, the probe's
answers read into verdicts, the probe process's protocol (with a stand-in interpreter), the result cache, and
the committed model config folders. No sglang, no torch."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from servematrix.config.spec import model_config_dir
from servematrix.engines.hooks import PreflightInput, PreflightUnavailable
from servematrix.engines.sglang import PREFLIGHTS, loadprobe
from servematrix.engines.sglang.loadprobe import LoadResult, arch_of, server_argv, tp_of, verdict_of
from servematrix.engines.transformers import tinymodel
from servematrix.planning.plan import make_plan

REPO = Path(__file__).resolve().parents[3]
MATRIX = REPO / "matrix"
NEEDS_GPU = ("Found no NVIDIA driver on your system",)

# What load_script.py printed for sglang 0.5.12 and 0.5.23 on sm_120 (trimmed; the real runs are in
# tests/integration/test_load_preflight.py).
FAKED = [
    "torch.cuda device queries answer sm_120 (capability, properties, memory); torch.cuda.is_available() stays False",
    "sglang.srt.utils.common platform helpers answer sm_120: is_blackwell_supported, is_sm120_supported",
    "stubbed vllm._custom_ops.rotary_embedding (vllm is not in the lock; sglang imports it off CUDA)",
    "the modules are built at tensor parallelism 1 (ServerArgs above saw tp 8)",
    "layers reduced to 4 of 78",
]
OK_STEPS = [
    {"name": name, "ok": True, "detail": ""}
    for name in ("server-args", "model-config", "architecture", "backends", "distributed", "quantization")
]
CUTLASS_0512 = {
    "steps": [*OK_STEPS, {"name": "modules", "ok": False, "detail": "NotImplementedError: ..."}],
    "reached": "quantization",
    "faked": FAKED,
    "error": {
        "type": "NotImplementedError",
        "message": "Unsupported runner backend: MoeRunnerBackend.CUTLASS",
        "frames": [
            {"file": "sglang/srt/layers/moe/fused_moe_triton/layer.py", "line": 308, "function": "__init__"},
            {"file": "sglang/srt/layers/quantization/modelopt_quant.py", "line": 2007, "function": "create_moe_runner"},
            {"file": "sglang/srt/layers/moe/moe_runner/runner.py", "line": 66, "function": "__init__"},
        ],
    },
    "seconds": 0.3,
}
CUTLASS_0523 = {
    **CUTLASS_0512,
    "error": {
        "type": "NotImplementedError",
        "message": "moe_runner_backend=cutlass is not supported for NVFP4 MoE. Use --moe-runner-backend "
        "flashinfer_cutlass instead.",
        "frames": [
            {"file": "sglang/srt/layers/quantization/modelopt_quant.py", "line": 3145, "function": "create_moe_runner"}
        ],
    },
}
BUILT = {
    "steps": [
        *OK_STEPS,
        {
            "name": "modules",
            "ok": True,
            "detail": json.dumps(
                {"class": "GlmMoeDsaForCausalLM", "layers_built": 4, "of": 78, "moe_quant_methods": ["X"]}
            ),
        },
    ],
    "reached": "modules",
    "faked": FAKED,
    "error": None,
    "seconds": 0.3,
}


@pytest.mark.parametrize("answer", [CUTLASS_0512, CUTLASS_0523])
def test_sglangs_own_moe_runner_error_predicts_the_failure_with_its_frames(answer):
    result = verdict_of(LoadResult.from_json(answer), arch="12.0", needs_gpu=NEEDS_GPU)
    assert str(result) == "predicted-fail:moe-runner-unsupported"
    assert answer["error"]["frames"][-1]["file"] in result.excerpt
    assert answer["error"]["message"] in result.excerpt
    assert "failed at the module build for sm_120" in result.evidence[0]


def test_the_module_build_reached_says_how_far_and_is_not_a_failure():
    result = verdict_of(LoadResult.from_json(BUILT), arch="12.0", needs_gpu=NEEDS_GPU)
    assert result.kind == "pass"
    assert result.evidence[0].startswith("load: loaded to the module build for sm_120, 4 of 78 layers")
    assert "one rank" in result.evidence[0] and "1 stubbed op(s)" in result.evidence[0]


def test_a_model_the_locked_transformers_does_not_know_is_the_classifiers_model_unsupported():
    message = "The checkpoint you are trying to load has model type `glm_moe_dsa` but Transformers does not recognize this architecture."
    answer = {
        **CUTLASS_0512,
        "error": {
            "type": "ValueError",
            "message": message,
            "frames": [{"file": "transformers/models/auto/configuration_auto.py", "line": 1, "function": "f"}],
        },
    }
    assert str(verdict_of(LoadResult.from_json(answer), arch="12.0")) == "predicted-fail:model-unsupported"


def test_a_flag_the_releases_argparse_refuses_is_an_unknown_flag():
    error = {
        "type": "UsageError",
        "message": "sglang.launch_server: error: unrecognized arguments: --x",
        "frames": [{"file": "/x/engines/sglang/load_script.py", "line": 9, "function": "error"}],
    }
    answer = {
        "steps": [{"name": "server-args", "ok": False, "detail": ""}],
        "reached": None,
        "faked": [],
        "error": error,
    }
    result = verdict_of(LoadResult.from_json(answer), arch="12.0")
    assert str(result) == "predicted-fail:unknown-flag" and "failed at ServerArgs" in result.evidence[0]


def test_an_unknown_error_of_sglang_is_a_generic_load_failure():
    answer = {**CUTLASS_0512, "error": {**CUTLASS_0512["error"], "type": "ValueError", "message": "odd"}}
    assert str(verdict_of(LoadResult.from_json(answer), arch="12.0")) == "predicted-fail:load-failed"


@pytest.mark.parametrize(
    ("error", "why"),
    [
        (
            {
                "type": "RuntimeError",
                "message": "Found no NVIDIA driver on your system. Please check",
                "frames": [{"file": "torch/cuda/__init__.py", "line": 1, "function": "_lazy_init"}],
            },
            "needs a GPU",
        ),
        (
            {
                "type": "RuntimeError",
                "message": "stub vllm._custom_ops.rotary_embedding called",
                "frames": [{"file": "sglang/srt/layers/rotary_embedding/base.py", "line": 9, "function": "f"}],
            },
            "the CPU stand-in could not go further",
        ),
        # sglang 0.5.10 off a GPU: deepseek_v2 imports sgl_kernel, whose common_ops wants libcuda.so.1, so the
        # registry skips it and GLM-5's architecture looks unsupported.
        (
            {
                "type": "ValueError",
                "message": "Model architectures ['TransformersForCausalLM'] are not supported",
                "frames": [
                    {"file": "sglang/srt/model_loader/utils.py", "line": 9, "function": "get_model_architecture"}
                ],
                "skipped_models": [
                    "Ignore import error when loading sglang.srt.models.deepseek_v2: [sgl_kernel] "
                    "CRITICAL ... libcuda.so.1: cannot open shared object file"
                ],
            },
            "needs a GPU (the registry could not import model modules here",
        ),
        (
            {
                "type": "AttributeError",
                "message": "no attribute 'initialize_moe_config'",
                "frames": [{"file": "/x/engines/sglang/load_script.py", "line": 9, "function": "_init_moe"}],
            },
            "a fault of the load probe itself",
        ),
    ],
)
def test_a_stop_that_is_not_the_stacks_is_never_a_failure_nor_called_passed(error, why):
    answer = {**CUTLASS_0512, "error": error}
    result = verdict_of(LoadResult.from_json(answer), arch="12.0", needs_gpu=NEEDS_GPU)
    assert result.kind == "pass"
    assert f"reached the quantization method for sm_120, then stopped: {why}" in result.evidence[0]
    assert "loaded to" not in result.evidence[0]


def test_arch_argv_and_tensor_parallel_of_a_cell():
    assert (arch_of("sm_120"), arch_of("sm_100"), arch_of("sm_90")) == ("12.0", "10.0", "9.0")
    argv = server_argv(["python", "-m", "sglang.launch_server", "--model-path", "m", "--tp", "8"])
    assert argv == ["--model-path", "m", "--tp", "8"]
    assert (tp_of(argv), tp_of(["--tp-size=2"]), tp_of([])) == (8, 2, 1)


# ------------------------------------------------------------------------------------ the hook, end to end
def _input(tmp_path: Path, python=None, matrix: str = "glm5-nvfp4.toml", select=("gpu=rtx-pro-6000", "sglang=0.5.23")):
    plan = make_plan(MATRIX / matrix, select=select)
    cell = next(c for c in plan.cells if c.applicable)
    return PreflightInput(
        cell=cell,
        engine=plan.spec.engine,
        pins={"sglang": "0.5.23"},
        cache_dir=tmp_path,
        python=python,
        model_config=model_config_dir(plan.spec),
    )


def _stand_in(tmp_path: Path, answer: dict) -> Path:
    """An interpreter that answers as load_script.py does: a ready line, then `answer` per request (and the
    request it got, into requests.jsonl)."""
    script = tmp_path / "python"
    body = (
        "import json, sys\n"
        "print(json.dumps({'ready': True}), flush=True)\n"
        "for line in sys.stdin:\n"
        f"    open({str(tmp_path / 'requests.jsonl')!r}, 'a').write(line)\n"
        f"    print(json.dumps({answer!r}), flush=True)\n"
    )
    script.write_text(f"#!{sys.executable}\n{body}")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_the_hook_asks_the_environments_interpreter_once_and_caches_the_answer(tmp_path):
    calls = []
    python = _stand_in(tmp_path, CUTLASS_0523)

    def interpreter():
        calls.append(1)
        return python

    inp = _input(tmp_path, interpreter)
    try:
        first = PREFLIGHTS["load"](inp)
    finally:
        loadprobe.close_all()
    assert str(first) == "predicted-fail:moe-runner-unsupported"
    request = json.loads((tmp_path / "requests.jsonl").read_text().splitlines()[0])
    assert request["model_dir"] == str(MATRIX / "models" / "glm5-nvfp4")
    assert request["tp_size"] == 8 and "--moe-runner-backend" in request["argv"]
    # Cached by the lock's pins, the request, the config files and the code: no interpreter the second time.
    again = PREFLIGHTS["load"](_input(tmp_path, lambda: pytest.fail("installed again")))
    assert (str(again), len(calls)) == (str(first), 1)


def test_no_environment_here_says_nothing_and_no_config_cannot_run(tmp_path):
    assert PREFLIGHTS["load"](_input(tmp_path, None)) is None  # a GPU host, or no import check
    inp = _input(tmp_path, None)
    without = PreflightInput(cell=inp.cell, engine=inp.engine, pins=inp.pins, cache_dir=tmp_path, model_config=None)
    with pytest.raises(PreflightUnavailable, match="config files"):
        PREFLIGHTS["load"](without)


def test_a_probe_that_dies_predicts_nothing(tmp_path):
    script = tmp_path / "python"
    script.write_text(f"#!{sys.executable}\nimport sys; sys.exit(3)\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(PreflightUnavailable, match="exited"):
        PREFLIGHTS["load"](_input(tmp_path, lambda: script))
    loadprobe.close_all()


# ------------------------------------------------------------------------------------ the model config folders
def test_every_sglang_matrix_names_a_config_folder_that_holds_a_config():
    for name in ("glm5-nvfp4.toml", "h200-smoke.toml", "h200-glm5.toml"):
        plan = make_plan(MATRIX / name)
        folder = model_config_dir(plan.spec)
        assert folder is not None and (folder / "config.json").is_file() and (folder / "SOURCE.md").is_file()


def test_glm5_config_has_glm5s_shape_and_an_nvfp4_quant_config():
    folder = MATRIX / "models" / "glm5-nvfp4"
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["GlmMoeDsaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["n_routed_experts"]) == (78, 6144, 256)
    assert config["first_k_dense_replace"] == 3 and config["moe_layer_freq"] == 1
    quant = json.loads((folder / "hf_quant_config.json").read_text())["quantization"]
    assert (quant["quant_algo"], quant["group_size"]) == ("NVFP4", 16)


def test_the_random_llamas_config_is_what_its_builder_writes():
    config = json.loads((MATRIX / "models" / "random-llama-1b" / "config.json").read_text())
    preset = tinymodel.SIZES["gpu-1b"]
    for key, value in preset["model_config"].items():
        assert config.get(key, config.get("rope_parameters", {}).get(key)) == value, key
    assert (config["vocab_size"], config["dtype"]) == (tinymodel.VOCAB_SIZE, preset["dtype"])


def test_the_random_glm5s_config_is_what_its_builder_writes_with_glm5s_attention():
    from servematrix.engines.transformers import tinymoe

    config = json.loads((MATRIX / "models" / "random-glm5" / "config.json").read_text())
    assert config["architectures"] == [tinymoe.ARCHS["glm5"]] and config["model_type"] == "glm_moe_dsa"
    for key, value in tinymoe.model_fields("glm5-gpu", vocab_size=tinymodel.VOCAB_SIZE).items():
        assert config[key] == value, key
    assert config["dtype"] == tinymoe.SIZES["glm5-gpu"]["dtype"]


def test_a_local_checkpoint_folder_is_read_for_its_config_files_only(tmp_path):
    """M5: a local `model.path` with no `config_dir` is the checkpoint: the pre-flight's cache key reads its
    config and tokenizer files, never its weight shards (a 430 GB checkpoint was read whole per cell)."""
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    for config in (MATRIX / "models" / "glm5-nvfp4").glob("*.json"):
        (checkpoint / config.name).write_bytes(config.read_bytes())
    (checkpoint / "tokenizer.json").write_text('{"model": {}}')
    inp = _input(tmp_path)
    inp = PreflightInput(cell=inp.cell, engine=inp.engine, pins=inp.pins, cache_dir=tmp_path, model_config=checkpoint)
    request = loadprobe.request_for(inp)
    before = loadprobe.result_key(inp, request, "12.0")
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "pytorch_model.bin"):
        with (checkpoint / shard).open("wb") as handle:
            handle.truncate(64 * 1024 * 1024)  # sparse: what it holds is never looked at
    assert [p.name for p in loadprobe.config_files(checkpoint)] == [
        "config.json",
        "hf_quant_config.json",
        "tokenizer.json",
    ]
    assert loadprobe.result_key(inp, request, "12.0") == before
    # A config file that changes is a new key.
    (checkpoint / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    assert loadprobe.result_key(inp, request, "12.0") != before
