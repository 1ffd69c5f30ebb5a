"""The load pre-flight on real wheels (issue 33's done-when): sglang 0.5.12 and 0.5.23, each lock installed on
this CPU as the import check installs it (importcheck.LockVenv, linked from uv's cache: each lock is fetched
once), GLM-5-NVFP4's config files, the RTX PRO 6000 (sm_120).

`--quantization modelopt_fp4 --moe-runner-backend cutlass` fails at the module build with sglang's own error
(0.5.12: moe_runner/runner.py "Unsupported runner backend"; 0.5.23: modelopt_quant.py "Use
--moe-runner-backend flashinfer_cutlass instead"), and the release's working recipe, flashinfer_cutlass,
loads to the module build.

Cost, measured on a 2-core host: about 70 s to fetch each lock into an empty uv cache (9-13 GB each), then
70-170 s for the probe to import sglang once; each cell's answer takes under a second."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from servematrix.config.spec import model_config_dir
from servematrix.engines.hooks import PreflightInput
from servematrix.engines.sglang import PREFLIGHTS, loadprobe
from servematrix.formats.lockfile import parse_pins
from servematrix.planning.plan import make_plan
from servematrix.stages.importcheck import LockVenv

pytestmark = [pytest.mark.slow, pytest.mark.integration]
REPO = Path(__file__).resolve().parents[2]
# The committed locks that import on a CPU: 0.5.12 with kernels 0.14.1 (its lock as resolved today dies at
# `import sglang` in kernels 0.17.2, which the import check reports first), and 0.5.23's RTX PRO 6000 lock.
LOCKS = {"0.5.12": "ea51dcc11cfb", "0.5.23": "ab2d99e82a89"}
SGLANG_ERRORS = {
    "0.5.12": ("sglang/srt/layers/moe/moe_runner/runner.py", "Unsupported runner backend"),
    "0.5.23": (
        "sglang/srt/layers/quantization/modelopt_quant.py",
        "Use --moe-runner-backend flashinfer_cutlass instead",
    ),
}


@pytest.fixture(scope="module", params=sorted(LOCKS))
def release(request, tmp_path_factory):
    version = request.param
    lockfile = REPO / "matrix" / "locks" / f"{LOCKS[version]}.lock.txt"
    venv = LockVenv(lockfile, python_version="3.12", cache_dir=tmp_path_factory.mktemp(f"env-{version}"))
    python = venv.python()
    assert python is not None, venv.error
    yield version, lockfile, python
    loadprobe.close_all()
    venv.close()


def _cell_input(version, lockfile, python, cache_dir, moe_runner):
    plan = make_plan(REPO / "matrix" / "glm5-nvfp4.toml", select=[f"sglang={version}", "gpu=rtx-pro-6000"])
    cell = next(c for c in plan.cells if c.applicable and c.mode == "baseline")
    argv = list(cell.command)
    argv[argv.index("--moe-runner-backend") + 1] = moe_runner
    return PreflightInput(
        cell=dataclasses.replace(cell, command=tuple(argv)),
        engine=plan.spec.engine,
        pins=parse_pins(lockfile.read_text()),
        cache_dir=cache_dir,
        python=lambda: python,
        model_config=model_config_dir(plan.spec),
    )


def test_cutlass_with_modelopt_fp4_fails_at_the_module_build_with_sglangs_own_error(release, tmp_path):
    version, lockfile, python = release
    result = PREFLIGHTS["load"](_cell_input(version, lockfile, python, tmp_path, "cutlass"))
    assert str(result) == "predicted-fail:moe-runner-unsupported", result
    where, message = SGLANG_ERRORS[version]
    assert where in result.excerpt and message in result.excerpt
    assert "failed at the module build for sm_120" in result.evidence[0]


def test_the_releases_working_recipe_loads_to_the_module_build(release, tmp_path):
    version, lockfile, python = release
    result = PREFLIGHTS["load"](_cell_input(version, lockfile, python, tmp_path, "flashinfer_cutlass"))
    assert result is not None and result.kind == "pass", result
    assert result.evidence[0].startswith("load: loaded to the module build for sm_120, 4 of 78 layers")


# matrix/h200-glm5.toml serves 0.5.12 and 0.5.15; of those, this module installs 0.5.12.
@pytest.mark.parametrize("release", ["0.5.12"], indirect=True, scope="module")
def test_sglangs_own_glm5_class_builds_the_random_glm5_for_hopper(release, tmp_path):
    """Issue 36's CPU check: the GLM-5-shaped model the H200 lane serves (matrix/h200-glm5.toml, its config from
    the builder) is built by the release's own GlmMoeDsaForCausalLM for sm_90, with the lane's FlashMLA backends."""
    _, lockfile, python = release
    plan = make_plan(REPO / "matrix" / "h200-glm5.toml", select=["sglang=0.5.12", "gpu=h200"])
    cells = [c for c in plan.cells if c.applicable]  # full is 0.5.15's
    assert sorted(c.mode for c in cells) == ["baseline", "breakable", "piecewise"]
    for cell in cells:
        result = PREFLIGHTS["load"](
            PreflightInput(
                cell=cell,
                engine=plan.spec.engine,
                pins=parse_pins(lockfile.read_text()),
                cache_dir=tmp_path,
                python=lambda: python,
                model_config=model_config_dir(plan.spec),
            )
        )
        assert result is not None and result.kind == "pass", (cell.mode, result)
        assert result.evidence[0].startswith("load: loaded to the module build for sm_90, 2 of 3 layers"), result
