"""Unit tests of the config pre-flight (engines/sglang/configcheck.py, wheelfacts.py): the registry, sglang's own config classes
and the environment variables read from small wheels shaped like the real ones (the lines quoted from sglang
0.5.6, 0.5.10 and 0.5.15), the verdict of a cell, the transformers venv's resolution and cache. No network,
nothing installed; the real wheels and locks are in `test_the_real_releases` (slow, integration)."""

from __future__ import annotations

import dataclasses
import json
import sys
import zipfile
from pathlib import Path

import pytest

from servematrix.classify import classify_text
from servematrix.config.spec import model_config_dir
from servematrix.engines.hooks import PreflightInput, PreflightUnavailable
from servematrix.engines.sglang import PREFLIGHTS, configcheck, traceprobe, wheelfacts
from servematrix.engines.sglang.configcheck import TransformersAnswer, read_model_config
from servematrix.engines.sglang.wheelfacts import (
    ConfigCheckError,
    WheelFacts,
    env_warnings,
    facts_from_sources,
    facts_from_wheel,
)
from servematrix.formats.lockfile import parse_pins
from servematrix.planning.plan import make_plan
from servematrix.util import Captured

REPO = Path(__file__).resolve().parents[3]
GLM5 = REPO / "matrix" / "models" / "glm5-nvfp4"

REGISTRY = """
def import_model_classes(package_name: str):
    for _, name, ispkg in pkgutil.iter_modules(package.__path__, package_name + "."):
        if hasattr(module, "EntryClass"):
            entry = module.EntryClass
"""
DEEPSEEK = """
class DeepseekV2ForCausalLM(nn.Module):
    pass


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    pass


EntryClass = [DeepseekV2ForCausalLM, DeepseekV3ForCausalLM]
"""
GLM4_MOE = """
from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM
from sglang.srt.models.glm4 import Glm4Model as _Base


class Glm4MoeForCausalLM(nn.Module):
    pass


class GlmMoeDsaForCausalLM(DeepseekV2ForCausalLM):
    def determine_num_fused_shared_experts(self):
        super().determine_num_fused_shared_experts("GlmMoeDsaForCausalLM")


EntryClass = [Glm4MoeForCausalLM, GlmMoeDsaForCausalLM]
"""
# 0.5.6 environ.py:351-369: the helper takes (new, old), and every SGL_* is copied to SGLANG_*.
ENVIRON_056 = """
class Envs:
    SGLANG_LOG_GC = EnvBool(False)
    SGLANG_ENABLE_JIT_DEEPGEMM = EnvBool(True)
    SGLANG_NSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD = EnvInt(2048)


def _print_deprecated_env(new_name: str, old_name: str):
    if old_name in os.environ:
        os.environ[new_name] = os.environ[old_name]


def _convert_SGL_to_SGLANG():
    _print_deprecated_env("SGLANG_LOG_GC", "SGLANG_GC_LOG")
    for key, value in os.environ.items():
        if key.startswith("SGL_"):
            new_key = key.replace("SGL_", "SGLANG_", 1)
"""
# 0.5.15 environ.py:629-631 and server_args.py:3864: the old name is a deprecated alias of the new one.
ENVIRON_0515 = """
class _DeprecatedEnvFallback:
    def __init__(self, default, deprecated_name):
        self.deprecated_name = deprecated_name


class Envs:
    SGLANG_ENABLE_JIT_DEEPGEMM = EnvBool(True)
    # SGLANG_ENABLE_DEEP_GEMM was its name long ago (a comment is not a read)
    SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD = EnvIntWithAlias(
        2048, deprecated_name="SGLANG_NSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD"
    )


def _print_deprecated_env(old_name: str, new_name: Optional[str] = None):
    pass


def _warn_deprecated_env_to_cli_flag(env_name: str, suggestion: str):
    pass


def _convert_SGL_to_SGLANG():
    _print_deprecated_env("SGLANG_GC_LOG", "SGLANG_LOG_GC")
    _warn_deprecated_env_to_cli_flag("SGLANG_ENABLE_GRPC", "Please use '--grpc-port'.")
"""
SERVER_ARGS_0515 = """
def _handle_model_specific_adjustments(self):
    if envs.SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD.is_set():
        pass
    envs.SGLANG_LOG_GC.get()
"""
OWN_CONFIG = """
class KimiK25Config(PretrainedConfig):
    model_type = "kimi_k25"
"""


