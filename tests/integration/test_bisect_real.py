"""`servematrix bisect` on real releases from the package index, with the real uv, pipeline and store.

- packaging removed `packaging.version.LegacyVersion` in 22.0 (21.3 has it): an engine whose import check needs
  it, with packaging as a package the matrix does not name (as kernels is for sglang 0.5.12), is bisected at
  the import check on this CPU, killed half-way and resumed.
- flashinfer's custom op `torch.ops.flashinfer.fp4_quantize` first exists in 0.6.12 (0.6.11.post1 to .post3
  lack it): the product's own h200-smoke environment is bisected with the trace probe of that entry alone.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest

from servematrix.backends.venv import VenvBackend
from servematrix.bisection.checks import Checker, CheckOptions, find_target
from servematrix.bisection.releases import between, default_index, fetch_releases
from servematrix.bisection.runner import bisect, record_note
from servematrix.config.spec import Spec, SpecFile
from servematrix.engines import Engine
from tests.conftest import REPO

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not on PATH"),
]
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"

# An engine whose import check is `from packaging.version import LegacyVersion`, installing deprecation (a
# small package that depends on packaging without a bound). It is named after an engine with failure
# signatures, which the import check classifies a failure with. Its one GPU kind exists on no host, so the
# CPU import check decides.
LEGACY_ENGINE = {
    "name": "transformers",
    "description": "deprecation, whose entry point needs packaging.version.LegacyVersion",
    "axes": ["deprecation"],
    "modes": ["import"],
    "preflight": ["import"],
    "default_port": 8000,
    "requirements": {"deprecation": "deprecation=={version}"},
    "readiness": {"path": "/", "interval_s": 1, "timeout_s": 1},
    "launch": [{"versions": ">=0", "argv": ["python", "-c", "pass"]}],
    "mode_flags": [{"versions": ">=0", "mode": "import", "args": []}],
    "import_check": {
        "modules": ["deprecation"],
        "help": ["python", "-c", "from packaging.version import LegacyVersion"],
    },
}
LEGACY_MATRIX = {
    "engine": "transformers",
    "python": PYTHON,
    "model": {"name": "none", "path": "none"},
    "axes": {"deprecation": ["2.1.0"], "gpu": ["elsewhere"], "mode": ["import"]},
    "gpu": {"elsewhere": {"arch": "sm_999", "count": 1}},
    "bench": {"concurrency": [1], "input_len": 1, "output_len": 1, "prompts_per_concurrency": 1},
}


def test_the_index_lists_releases_without_yanked_ones_or_pre_releases():
    releases = fetch_releases("packaging", default_index())
    assert between(releases, "20.5", "21.0") == ["20.5", "20.7", "20.8", "20.9", "21.0"]  # 20.6 is yanked
    assert "20.6" in between(releases, "20.5", "21.0", yanked=True)
    assert between(releases, "25.0", "26.0") == ["25.0", "26.0"]
    assert "26.0rc1" in between(releases, "25.0", "26.0", pre=True)


class KilledAfter(Checker):
    """A checker killed (SIGINT, as KeyboardInterrupt) before its n-th check."""

    def __init__(self, *args, kill_before: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.kill_before = kill_before
        self.done = 0

    def check(self, version, stage):
        if self.kill_before is not None and self.done + 1 >= self.kill_before:
            raise KeyboardInterrupt
        self.done += 1
        return super().check(version, stage)


def test_packaging_22_0_is_found_at_the_import_check_and_a_killed_bisection_resumes(tmp_path):
    spec = Spec(
        path=tmp_path / "legacy.toml",
        engine=Engine.model_validate(LEGACY_ENGINE),
        file=SpecFile.model_validate(LEGACY_MATRIX),
        include=(),
        exclude=(),
    )
    target = find_target(spec, [], "packaging")
    assert target.added
    candidates = between(fetch_releases("packaging", default_index()), "20.7", "23.0", package="packaging")
    assert candidates == ["20.7", "20.8", "20.9", "21.0", "21.1", "21.2", "21.3", "22.0", "23.0"]
    options = CheckOptions(store=tmp_path / "results.sqlite", workdir=tmp_path / "work", lock_dir=tmp_path / "locks")

    def run(kill_before: int | None = None):
        checker = KilledAfter(
            target, options, lambda plan, stages: VenvBackend(tmp_path / "envs"), kill_before=kill_before
        )
        return bisect(target, candidates, good="20.7", bad="23.0", checker=checker)

    with pytest.raises(KeyboardInterrupt):
        run(kill_before=4)  # both ends and one release between them are checked, then it is killed
    found = run()
    assert found.stage == "import"
    assert (found.last_good, found.first_bad) == ("21.3", "22.0")
    first_bad = found.at_stage("22.0")
    assert "cannot import name 'LegacyVersion' from 'packaging.version'" in first_bad.evidence
    assert found.at_stage("21.3").evidence.startswith("skipped:no-gpu: import check: pass")
    checks = found.to_dict()["checks"]
    n = len(candidates)
    assert checks["at_stage"]["run"] + checks["at_stage"]["reused"] <= math.ceil(math.log2(n)) + 1
    assert checks["reused"] == 3  # what the killed run had finished
    record_note(found, options.store, options.run_id)
    # Run again: every check is in the store.
    again = run()
    assert (again.last_good, again.first_bad) == ("21.3", "22.0")
    assert all(c.reused for c in again.checks)


def test_flashinfer_0_6_12_is_the_first_release_whose_custom_op_exists_and_traces(tmp_path):
    done = subprocess.run(
        [
            sys.executable, "-m", "servematrix", "bisect", "matrix/h200-smoke.toml",
            "--select", "kernels=0.14.1", "--select", "mode=piecewise",
            "--axis", "flashinfer", "--good", "0.6.12", "--bad", "0.6.11.post1", "--probe-entry", "custom-op",
            "--store", str(tmp_path / "results.sqlite"), "--workdir", str(tmp_path / "work"), "--format", "json",
        ],
        capture_output=True, text=True, cwd=REPO, check=False,
        env={**os.environ, "SERVEMATRIX_PROBE_INSTALLER": "uv"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["candidates"] == ["0.6.11.post1", "0.6.11.post2", "0.6.11.post3", "0.6.12"]
    assert (result["direction"], result["stage"]) == ("fix", "probe")
    assert result["last_good"]["version"] == "0.6.12"  # with --good newer than --bad: the first good release
    assert "traced under torch.compile(fullgraph=True)" in result["last_good"]["evidence"]
    assert result["first_bad"]["version"] == "0.6.11.post3"  # and the last bad one
    assert "torch.ops.flashinfer.fp4_quantize is not registered" in result["first_bad"]["evidence"]
    assert result["checks"]["at_stage"]["run"] <= result["checks"]["at_most"]
    assert result["noted_rows"] == 1
    assert result["note"].startswith("bisect: flashinfer-python 0.6.12 fixed it in matrix/h200-smoke.toml")
