""".github/workflows/matrix.yml and its scripts (ci/github/): valid against check-jsonschema's vendored
GitHub schemas (actionlint cannot be installed here), wired to the fields `plan --format github` emits,
and, run for real with a stand-in for nox, covering every planned cell exactly once per job group.

tests/unit/planning/test_cells.py covers github_matrix itself; these test the workflow's use of it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from servematrix.cli import build_parser
from servematrix.config.spec import load_spec
from servematrix.planning.plan import GITHUB_MAX_JOBS, github_matrix, make_plan
from servematrix.store.store import Store
from tests.conftest import MATRIX, REPO, installed_tool

pytest.importorskip("check_jsonschema", reason="check-jsonschema is not installed (the test extra has it)")
from ruamel.yaml import YAML

WORKFLOW = REPO / ".github" / "workflows" / "matrix.yml"
SETUP_ACTION = REPO / "ci" / "github" / "setup" / "action.yml"
SCRIPTS = REPO / "ci" / "github"
MATRICES = [MATRIX / "glm5-nvfp4.toml", MATRIX / "cpu-smoke.toml"]
EXPRESSION = re.compile(r"\$\{\{(.*?)\}\}", re.S)


@pytest.fixture(scope="module")
def workflow() -> dict:
    return YAML(typ="safe").load(WORKFLOW.read_text())


def check_jsonschema(schema: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", schema, str(path)],
        capture_output=True,
        text=True,
        check=False,
    )


def tool_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """PATH with this interpreter's scripts (servematrix, python3) first.

    `python3` is a wrapper that execs this interpreter, not a symlink: a symlink outside the venv's bin/
    would start the base interpreter without the venv's packages."""
    python3 = tmp_path / "bin" / "python3"
    python3.parent.mkdir(exist_ok=True)
    python3.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python3.chmod(0o755)
    path = os.pathsep.join([str(python3.parent), str(Path(sys.executable).parent), os.environ["PATH"]])
    return {**os.environ, "PATH": path, **extra}


def run_plan_job(tmp_path: Path, matrix: Path, select: str = "") -> dict[str, str]:
    """ci/github/plan.sh as the plan job runs it: its step outputs."""
    output = tmp_path / "github_output"
    output.write_text("")
    env = tool_env(tmp_path, MATRIX=str(matrix), SELECT=select, GITHUB_OUTPUT=str(output))
    env.pop("GITHUB_STEP_SUMMARY", None)
    subprocess.run(["bash", str(SCRIPTS / "plan.sh")], env=env, check=True, capture_output=True, text=True)
    return dict(line.split("=", 1) for line in output.read_text().splitlines())