def sources(*, glm5: bool, environ: str) -> dict[str, str]:
    files = {
        "sglang/srt/models/registry.py": REGISTRY,
        "sglang/srt/models/deepseek_v2.py": DEEPSEEK,
        "sglang/srt/environ.py": environ,
        "sglang/srt/configs/kimi_k25.py": OWN_CONFIG,
        "sglang/test/test_utils.py": 'os.environ["SGLANG_ENABLE_DEEP_GEMM"] = "0"\n',
    }
    if glm5:
        files["sglang/srt/models/glm4_moe.py"] = GLM4_MOE
    if environ is ENVIRON_0515:
        files["sglang/srt/server_args.py"] = SERVER_ARGS_0515
    return files


def wheel(tmp_path: Path, version: str, files: dict[str, str]) -> Path:
    path = tmp_path / "wheels" / f"sglang-{version}-py3-none-any.whl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(wheelfacts, "_facts", {})


@pytest.fixture
def release_056():
    return dataclasses.replace(
        facts_from_sources(sources(glm5=False, environ=ENVIRON_056), version="0.5.6"), wheel="sglang-0.5.6.whl"
    )


@pytest.fixture
def release_0515():
    return dataclasses.replace(
        facts_from_sources(sources(glm5=True, environ=ENVIRON_0515), version="0.5.15"), wheel="sglang-0.5.15.whl"
    )


# ------------------------------------------------------------------------------------------ the registry


def test_the_registry_is_what_entryclass_names(release_0515, release_056):
    assert release_0515.archs["GlmMoeDsaForCausalLM"] == "sglang/srt/models/glm4_moe.py:15"
    assert release_0515.archs["DeepseekV3ForCausalLM"] == "sglang/srt/models/deepseek_v2.py:10"
    assert "GlmMoeDsaForCausalLM" not in release_056.archs
    # A class a module defines but EntryClass does not name is not registered; nor is what a module imports.
    assert "Glm4Model" not in release_0515.archs and "_Base" not in release_0515.archs


def test_entryclass_names_follow_aliases_and_imports():
    text = (
        "from a import RealModel as Imported\n"
        "class Local: pass\n"
        "Alias = Local\n"
        "if HAS_X:\n"
        "    EntryClass = [Imported, Alias]\n"
        "EntryClass += [models.Other]\n"
    )
    assert wheelfacts._entry_classes(text) == {"RealModel": 5, "Local": 5, "Other": 6}


def test_sglangs_own_config_classes_are_known(release_0515):
    assert release_0515.config_types == {"kimi_k25": "sglang/srt/configs/kimi_k25.py:3"}


def test_a_wheel_whose_registry_changed_is_no_answer():
    with pytest.raises(ConfigCheckError, match="registry"):
        facts_from_sources({"sglang/srt/models/deepseek_v2.py": DEEPSEEK})


def test_facts_round_trip_through_json(release_0515):
    assert WheelFacts.from_json(json.loads(json.dumps(release_0515.to_json()))) == release_0515


# ------------------------------------------------------------------------------- environment variables


def test_a_variable_the_release_never_reads_is_a_warning(release_0515):
    (warning,) = env_warnings(release_0515, {"SGLANG_ENABLE_DEEP_GEMM": "0", "SGLANG_ENABLE_JIT_DEEPGEMM": "0"})
    # Named only in a comment and under sglang/test/: neither is a read.
    assert warning.startswith("sglang 0.5.15 never reads SGLANG_ENABLE_DEEP_GEMM")
    assert "sglang-0.5.15.whl" in warning


def test_an_old_name_read_only_as_a_deprecated_alias_is_a_warning_citing_is_set(release_0515):
    old, new = "SGLANG_NSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD", "SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD"
    (warning,) = env_warnings(release_0515, {old: "0", new: "0"})
    assert warning.startswith(f"{old} is read by sglang 0.5.15 only as the deprecated alias of {new}")
    assert "(sglang/srt/environ.py:11)" in warning  # the deprecated_name= line
    assert "`is_set()` asks the new name only (sglang/srt/server_args.py:3)" in warning
    assert warning.endswith(f"set {new}")


def test_the_same_names_in_the_older_release(release_056):
    old, new = "SGLANG_NSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD", "SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD"
    (warning,) = env_warnings(release_056, {old: "0", new: "0"})
    assert warning.startswith(f"sglang 0.5.6 never reads {new}")


