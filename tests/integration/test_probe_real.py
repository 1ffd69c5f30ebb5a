"""The CPU pre-flight checks against the real things: sglang wheels from the package index, and real
torch + flashinfer-python venvs traced by dynamo.

These pin down the facts in shared/domain.md ("The piecewise CUDA graph flags change with the sglang
version", "The FP4 / dynamo failure"): if a release or the index changes them, these tests say so.

The trace probe's venvs are kept between runs (they take a minute or two to build) in
$SERVEMATRIX_TEST_CACHE, default ~/.cache/servematrix/test-probe; its results are cleared first so the
probe really runs. The installer is $SERVEMATRIX_PROBE_INSTALLER, default pip here: on this machine pip
takes a CPU build of torch from local disk, which is what "a CPU build of torch" below means; uv fetches
the index's CUDA build, which gives the same verdicts on a CPU.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from packaging.version import Version

from servematrix.engines.sglang import flagsurface
from servematrix.engines.sglang import traceprobe as probe
from servematrix.engines.sglang.flagsurface import flag_check
from servematrix.engines.sglang.traceprobe import trace_probe

pytestmark = [pytest.mark.integration, pytest.mark.slow]

VERSIONS = ("0.5.6", "0.5.9", "0.5.10", "0.5.12", "0.5.13", "0.5.14", "0.5.17", "0.5.21", "0.5.22", "0.5.23")
PIECEWISE_FLAGS = (
    "--enable-piecewise-cuda-graph",
    "--enforce-piecewise-cuda-graph",
    "--disable-piecewise-cuda-graph",
    "--piecewise-cuda-graph-compiler",
    "--piecewise-cuda-graph-tokens",
    "--piecewise-cuda-graph-max-tokens",
)
A = "accepted"
D = "deprecated"
X = "absent"

# What each release's parser does with the piecewise flags, per the domain notes' table.
EXPECTED_PIECEWISE = {
    "0.5.6": (A, X, X, A, A, A),
    "0.5.9": (A, X, X, A, A, A),
    "0.5.10": (D, A, A, A, A, A),
    "0.5.12": (D, A, A, A, A, A),
    "0.5.13": (D, A, A, A, A, A),
    "0.5.14": (X, D, D, D, D, D),  # --enable-... removed; the rest become deprecated aliases
    "0.5.17": (X, D, D, D, D, D),
    "0.5.21": (X, X, X, X, X, X),  # the aliases are gone from 0.5.20
    "0.5.22": (X, X, X, X, X, X),
    "0.5.23": (X, X, X, X, X, X),
}


@pytest.fixture(scope="module")
def wheel_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sglang-wheels")


@pytest.fixture(scope="module")
def surfaces(wheel_cache) -> dict[str, flagsurface.FlagSurface]:
    return {v: flagsurface.flag_surface(v, cache_dir=wheel_cache) for v in VERSIONS}


def state(surface: flagsurface.FlagSurface, flag: str) -> str:
    if flag not in surface.flags:
        return X
    return D if flag in surface.deprecated else A


@pytest.mark.parametrize("version", VERSIONS)
def test_piecewise_flags_per_release(surfaces, version):
    surface = surfaces[version]
    assert tuple(state(surface, f) for f in PIECEWISE_FLAGS) == EXPECTED_PIECEWISE[version]


@pytest.mark.parametrize("version", VERSIONS)
def test_cuda_graph_backend_prefill_from_0_5_14(surfaces, version):
    surface = surfaces[version]
    if version in ("0.5.14", "0.5.17", "0.5.21"):
        assert "tc_piecewise" in surface.choices["--cuda-graph-backend-prefill"]
        assert "disabled" in surface.choices["--cuda-graph-backend-prefill"]
    elif version in ("0.5.22", "0.5.23"):
        # The domain notes date the removal of tc_piecewise to 0.5.23; the 0.5.22 wheel already has it.
        assert surface.choices["--cuda-graph-backend-prefill"] == ("full", "breakable", "disabled")
        bad = flagsurface.invalid_choices(["--cuda-graph-backend-prefill", "tc_piecewise"], surface.choices)
        assert bad == [("--cuda-graph-backend-prefill", "tc_piecewise")]
    else:
        assert "--cuda-graph-backend-prefill" not in surface.flags


@pytest.mark.parametrize("version", VERSIONS)
def test_dsa_replaces_nsa_backend_flags_from_0_5_13(surfaces, version):
    surface = surfaces[version]
    older = version in ("0.5.6", "0.5.9", "0.5.10", "0.5.12")
    assert state(surface, "--dsa-decode-backend") == (X if older else A)
    expected_nsa = A if older else (X if Version(version) >= Version("0.5.20") else D)
    assert state(surface, "--nsa-decode-backend") == expected_nsa


def test_piecewise_compiler_choices(surfaces):
    for version in ("0.5.6", "0.5.9", "0.5.14"):
        assert surfaces[version].choices["--piecewise-cuda-graph-compiler"] == ("eager", "inductor")


def glm5_b200_argv(version: str) -> list[str]:
    attention = "dsa" if version not in ("0.5.9", "0.5.10", "0.5.12") else "nsa"
    return [
        "python", "-m", "sglang.launch_server", "--model-path", "nvidia/GLM-5-NVFP4", "--tp", "4",
        "--trust-remote-code", "--quantization", "modelopt_fp4", "--kv-cache-dtype", "fp8_e4m3",
        "--moe-runner-backend", "flashinfer_trtllm", f"--{attention}-decode-backend", "trtllm",
        f"--{attention}-prefill-backend", "trtllm", "--mem-fraction-static", "0.9",
        "--chunked-prefill-size", "32768",
    ]  # fmt: skip


@pytest.mark.parametrize("version", VERSIONS[1:])
def test_glm5_cookbook_argv_is_accepted(surfaces, wheel_cache, version):
    check = flag_check(sglang_version=version, argv=glm5_b200_argv(version), cache_dir=wheel_cache)
    assert check.ok, check.evidence


def test_a_piecewise_argv_for_the_wrong_release_is_caught(wheel_cache):
    on_0_5_9 = ["--model-path", "m", "--enable-piecewise-cuda-graph"]
    assert flag_check(sglang_version="0.5.9", argv=on_0_5_9, cache_dir=wheel_cache).ok
    moved = flag_check(sglang_version="0.5.14", argv=on_0_5_9, cache_dir=wheel_cache)
    assert moved.unknown == ("--enable-piecewise-cuda-graph",)
    removed = flag_check(
        sglang_version="0.5.23", argv=["--cuda-graph-backend-prefill", "tc_piecewise"], cache_dir=wheel_cache
    )
    assert removed.invalid == (("--cuda-graph-backend-prefill", "tc_piecewise"),)


def test_flag_surface_is_cached_per_version(wheel_cache, surfaces):
    assert (wheel_cache / "flagsurface" / "sglang-0.5.23.json").is_file()
    started = time.monotonic()
    assert flagsurface.accepted_flags("0.5.23", cache_dir=wheel_cache) == surfaces["0.5.23"].flags
    assert time.monotonic() - started < 1.0


# ---------------------------------------------------------------------------------------- trace probe

TORCH = "2.13.0"


@pytest.fixture(scope="module")
def probe_cache() -> Path:
    root = Path(os.environ.get("SERVEMATRIX_TEST_CACHE") or Path.home() / ".cache" / "servematrix" / "test-probe")
    shutil.rmtree(root / "probe" / "results", ignore_errors=True)
    return root


@pytest.fixture(autouse=True)
def installer(monkeypatch):
    installer = os.environ.get(probe.INSTALLER_ENV) or "pip"
    if installer == "uv" and shutil.which("uv") is None:
        pytest.skip("uv is not on PATH")
    monkeypatch.setenv(probe.INSTALLER_ENV, installer)
    return installer


def timed_probe(cache: Path, flashinfer: str, entry: str, arch: str) -> probe.ProbeResult:
    reused = (cache / "probe" / "venvs" / f"torch-{TORCH}__flashinfer-{flashinfer}" / probe._READY).is_file()
    result = trace_probe(torch_version=TORCH, flashinfer_version=flashinfer, entry=entry, arch=arch, cache_dir=cache)
    print(f"\nprobe torch {result.torch} flashinfer {flashinfer} {entry} sm_{arch}: {result.seconds:.1f} s "
          f"({'venv reused' if reused else 'venv built'}) traceable={result.traceable}")  # fmt: skip
    if reused:
        assert result.seconds < 60
    return result


@pytest.mark.parametrize("arch", ["120", "100"])
def test_flashinfer_0_6_3_plain_getter_is_untraceable(probe_cache, arch):
    result = timed_probe(probe_cache, "0.6.3", "plain", arch)
    assert result.traceable is False, result.error
    assert "Attempted to call function marked as skipped" in result.evidence
    assert "_thread.allocate_lock" in result.evidence
    assert "flashinfer.fp4_quantization" in result.evidence  # the pre-0.6.7 module path
    assert not result.cached


def test_flashinfer_0_6_3_has_no_custom_op(probe_cache):
    result = timed_probe(probe_cache, "0.6.3", "custom-op", "120")
    assert result.traceable is None
    assert "torch.ops.flashinfer.fp4_quantize is not registered" in result.error


def test_sglang_wrapper_traces_with_flashinfer_0_6_3_but_notes_the_backend_kwarg(probe_cache):
    result = timed_probe(probe_cache, "0.6.3", "sglang-op", "120")
    assert result.traceable is True, result.error
    assert "backend=" in result.evidence


def test_flashinfer_0_6_12_custom_op_traces(probe_cache):
    result = timed_probe(probe_cache, "0.6.12", "custom-op", "120")
    assert result.traceable is True, result.error
    assert "flashinfer.fp4_quantize" in result.evidence


def test_flashinfer_0_6_12_plain_getter_is_still_untraceable(probe_cache):
    # sm_120 takes the sm_120f branch, which reads torch.version.cuda first (see assume_cuda).
    result = timed_probe(probe_cache, "0.6.12", "plain", "120")
    assert result.traceable is False, result.error
    assert "Attempted to call function marked as skipped" in result.evidence
    assert "flashinfer.quantization.fp4_quantization" in result.evidence


def test_a_second_probe_is_served_from_the_cache(probe_cache):
    first = timed_probe(probe_cache, "0.6.12", "custom-op", "100")
    started = time.monotonic()
    again = trace_probe(
        torch_version=TORCH, flashinfer_version="0.6.12", entry="custom-op", arch="100", cache_dir=probe_cache
    )
    assert again.cached and again.traceable is first.traceable
    assert time.monotonic() - started < 1.0


# ---- one cell per prefill CUDA-graph backend, with each release's own flags (read from its wheel) ----------

ALL_RELEASES = tuple(f"0.5.{n}" for n in range(4, 24))
PREFILL_MODES = ("baseline", "piecewise", "breakable", "full")
# What each release offers, from its wheel (notes in the engine data): piecewise 0.5.4-0.5.21, breakable from
# 0.5.11, a full prefill graph from 0.5.15; prefill graphs can always be switched off.
OFFERED = {
    "baseline": lambda v: True,
    "piecewise": lambda v: v < Version("0.5.22"),
    "breakable": lambda v: v >= Version("0.5.11"),
    "full": lambda v: v >= Version("0.5.15"),
}


@pytest.fixture(scope="module")
def every_surface(wheel_cache) -> dict[str, flagsurface.FlagSurface]:
    return {v: flagsurface.flag_surface(v, cache_dir=wheel_cache) for v in ALL_RELEASES}


@pytest.mark.parametrize("version", ALL_RELEASES)
def test_plan_gives_one_cell_per_prefill_backend_the_release_offers(every_surface, write_matrix, version):
    from servematrix.planning.plan import make_plan

    plan = make_plan(
        write_matrix(
            f"""