def run_job_argv(tmp_path: Path, entry: dict, **env: str) -> list[str]:
    """ci/github/run-group.sh for one matrix entry, with a stand-in nox that prints its argv: the
    `servematrix run` arguments after `nox -s matrix --`."""
    fake = tmp_path / "fakebin"
    fake.mkdir(exist_ok=True)
    (fake / "nox").write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    (fake / "nox").chmod(0o755)
    variables = {"GROUP_SELECT": entry["select"], "SHARD": entry["shard"], "STORE": "results-x.sqlite", **env}
    done = subprocess.run(
        ["bash", str(SCRIPTS / "run-group.sh")],
        env={**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", **variables},
        capture_output=True,
        text=True,
        check=True,
    )
    argv = done.stdout.splitlines()
    assert argv[:3] == ["-s", "matrix", "--"]
    return argv[3:]


# --- validity


@pytest.mark.parametrize(
    ("schema", "path"),
    [
        ("vendor.github-workflows", WORKFLOW),
        ("vendor.github-actions", SETUP_ACTION),
        ("vendor.github-workflows", WORKFLOW.with_name("preflight.yml")),
    ],
    ids=["workflow", "setup-action", "preflight-workflow"],
)
def test_valid_against_the_vendored_github_schema(schema, path):
    done = check_jsonschema(schema, path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_schema_check_is_not_vacuous(tmp_path):
    broken = tmp_path / "matrix.yml"
    broken.write_text(WORKFLOW.read_text().replace("    runs-on: ubuntu-latest\n", "    runs_on: ubuntu-latest\n", 1))
    assert check_jsonschema("vendor.github-workflows", broken).returncode != 0


def test_the_scripts_pass_shellcheck():
    done = subprocess.run(
        [installed_tool("shellcheck"), *map(str, sorted(SCRIPTS.glob("*.sh")))], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout


# --- the workflow's shape, as issue 8 asks


def test_triggers_are_a_manual_dispatch_and_a_nightly(workflow):
    on = workflow["on"]
    assert set(on["workflow_dispatch"]["inputs"]) == {"matrix", "select", "stages"}
    assert on["schedule"][0]["cron"]
    # The nightly has no inputs: every input has a default in the workflow's env.
    env = workflow["env"]
    assert "inputs.matrix ||" in env["MATRIX"] and "inputs.stages ||" in env["STAGES"]


def test_the_run_jobs_come_from_the_plan_job(workflow):
    plan, run = workflow["jobs"]["plan"], workflow["jobs"]["run"]
    assert plan["runs-on"] == "ubuntu-latest"
    assert any("ci/github/plan.sh" in step.get("run", "") for step in plan["steps"])
    assert "--format github" in (SCRIPTS / "plan.sh").read_text()
    assert set(plan["outputs"]) >= {"matrix", "jobs", "python"}
    strategy = run["strategy"]
    assert strategy["matrix"] == "${{ fromJson(needs.plan.outputs.matrix) }}"
    assert strategy["fail-fast"] is False and isinstance(strategy["max-parallel"], int)
    assert run["runs-on"] == "${{ matrix.runs-on }}"
    assert run["timeout-minutes"] == "${{ matrix.timeout-minutes }}"
    assert run["if"] == "needs.plan.outputs.jobs != '0'"  # an empty matrix is an error on GitHub


def test_every_matrix_field_the_workflow_uses_is_one_plan_emits(workflow):
    text = WORKFLOW.read_text()
    used = {m for e in EXPRESSION.findall(text) for m in re.findall(r"\bmatrix\.([\w-]+)", e)}
    assert {"runs-on", "timeout-minutes", "select", "shard", "name", "gpu"} <= used
    for matrix in MATRICES:
        for entry in github_matrix(make_plan(matrix))["include"]:
            assert used <= set(entry), (matrix.name, used - set(entry))


def test_dispatch_inputs_reach_shell_code_only_through_the_environment(workflow):
    """An input pasted into `run:` would be shell code anyone who can dispatch could inject."""
    for job in workflow["jobs"].values():
        for step in job.get("steps", []):
            assert "${{" not in step.get("run", ""), step


def test_every_job_uploads_its_store_and_logs_under_unique_names(workflow):
    run = workflow["jobs"]["run"]
    uploads = [s for s in run["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert len(uploads) == 2
    for step in uploads:
        assert step["if"] == "always()"
        for unique in ("matrix.gpu", "strategy.job-index", "github.run_attempt"):
            assert unique in step["with"]["name"]
    paths = " ".join(s["with"]["path"] for s in uploads)
    assert "env.STORE" in paths and ".servematrix/logs" in paths
    # .servematrix is hidden: upload-artifact@v4 leaves it out unless told.
    assert any(s["with"].get("include-hidden-files") is True for s in uploads)
    for unique in ("matrix.gpu", "strategy.job-index", "github.run_attempt"):
        assert unique in run["env"]["STORE"]
    assert run["env"]["STORE"].startswith("results-") and run["env"]["STORE"].endswith(".sqlite")


def test_the_aggregate_job_merges_what_arrived_and_main_deploys_pages(workflow):
    jobs = workflow["jobs"]
    aggregate = jobs["aggregate"]
    assert set(aggregate["needs"]) == {"plan", "run"} and aggregate["if"].startswith("always()")
    download = next(s for s in aggregate["steps"] if str(s.get("uses", "")).startswith("actions/download-artifact@"))
    assert download["with"]["pattern"] == "store-*" and download["with"]["merge-multiple"] is True
    assert any("ci/github/aggregate.sh" in s.get("run", "") for s in aggregate["steps"])
    pages = next(s for s in aggregate["steps"] if str(s.get("uses", "")).startswith("actions/upload-pages-artifact@"))
    assert pages["if"] == "github.ref == 'refs/heads/main'"
    build = next(s for s in aggregate["steps"] if "mkdocs build" in s.get("run", ""))
    assert build["if"] == pages["if"] and f"--site-dir {pages['with']['path']}" in build["run"]
    deploy = jobs["deploy"]
    assert deploy["needs"] == "aggregate" and deploy["if"] == "github.ref == 'refs/heads/main'"
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert deploy["environment"]["name"] == "github-pages"
    assert any(str(s.get("uses", "")).startswith("actions/deploy-pages@") for s in deploy["steps"])
    assert workflow["permissions"] == {"contents": "read"}  # only the deploy job may write


# --- the scripts, run for real


@pytest.mark.parametrize("matrix", MATRICES, ids=lambda p: p.stem)
def test_the_plan_job_output_is_the_grouped_matrix(tmp_path, matrix):
    outputs = run_plan_job(tmp_path, matrix)
    include = json.loads(outputs["matrix"])["include"]
    assert 1 <= len(include) <= GITHUB_MAX_JOBS and int(outputs["jobs"]) == len(include)
    assert outputs["python"] == load_spec(matrix).file.python
    spec = load_spec(matrix)
    for entry in include:
        kind = spec.file.gpu[entry["gpu"]]
        assert entry["runs-on"] == (list(kind.runner_labels) or ["self-hosted"])
        assert entry["timeout-minutes"] == kind.timeout_minutes


@pytest.mark.parametrize("select", ["sglang=9.9.9", "sglang>=9.9"], ids=["typo", "selects-nothing"])
def test_a_dispatch_that_selects_nothing_fails_the_plan_job(tmp_path, select):
    """A typo'd or empty selection must not go green having run nothing (issue 13): the plan job fails."""
    with pytest.raises(subprocess.CalledProcessError) as info:
        run_plan_job(tmp_path, MATRICES[0], select=select)
    assert info.value.returncode == 2
    assert "servematrix: error: --select" in info.value.stderr
    assert (tmp_path / "github_output").read_text() == ""


def test_a_large_matrix_stays_within_256_jobs(tmp_path):
    """Over 256 environments on three GPU kinds: still at most 256 jobs, every kind on its own runners."""
    text = (MATRIX / "glm5-nvfp4.toml").read_text()
    text = re.sub(r'(?m)^cuda = \["12.8", "13.0"\]', 'cuda = ["12.8", "12.9", "13.0", "13.1"]', text)
    text = re.sub(r'(?m)^gpu = \["b200", "rtx-pro-6000"\]', 'gpu = ["b200", "rtx-pro-6000", "b300"]', text)
    text = re.sub(
        r'(?m)^flashinfer = \["pinned", "0.6.12"\]', 'flashinfer = ["pinned", "0.6.10", "0.6.11", "0.6.12"]', text
    )
    text = re.sub(r"(?ms)^\[\[exclude\]\].*?(?=^\[server\])", "", text)
    text += '\n[gpu.b300]\narch = "sm_103"\ncount = 8\nrunner_labels = ["self-hosted", "gpu-b300x8"]\n'
    big = tmp_path / "big.toml"
    big.write_text(text)
    plan = make_plan(big)
    assert len(plan.environments) > GITHUB_MAX_JOBS
    include = json.loads(run_plan_job(tmp_path, big)["matrix"])["include"]
    assert GITHUB_MAX_JOBS - 3 <= len(include) <= GITHUB_MAX_JOBS
    assert {e["gpu"] for e in include} == {"b200", "rtx-pro-6000", "b300"}
    assert {tuple(e["runs-on"]) for e in include if e["gpu"] == "b300"} == {("self-hosted", "gpu-b300x8")}
    assert sum(e["cells"] for e in include) == len(plan.cells)


@pytest.mark.parametrize("select", ["", "sglang>=0.5.10,mode=piecewise"], ids=["everything", "dispatch-select"])
def test_the_run_jobs_cover_every_cell_once_with_both_modes_of_an_environment_together(tmp_path, select):
    """What each run job really passes to `servematrix run` (plan.sh, then run-group.sh with a stand-in
    nox), parsed by `servematrix run`'s own parser and planned."""
    matrix = MATRICES[0]
    include = json.loads(run_plan_job(tmp_path, matrix, select)["matrix"])["include"]
    full = make_plan(matrix, [select] if select else [])
    seen: list[str] = []
    for entry in include:
        argv = run_job_argv(tmp_path, entry, MATRIX=str(matrix), SELECT=select, STAGES="resolve,build")
        args = build_parser().parse_args(["run", *argv])
        assert args.report is None and args.stages == "resolve,build" and str(args.store) == "results-x.sqlite"
        cells = make_plan(args.matrix, args.select, args.shard).cells
        assert len(cells) == entry["cells"] and {c.env.axes["gpu"] for c in cells} == {entry["gpu"]}
        modes: dict[str, set[str]] = {}
        for cell in cells:
            modes.setdefault(cell.env_id, set()).add(cell.mode)
        want = {"piecewise"} if select else {"baseline", "piecewise", "breakable", "full"}
        assert all(m == want for m in modes.values())
        seen += [c.id for c in cells]
    assert sorted(seen) == sorted(c.id for c in full.cells)


def test_empty_dispatch_inputs_are_left_out(tmp_path):
    entry = {"select": "gpu=cpu", "shard": "1/2"}
    argv = run_job_argv(tmp_path, entry, MATRIX="matrix/cpu-smoke.toml", SELECT="", STAGES="")
    assert argv == [
        "matrix/cpu-smoke.toml", "--select", "gpu=cpu", "--shard", "1/2", "--store", "results-x.sqlite", "--no-report",
    ]  # fmt: skip


def test_the_aggregate_script_merges_every_store_and_writes_the_table(tmp_path):
    stores = tmp_path / "stores"
    stores.mkdir()
    for n, mode in enumerate(("static", "continuous-batching")):
        with Store(stores / f"results-cpu-{n}-1.sqlite") as store:
            store.record(
                run_id=f"r{n}", cell_id=f"c{n}", env_id="e1", engine="transformers", mode=mode,
                matrix="matrix/cpu-smoke.toml", axes={"transformers": "5.24.0", "torch": "2.9.1", "gpu": "cpu"},
                inputs_hash="h", verdict="pass",
            )  # fmt: skip
    docs = tmp_path / "docs"
    summary = tmp_path / "summary.md"
    env = tool_env(tmp_path, GITHUB_STEP_SUMMARY=str(summary))
    script = [
        "bash", str(SCRIPTS / "aggregate.sh"), str(stores), str(tmp_path / "results.sqlite"), str(docs),
    ]  # fmt: skip
    done = subprocess.run(script, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    with Store(tmp_path / "results.sqlite") as merged:
        assert sorted(r["cell_id"] for r in merged.latest()) == ["c0", "c1"]
    table = (docs / "compatibility.md").read_text()
    assert "| 5.24.0 | 2.9.1 | cpu | ✅ `pass`" in table
    assert summary.read_text() == table
    # Run again (a re-run attempt's artifacts arrive twice): the same rows.
    assert subprocess.run(script, env=env, capture_output=True, text=True, check=False).returncode == 0
    with Store(tmp_path / "results.sqlite") as merged:
        assert len(merged.all_rows()) == 2


def test_the_aggregate_script_fails_when_no_store_arrived(tmp_path):
    (tmp_path / "stores").mkdir()
    done = subprocess.run(
        ["bash", str(SCRIPTS / "aggregate.sh"), str(tmp_path / "stores"), str(tmp_path / "o.sqlite"), str(tmp_path)],
        env=tool_env(tmp_path),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1 and "no run job uploaded a store" in done.stdout