def test_deprecation_helpers_whichever_order_their_parameters_take(release_056, release_0515):
    for facts in (release_056, release_0515):
        (warning,) = env_warnings(facts, {"SGLANG_GC_LOG": "1"})
        assert "SGLANG_GC_LOG is deprecated" in warning and warning.endswith("set SGLANG_LOG_GC")
    (warning,) = env_warnings(release_0515, {"SGLANG_ENABLE_GRPC": "1"})
    assert warning == "SGLANG_ENABLE_GRPC is deprecated in sglang 0.5.15 (sglang/srt/environ.py:25): it only warns"


def test_the_sgl_prefix_is_read_under_its_sglang_name(release_056):
    (warning,) = env_warnings(release_056, {"SGL_ENABLE_JIT_DEEPGEMM": "0"})
    assert warning.startswith("SGL_ENABLE_JIT_DEEPGEMM is read by sglang 0.5.6 only as SGLANG_ENABLE_JIT_DEEPGEMM")


def test_other_programs_variables_are_not_checked(release_0515):
    assert env_warnings(release_0515, {"HF_HOME": "/hf", "CUDA_VISIBLE_DEVICES": "", "NCCL_NVLS_ENABLE": "0"}) == []


def test_a_hash_inside_a_string_is_not_a_comment():
    assert wheelfacts._without_comment('x = "#SGLANG_A"  # SGLANG_B') == 'x = "#SGLANG_A"  '


# ------------------------------------------------------------------------------------------- the verdict


def cell_input(tmp_path: Path, version: str, *, gpu: str = "rtx-pro-6000", pins: dict | None = None) -> PreflightInput:
    plan = make_plan(REPO / "matrix" / "glm5-nvfp4.toml", select=[f"gpu={gpu}", "mode=baseline"])
    cell = next(c for c in plan.cells if c.applicable)
    cell = dataclasses.replace(cell, env=dataclasses.replace(cell.env, axes={**cell.env.axes, "sglang": version}))
    return PreflightInput(
        cell=cell,
        engine=plan.spec.engine,
        pins=pins if pins is not None else {"transformers": "4.57.1"},
        cache_dir=tmp_path,
        model_config=model_config_dir(plan.spec),
    )


UNKNOWN_GLM5 = (
    "ValueError: The checkpoint you are trying to load has model type `glm_moe_dsa` but Transformers does not "
    "recognize this architecture. This could be because of an issue with the checkpoint, or because your "
    "version of Transformers is out of date."
)


def answers(monkeypatch, **by_version: TransformersAnswer) -> list[str]:
    asked: list[str] = []

    def reads(model, *, transformers_version, **_):
        asked.append(transformers_version)
        return by_version[transformers_version]

    monkeypatch.setattr(configcheck, "transformers_reads", reads)
    return asked


def test_a_0_5_6_shaped_release_cannot_load_glm5(tmp_path, monkeypatch):
    wheel(tmp_path, "0.5.6", sources(glm5=False, environ=ENVIRON_056))
    answers(
        monkeypatch, **{"4.57.1": TransformersAnswer(version="4.57.1", ok=False, error=UNKNOWN_GLM5, python="3.12")}
    )
    result = PREFLIGHTS["config"](cell_input(tmp_path, "0.5.6"))
    assert str(result) == "predicted-fail:model-unsupported"
    transformers, registry, warning = result.evidence
    assert transformers == "config: transformers 4.57.1 (the lock's) cannot read model_type glm_moe_dsa (Python 3.12)"
    assert registry.startswith("config: sglang 0.5.6 has no class for GlmMoeDsaForCausalLM")
    assert "sglang-0.5.6-py3-none-any.whl" in registry
    assert warning.startswith("config: warning: sglang 0.5.6 never reads SGLANG_ENABLE_DEEP_GEMM")
    # The excerpt is transformers' own message: the failure pages find the class's line in it.
    match = classify_text(result.excerpt, "sglang")
    assert match is not None and match.cls == "model-unsupported"


def test_a_release_without_the_class_fails_even_when_transformers_reads_the_type(tmp_path, monkeypatch):
    wheel(tmp_path, "0.5.6", sources(glm5=False, environ=ENVIRON_056))
    answers(monkeypatch, **{"5.3.0": TransformersAnswer(version="5.3.0", ok=True, python="3.12")})
    result = PREFLIGHTS["config"](cell_input(tmp_path, "0.5.6", pins={"transformers": "5.3.0"}))
    assert str(result) == "predicted-fail:model-unsupported"
    assert result.evidence[0].startswith("config: sglang 0.5.6 has no class for GlmMoeDsaForCausalLM")
    assert "TransformersForCausalLM" in result.excerpt