engine = "sglang"
[model]
name = "m"
path = "/models/m"
[axes]
sglang = ["{version}"]
torch = ["pinned"]
flashinfer = ["pinned"]
cuda = ["13.0"]
gpu = ["h200"]
mode = {list(PREFILL_MODES)!r}
[gpu.h200]
arch = "sm_90"
count = 1
[bench]
concurrency = [1]
input_len = 8
output_len = 8
prompts_per_concurrency = 2
"""
        )
    )
    surface = every_surface[version]
    cells = {c.mode: c for c in plan.cells}
    assert set(cells) == set(PREFILL_MODES)
    for mode, cell in cells.items():
        flags = plan.spec.engine.mode_flags_for(mode, version)
        assert cell.applicable == OFFERED[mode](Version(version)), (mode, cell.reason)
        if cell.applicable:
            # The release's own parser takes the mode's flags: every flag exists, every choice is allowed.
            assert not flagsurface.unknown_flags(flags.args, surface.flags), (mode, flags.args)
            assert not flagsurface.invalid_choices(list(flags.args), surface.choices), (mode, flags.args)
            assert all(arg in cell.command for arg in flags.args)
    backend = surface.choices.get("--cuda-graph-backend-prefill", ())
    if "breakable" not in backend:
        assert "--enable-breakable-cuda-graph" in surface.flags or not cells["breakable"].applicable
    if Version(version) >= Version("0.5.22"):
        assert "tc_piecewise" not in backend  # piecewise: not applicable, because the wheel rejects it
    if Version(version) < Version("0.5.11"):
        assert "--enable-breakable-cuda-graph" not in surface.flags and "breakable" not in backend
    if Version(version) < Version("0.5.14"):
        assert "--cuda-graph-backend-prefill" not in surface.flags  # so no full prefill graph either
