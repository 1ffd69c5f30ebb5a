"""Unit tests of the probe stage: the data-driven lookups, the result cache and the venv/runner plumbing,
with every subprocess replaced. No network, no torch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from servematrix import util
from servematrix.engines.sglang import flagsurface
from servematrix.engines.sglang import traceprobe as probe
from servematrix.engines.sglang.flagsurface import flag_check
from servematrix.engines.sglang.traceprobe import (
    ProbeResult,
    entry_point_for,
    flashinfer_has,
    fp4_entry_rule,
    fp4_module_for,
    piecewise_traces_with_dynamo,
    probe_cell,
    trace_probe,
)
from servematrix.util import Captured

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "flagsurface"

# ------------------------------------------------------------------------------------ entry lookup


@pytest.mark.parametrize(
    ("sglang", "arch", "flashinfer", "entry"),
    [
        ("0.5.6", "120", "0.5.3", "plain"),
        ("0.5.8", "120", "0.6.1", "plain"),  # not a listed release: resolves by range
        ("0.5.9", "120", "0.6.3", "plain"),
        ("0.5.9", "100", "0.6.3", "plain"),  # 0.5.9's MoE paths on sm_100
        ("0.5.10", "100", "0.6.7.post2", None),  # sm_100 < 0.5.12 quantizes with scaled_fp4_quant
        ("0.5.11", "120", "0.6.8.post1", "plain"),
        ("0.5.12", "120", "0.6.3", "sglang-op"),  # sglang's own op: independent of flashinfer's
        ("0.5.12", "100", "0.6.11.post1", "sglang-op"),
        ("0.5.14", "120", "0.6.12", "sglang-op"),
        ("0.5.23", "100", "0.7.2", "sglang-op"),
        ("0.5.5", "120", "0.5.3", None),  # not covered by the data
        ("0.5.12", "90", "0.6.12", None),  # an arch without NVFP4
    ],
)
def test_entry_point_for(sglang, arch, flashinfer, entry):
    assert entry_point_for(sglang, arch, flashinfer) == entry


def test_no_entry_and_unknown_are_told_apart_by_the_rule():
    assert fp4_entry_rule("0.5.10", "100").entry == "none"
    assert fp4_entry_rule("0.5.5", "120") is None
    assert "fp4_utils" in fp4_entry_rule("0.5.12", "120").source


@pytest.mark.parametrize("arch", ["120", "sm_120", "sm120a", "12.0", 120, "120f"])
def test_arch_spellings(arch):
    assert entry_point_for("0.5.9", arch, "0.6.3") == "plain"


def test_bad_arch_and_version_are_errors():
    with pytest.raises(ValueError, match="arch"):
        entry_point_for("0.5.9", "blackwell", "0.6.3")
    with pytest.raises(ValueError, match="version"):
        entry_point_for("latest", "120", "0.6.3")


@pytest.mark.parametrize(
    ("flashinfer", "module"),
    [
        ("0.5.3", "flashinfer.fp4_quantization"),
        ("0.6.3", "flashinfer.fp4_quantization"),
        ("0.6.7.post2", "flashinfer.quantization.fp4_quantization"),
        ("0.6.12", "flashinfer.quantization.fp4_quantization"),
        ("0.7.2", "flashinfer.quantization.fp4_quantization"),
    ],
)
def test_fp4_module_for(flashinfer, module):
    assert fp4_module_for(flashinfer) == module


@pytest.mark.parametrize(
    ("feature", "version", "has"),
    [
        ("custom_op", "0.6.11.post1", False),
        ("custom_op", "0.6.12", True),
        ("custom_op", "0.7.2", True),
        ("backend_kwarg", "0.6.7.post2", False),
        ("backend_kwarg", "0.6.8.post1", True),
    ],
)
def test_flashinfer_features(feature, version, has):
    assert flashinfer_has(feature, version) is has


def test_unknown_feature():
    with pytest.raises(KeyError, match="custom_op"):
        flashinfer_has("fp8", "0.6.12")


@pytest.mark.parametrize(
    ("sglang", "piecewise", "default"),
    [
        ("0.5.3", None, None),
        ("0.5.9", True, False),
        ("0.5.10", True, True),
        ("0.5.14", True, True),
        ("0.5.15", True, False),  # default prefill backend becomes breakable
        ("0.5.21", True, False),
        ("0.5.22", None, None),  # tc_piecewise removed (the 0.5.22 wheel, not 0.5.23 as first noted)
        ("0.5.23", None, None),
    ],
)
def test_piecewise_traces_with_dynamo(sglang, piecewise, default):
    assert piecewise_traces_with_dynamo(sglang) is piecewise
    assert piecewise_traces_with_dynamo(sglang, default=True) is default


def test_data_file_rows_are_all_valid():
    data = probe._data()
    assert data.entries and data.modules and data.piecewise
    assert {rule.entry for rule in data.entries} <= {*probe.ENTRIES, "none"}
    assert all(p.count("{") == p.count("}") for p in data.probe.packages)


# ------------------------------------------------------------------------------------ trace probe


class FakeProbe:
    """Replaces the venv build and the probe-script run; records what ran."""

    def __init__(self, monkeypatch, report: dict | None, *, stdout: str | None = None, returncode: int = 0):
        self.runs: list[list[str]] = []
        self.builds: list[Path] = []
        self.report, self.stdout, self.returncode = report, stdout, returncode

        def ensure_env(env_dir, **kw):
            self.builds.append(env_dir)
            return Path(sys.executable)

        def run(argv, *, timeout_s, env, cwd=None):
            self.runs.append(argv)
            assert "PYTHONPATH" not in env and env["CUDA_VISIBLE_DEVICES"] == ""
            out = self.stdout if self.stdout is not None else "noise\n" + json.dumps(self.report) + "\n"
            return Captured(returncode=self.returncode, stdout=out, stderr="a warning on stderr\n")

        monkeypatch.setattr(probe, "_ensure_env", ensure_env)
        monkeypatch.setattr(probe, "run_captured", run)


UNTRACEABLE = {
    "traceable": False,
    "error_type": "torch._dynamo.exc.Unsupported",
    "message": "Attempted to call function marked as skipped\n  Explanation: ... `_thread.allocate_lock.` ...",
    "torch": "2.13.0+cpu",
    "flashinfer": "0.6.3",
    "module": "flashinfer.fp4_quantization",
    "graph": [],
}
TRACEABLE = {
    "traceable": True,
    "error_type": "",
    "message": "",
    "torch": "2.13.0+cpu",
    "flashinfer": "0.6.12",
    "module": "torch.ops.flashinfer",
    "graph": ["flashinfer.fp4_quantize", "<built-in function getitem>"],
}


def test_untraceable_result_carries_the_dynamo_evidence_and_is_cached(tmp_path, monkeypatch):
    fake = FakeProbe(monkeypatch, UNTRACEABLE)
    first = trace_probe(
        torch_version="2.13.0", flashinfer_version="0.6.3", entry="plain", arch="120", cache_dir=tmp_path
    )
    assert first.traceable is False and not first.cached
    assert "Attempted to call function marked as skipped" in first.evidence
    assert first.torch == "2.13.0+cpu" and first.arch == "120" and first.error == ""
    argv = fake.runs[0]
    assert argv[argv.index("--module") + 1] == "flashinfer.fp4_quantization"
    assert argv[argv.index("--assume-cuda") + 1] == "13.0"

    again = trace_probe(
        torch_version="2.13.0", flashinfer_version="0.6.3", entry="plain", arch="sm_120", cache_dir=tmp_path
    )
    assert again.cached and len(fake.runs) == 1
    assert again == ProbeResult(**{**first.__dict__, "cached": True})


def test_cache_key_is_torch_flashinfer_entry_arch_and_the_probe_code(tmp_path, monkeypatch):
    fake = FakeProbe(monkeypatch, TRACEABLE)
    for entry, arch in (("custom-op", "120"), ("custom-op", "100"), ("sglang-op", "120"), ("custom-op", "120")):
        trace_probe(torch_version="2.13.0", flashinfer_version="0.6.12", entry=entry, arch=arch, cache_dir=tmp_path)
    assert len(fake.runs) == 3
    assert "--module" not in fake.runs[0]  # only the plain entry needs the getter's module
    names = sorted(p.name for p in (tmp_path / "probe" / "results").iterdir())
    code = probe.probe_code_version()
    assert names == [
        f"torch-2.13.0__flashinfer-0.6.12__custom-op__sm100__{code}.json",
        f"torch-2.13.0__flashinfer-0.6.12__custom-op__sm120__{code}.json",
        f"torch-2.13.0__flashinfer-0.6.12__sglang-op__sm120__{code}.json",
    ]
    # Another probe script (one byte): the cached results are not its results, it probes again.
    monkeypatch.setattr(probe, "probe_code_version", lambda: "another-script")
    trace_probe(torch_version="2.13.0", flashinfer_version="0.6.12", entry="custom-op", arch="120", cache_dir=tmp_path)
    assert len(fake.runs) == 4


def test_traceable_evidence_names_the_graph_and_the_backend_kwarg_note(tmp_path, monkeypatch):
    FakeProbe(monkeypatch, {**TRACEABLE, "flashinfer": "0.6.3", "accepts_backend_kwarg": False})
    result = trace_probe(
        torch_version="2.13.0", flashinfer_version="0.6.3", entry="sglang-op", arch="120", cache_dir=tmp_path
    )
    assert result.traceable is True
    assert "flashinfer.fp4_quantize" in result.evidence
    assert "backend=" in result.evidence and "TypeError" in result.evidence


def test_an_absent_custom_op_is_undecided_but_cached(tmp_path, monkeypatch):
    report = {**TRACEABLE, "traceable": None, "error_type": "builtins.LookupError", "message": "not registered"}
    fake = FakeProbe(monkeypatch, report)
    for _ in range(2):
        result = trace_probe(
            torch_version="2.13.0", flashinfer_version="0.6.3", entry="custom-op", arch="120", cache_dir=tmp_path
        )
    assert result.traceable is None and "not registered" in result.error
    assert len(fake.runs) == 1


def test_an_inconclusive_probe_is_not_cached(tmp_path, monkeypatch):
    report = {**UNTRACEABLE, "traceable": None, "error_type": "builtins.ImportError", "message": "no flashinfer"}
    fake = FakeProbe(monkeypatch, report)
    for _ in range(2):
        result = trace_probe(
            torch_version="2.13.0", flashinfer_version="0.6.3", entry="plain", arch="120", cache_dir=tmp_path
        )
    assert result.traceable is None and "ImportError: no flashinfer" in result.error
    assert len(fake.runs) == 2


def test_a_crashed_probe_script_is_an_error(tmp_path, monkeypatch):
    FakeProbe(monkeypatch, None, stdout="", returncode=1)
    result = trace_probe(
        torch_version="2.13.0", flashinfer_version="0.6.3", entry="plain", arch="120", cache_dir=tmp_path
    )
    assert result.traceable is None and "no report (exit 1)" in result.error and "warning" in result.error


def test_a_failed_venv_build_is_an_error(tmp_path, monkeypatch):
    def broken(env_dir, **kw):
        raise probe._EnvError("probe venv: `uv pip install` failed: No solution found")

    monkeypatch.setattr(probe, "_ensure_env", broken)
    result = trace_probe(
        torch_version="2.13.0", flashinfer_version="9.9", entry="plain", arch="120", cache_dir=tmp_path
    )
    assert result.traceable is None and "No solution found" in result.error
    assert not (tmp_path / "probe" / "results").exists()


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"entry": "fp4_quantize"}, "entry"),
        ({"torch_version": "../2.13"}, "torch"),
        ({"flashinfer_version": "0.6.3 --index-url x"}, "flashinfer"),
    ],
)
def test_bad_arguments(tmp_path, kw, message):
    args = {"torch_version": "2.13.0", "flashinfer_version": "0.6.3", "entry": "plain", "arch": "120"} | kw
    with pytest.raises(ValueError, match=message):
        trace_probe(cache_dir=tmp_path, **args)


def test_probe_cell_skips_what_has_nothing_to_probe(tmp_path, monkeypatch):
    fake = FakeProbe(monkeypatch, UNTRACEABLE)
    common = {"torch_version": "2.9.1", "cache_dir": tmp_path}
    assert probe_cell(sglang_version="0.5.23", flashinfer_version="0.7.2", arch="100", **common) is None
    assert probe_cell(sglang_version="0.5.10", flashinfer_version="0.6.7.post2", arch="100", **common) is None
    result = probe_cell(sglang_version="0.5.9", flashinfer_version="0.6.3", arch="120", **common)
    assert result.entry == "plain" and result.traceable is False and len(fake.runs) == 1


# ------------------------------------------------------------------------------------------ venvs


def test_installer_env_var(monkeypatch):
    monkeypatch.delenv(probe.INSTALLER_ENV, raising=False)
    assert probe._installer() == "uv"
    monkeypatch.setenv(probe.INSTALLER_ENV, "PIP")
    assert probe._installer() == "pip"
    monkeypatch.setenv(probe.INSTALLER_ENV, "conda")
    with pytest.raises(ValueError, match="uv"):
        probe._installer()


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_venv_is_built_once_with_the_pair(tmp_path, monkeypatch, installer):
    monkeypatch.setenv(probe.INSTALLER_ENV, installer)
    monkeypatch.setattr(probe.shutil, "which", lambda name: "/fake/uv")
    calls: list[list[str]] = []

    def run(argv, *, timeout_s, env, cwd=None):
        calls.append(argv)
        assert env["UV_PYTHON_DOWNLOADS"] == "never"
        python = tmp_path / "env" / "bin" / "python"
        python.parent.mkdir(parents=True, exist_ok=True)
        python.touch()
        return Captured(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(util, "run_captured", run)  # the venv is built by util.install_venv
    for _ in range(2):
        python = probe._ensure_env(
            tmp_path / "env", torch_version="2.13.0", flashinfer_version="0.6.3", data=probe._data()
        )
    assert python == tmp_path / "env" / "bin" / "python"
    assert len(calls) == 2  # create + install, once
    install = calls[1]
    assert install[-2:] == ["torch==2.13.0", "flashinfer-python==0.6.3"]
    assert ("/fake/uv" in install[0]) is (installer == "uv")
    marker = json.loads((tmp_path / "env" / probe._READY).read_text())
    assert marker["installer"] == installer


def test_a_failed_install_leaves_no_half_built_venv(tmp_path, monkeypatch):
    monkeypatch.setenv(probe.INSTALLER_ENV, "pip")

    def run(argv, *, timeout_s, env, cwd=None):
        (tmp_path / "env" / "bin").mkdir(parents=True, exist_ok=True)
        return Captured(
            returncode=0 if "venv" in argv else 1,
            stdout="",
            stderr="ERROR: No matching distribution found for torch==0.0",
        )

    monkeypatch.setattr(util, "run_captured", run)  # the venv is built by util.install_venv
    with pytest.raises(probe._EnvError, match="No matching distribution"):
        probe._ensure_env(tmp_path / "env", torch_version="0.0", flashinfer_version="0.6.3", data=probe._data())
    assert not (tmp_path / "env").exists()


def test_uv_missing_says_how_to_fall_back(tmp_path, monkeypatch):
    monkeypatch.setenv(probe.INSTALLER_ENV, "uv")
    monkeypatch.setattr(probe.shutil, "which", lambda name: None)
    with pytest.raises(probe._EnvError, match="SERVEMATRIX_PROBE_INSTALLER=pip"):
        probe._ensure_env(tmp_path / "env", torch_version="2.13.0", flashinfer_version="0.6.3", data=probe._data())


# ------------------------------------------------------------------------------------- flag check


@pytest.fixture
def fixture_surface(monkeypatch):
    root = FIXTURES / "fields"
    sources = {p.relative_to(root).as_posix(): p.read_text() for p in root.rglob("*.py")}
    surface = flagsurface.surface_from_sources(sources, version="0.5.23")
    monkeypatch.setattr(flagsurface, "flag_surface", lambda version, *, cache_dir, **target: surface)
    return surface


def test_flag_check_catches_unknown_flags_removed_values_and_notes_deprecations(tmp_path, fixture_surface):
    argv = [
        "--model",
        "m",
        "--tp",
        "8",
        "--enable-piecewise-cuda-graph",
        "--cuda-graph-backend-prefill",
        "tc_piecewise",
        "--disable-cuda-graph",
    ]
    check = flag_check(sglang_version="0.5.23", argv=argv, cache_dir=tmp_path)
    assert not check.ok
    assert check.unknown == ("--enable-piecewise-cuda-graph",)
    assert check.invalid == (("--cuda-graph-backend-prefill", "tc_piecewise"),)
    assert check.deprecated == ("--disable-cuda-graph",)
    assert "--enable-piecewise-cuda-graph" in check.evidence and "tc_piecewise" in check.evidence


def test_flag_check_passes_a_good_argv(tmp_path, fixture_surface):
    argv = ["--model-path", "m", "--tensor-parallel-size", "4", "--cuda-graph-backend-prefill", "disabled"]
    check = flag_check(sglang_version="0.5.23", argv=argv, cache_dir=tmp_path)
    assert check.ok and check.evidence == ""