def test_a_release_that_knows_the_model_passes_and_says_where(tmp_path, monkeypatch):
    wheel(tmp_path, "0.5.15", sources(glm5=True, environ=ENVIRON_0515))
    answers(monkeypatch, **{"5.12.1": TransformersAnswer(version="5.12.1", ok=True, python="3.12", cached=True)})
    result = PREFLIGHTS["config"](cell_input(tmp_path, "0.5.15", pins={"transformers": "5.12.1"}))
    assert result is not None and result.kind == "pass"
    assert result.evidence[0] == (
        "config: sglang 0.5.15 defines GlmMoeDsaForCausalLM (sglang/srt/models/glm4_moe.py:15 in "
        "sglang-0.5.15-py3-none-any.whl); transformers 5.12.1 (the lock's) reads glm_moe_dsa (Python 3.12, cached)"
    )
    assert result.evidence[1].startswith("config: warning: sglang 0.5.15 never reads SGLANG_ENABLE_DEEP_GEMM")


def test_a_model_type_sglang_defines_itself_needs_no_transformers(tmp_path, monkeypatch):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "kimi_k25", "architectures": ["DeepseekV3ForCausalLM"]})
    )
    wheel(tmp_path, "0.5.15", sources(glm5=True, environ=ENVIRON_0515))
    asked = answers(monkeypatch)
    inp = dataclasses.replace(cell_input(tmp_path, "0.5.15"), model_config=folder)
    result = PREFLIGHTS["config"](inp)
    assert result is not None and result.kind == "pass" and asked == []
    assert (
        "sglang 0.5.15 has its own config class for kimi_k25 (sglang/srt/configs/kimi_k25.py:3)" in result.evidence[0]
    )


def test_without_a_lock_the_registry_still_decides(tmp_path, monkeypatch):
    wheel(tmp_path, "0.5.6", sources(glm5=False, environ=ENVIRON_056))
    asked = answers(monkeypatch)
    result = PREFLIGHTS["config"](cell_input(tmp_path, "0.5.6", pins={}))
    assert str(result) == "predicted-fail:model-unsupported" and asked == []


def test_no_wheel_is_no_answer(tmp_path, monkeypatch):
    def missing(*args, **kwargs):
        raise wheelfacts.WheelUnavailable("could not download sglang==0.5.6: no such file")

    monkeypatch.setattr(wheelfacts, "download_wheel", missing)
    with pytest.raises(PreflightUnavailable, match="could not download"):
        PREFLIGHTS["config"](cell_input(tmp_path, "0.5.6"))

    def unreachable(*args, **kwargs):
        raise wheelfacts.IndexUnreachable("no package index is reachable from this host (pip download: refused)")

    # The flags pre-flight, which runs first, says that once for the run; this one only says it has no wheel.
    monkeypatch.setattr(wheelfacts, "download_wheel", unreachable)
    with pytest.raises(PreflightUnavailable, match=r"no sglang 0\.5\.6 wheel to read: no index answers this host"):
        PREFLIGHTS["config"](cell_input(tmp_path, "0.5.6"))


def test_transformers_that_cannot_run_here_leaves_the_registrys_answer(tmp_path, monkeypatch):
    wheel(tmp_path, "0.5.15", sources(glm5=True, environ=ENVIRON_0515))

    def broken(*args, **kwargs):
        raise ConfigCheckError("uv could not resolve")

    monkeypatch.setattr(configcheck, "transformers_reads", broken)
    result = PREFLIGHTS["config"](cell_input(tmp_path, "0.5.15", pins={"transformers": "5.12.1"}))
    assert result is not None and result.kind == "pass"
    assert "transformers 5.12.1 could not be run here (uv could not resolve)" in result.evidence[0]


def test_the_wheel_is_read_once_and_cached(tmp_path, monkeypatch):
    path = wheel(tmp_path, "0.5.15", sources(glm5=True, environ=ENVIRON_0515))
    first = wheelfacts.wheel_facts("0.5.15", cache_dir=tmp_path)
    assert first == facts_from_wheel(path, version="0.5.15")
    path.unlink()
    monkeypatch.setattr(wheelfacts, "_facts", {})
    monkeypatch.setattr(wheelfacts, "download_wheel", lambda *a, **k: pytest.fail("the cached facts were not used"))
    assert wheelfacts.wheel_facts("0.5.15", cache_dir=tmp_path) == first


