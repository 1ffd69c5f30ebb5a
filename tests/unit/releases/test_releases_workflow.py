""".github/workflows/releases.yml and its job, ci/github/releases.sh: valid against check-jsonschema's vendored
GitHub schemas, wired to the script's outputs, and the script run for real on the CPU against the stand-in index
(standin.py), not the network: the new release written into a copy of a matrix, the pre-flight of the new
environment alone (uv resolves it from the stand-in index), and the pull request's body."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from servematrix.planning.plan import make_plan
from tests.conftest import MATRIX, REPO, installed_tool
from tests.unit.releases.standin import Upload, standin_index

pytest.importorskip("check_jsonschema", reason="check-jsonschema is not installed (the test extra has it)")
from ruamel.yaml import YAML

WORKFLOW = REPO / ".github" / "workflows" / "releases.yml"
SCRIPT = REPO / "ci" / "github" / "releases.sh"


@pytest.fixture(scope="module")
def workflow() -> dict:
    return YAML(typ="safe").load(WORKFLOW.read_text())


def test_the_workflow_is_valid():
    done = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_script_passes_shellcheck():
    done = subprocess.run([installed_tool("shellcheck"), str(SCRIPT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


def test_the_workflow_is_scheduled_and_opens_the_pull_request_from_the_scripts_outputs(workflow):
    assert workflow["on"]["schedule"]
    steps = workflow["jobs"]["watch"]["steps"]
    watch = next(s for s in steps if s.get("id") == "watch")
    assert watch["run"] == "bash ci/github/releases.sh"
    pull = next(s for s in steps if "create-pull-request" in s.get("uses", ""))
    assert re.fullmatch(r"peter-evans/create-pull-request@v\d+", pull["uses"])  # pinned by version
    assert pull["if"] == "steps.watch.outputs.added == 'true'"
    used = set(re.findall(r"steps\.watch\.outputs\.(\w+)", json.dumps(pull)))
    assert used == {"added", "title", "body"}
    for name in used:  # every output the step reads, the script writes
        assert f'"{name}=' in SCRIPT.read_text() or f"{name}=" in SCRIPT.read_text()
    assert "matrix/locks/*.lock.txt" in pull["with"]["add-paths"]
    # Only the pre-flight's stages: no GPU, no build.
    assert workflow["env"]["STAGES"] == "resolve,probe"


def run_script(workdir: Path, index: str, **env: str) -> dict[str, str]:
    output = workdir / "github_output"
    output.write_text("")
    variables = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        "UV_DEFAULT_INDEX": index,  # what uv and `servematrix releases` read when no --index-url is given
        "UV_PYTHON_DOWNLOADS": "never",
        "XDG_CACHE_HOME": str(workdir / "cache"),
        "GITHUB_OUTPUT": str(output),
        "MATRIX": "matrix/smoke.toml",
        "OUT": str(workdir / "out"),
        **env,
    }
    variables.pop("GITHUB_STEP_SUMMARY", None)
    done = subprocess.run(
        ["bash", str(SCRIPT)], cwd=workdir, env=variables, capture_output=True, text=True, check=False, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(line.split("=", 1) for line in output.read_text().splitlines())


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A stand-in for the workflow's checkout: a matrix (the CPU smoke matrix) in matrix/."""
    (tmp_path / "repo" / "matrix").mkdir(parents=True)
    shutil.copy(MATRIX / "cpu-smoke.toml", tmp_path / "repo" / "matrix" / "smoke.toml")
    return tmp_path / "repo"


def test_a_new_release_is_added_preflighted_alone_and_described(tmp_path, checkout):
    matrix = checkout / "matrix" / "smoke.toml"
    before = {c.id for c in make_plan(matrix).cells}
    projects = {
        "transformers": [Upload("5.5.4"), Upload("5.24.0"), Upload("5.25.0", "2026-11-02T10:00:00Z")],
        "torch": [Upload("2.9.1")],
        "requests": [Upload("2.32.5")],
    }
    with standin_index(tmp_path / "index", projects) as url:
        outputs = run_script(checkout, url)
    assert outputs["added"] == "true"
    assert outputs["title"] == "matrix: add transformers 5.25.0 (release watcher)"
    after = make_plan(matrix).cells
    assert before <= {c.id for c in after}
    new = [c for c in after if c.id not in before]
    assert {c.env.axes["transformers"] for c in new} == {"5.25.0"} and int(outputs["cells"]) == len(new) == 2
    # The pre-flight ran the new environment alone, and uv resolved it from the stand-in index.
    lock = checkout / "matrix" / "locks" / f"{new[0].env_id}.lock.txt"
    assert lock.is_file() and "transformers==5.25.0" in lock.read_text()
    assert sorted(p.name for p in (checkout / "matrix" / "locks").iterdir()) == [lock.name]
    body = Path(outputs["body"]).read_text()
    assert re.search(r"^  5\.25\.0 +2026-11-02 +yes", body, re.M) and "transformers 5.25.0" in body
    assert "CPU pre-flight (resolve,probe) of the 2 new cell(s)" in body


def test_nothing_new_opens_no_pull_request(tmp_path, checkout):
    matrix = checkout / "matrix" / "smoke.toml"
    text = matrix.read_text()
    projects = {"transformers": [Upload("5.5.4"), Upload("5.24.0")], "torch": [Upload("2.9.1")]}
    with standin_index(tmp_path / "index", projects) as url:
        outputs = run_script(checkout, url)
    assert outputs == {"added": "false"}
    assert matrix.read_text() == text and not (checkout / "matrix" / "locks").exists()