# ------------------------------------------------------------------------------- the transformers venv


def test_transformers_is_resolved_with_the_locks_pins_installed_once_and_its_answer_cached(tmp_path, monkeypatch):
    model = read_model_config(GLM5)
    assert model is not None and model.model_type == "glm_moe_dsa"
    calls: list[list[str]] = []

    def run(argv, *, timeout_s, env=None, cwd=None):
        calls.append(list(argv))
        if "compile" in argv:
            constraints = Path(argv[argv.index("--constraint") + 1]).read_text().split()
            assert "torch==2.9.1" in constraints and not any(c.startswith("transformers==") for c in constraints)
            assert env is not None and env["UV_PYTHON_DOWNLOADS"] == "never"
            return Captured(returncode=0, stdout="huggingface-hub==0.36.0\ntransformers==4.57.1\n", stderr="")
        assert env is not None and env["HF_HUB_OFFLINE"] == "1"
        answer = {"transformers": "4.57.1", "ok": False, "error": UNKNOWN_GLM5}
        return Captured(returncode=0, stdout="noise\n" + json.dumps(answer) + "\n", stderr="")

    installs: list[list[str]] = []

    def ensure_venv(env_dir, requirements, *, timeout_s, python=None, what=""):
        installs.append(list(requirements))
        return Path(sys.executable)

    monkeypatch.setattr(configcheck, "run_captured", run)
    monkeypatch.setattr(configcheck, "find_interpreter", lambda version: sys.executable)
    monkeypatch.setattr(traceprobe, "ensure_venv", ensure_venv)
    pins = {"transformers": "4.57.1", "torch": "2.9.1", "huggingface-hub": "0.36.0"}
    kwargs = {"transformers_version": "4.57.1", "pins": pins, "python_version": "3.12", "cache_dir": tmp_path}
    answer = configcheck.transformers_reads(model, **kwargs)
    assert answer.unknown_type and not answer.cached and answer.version == "4.57.1"
    assert installs == [["--no-deps", "huggingface-hub==0.36.0", "transformers==4.57.1"]]  # no torch
    again = configcheck.transformers_reads(model, **kwargs)
    assert again.cached and again.error == answer.error
    assert len(calls) == 2 and len(installs) == 1  # one resolution, one run: the second answer is the cache's


def test_a_failure_that_is_not_the_model_type_is_not_unknown_type():
    answer = TransformersAnswer(version="5.3.0", ok=False, error="TypeError: rope_parameters must be a dict")
    assert not answer.unknown_type


# ------------------------------------------------------------------------------- the real releases


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize(("version", "verdict"), [("0.5.6", "predicted-fail:model-unsupported"), ("0.5.17", "pass")])
def test_the_real_releases(tmp_path_factory, version, verdict):
    """The real wheel and the committed lock's transformers (RTX PRO 6000, flashinfer_cutlass): 0.5.6 predates
    GLM-5's class and its transformers 4.57.1 cannot read `glm_moe_dsa`; 0.5.17 has both."""
    cache = tmp_path_factory.getbasetemp() / "configcheck-real"  # one wheel and venv cache for both cases
    plan = make_plan(REPO / "matrix" / "glm5-nvfp4.toml", select=[f"sglang={version}", "gpu=rtx-pro-6000"])
    cell = next(
        c
        for c in plan.cells
        if c.applicable and c.env.axes["moe_runner"] == "flashinfer_cutlass" and c.env.axes["flashinfer"] == "pinned"
    )
    lock = REPO / "matrix" / "locks" / f"{cell.env_id}.lock.txt"
    inp = PreflightInput(
        cell=cell,
        engine=plan.spec.engine,
        pins=parse_pins(lock.read_text()),
        cache_dir=cache,
        model_config=model_config_dir(plan.spec),
    )
    result = PREFLIGHTS["config"](inp)  # CI reaches the index: a check that cannot run is a failure here
    assert str(result) == verdict, result
    text = "\n".join(result.evidence)
    assert f"sglang {version} never reads SGLANG_ENABLE_DEEP_GEMM" in text
    if verdict == "pass":
        assert "defines GlmMoeDsaForCausalLM (sglang/srt/models/glm4_moe.py:" in text
        assert "transformers 5.12.1 (the lock's) reads glm_moe_dsa" in text
    else:
        assert "transformers 4.57.1 (the lock's) cannot read model_type glm_moe_dsa" in text
        assert "sglang 0.5.6 has no class for GlmMoeDsaForCausalLM" in text
