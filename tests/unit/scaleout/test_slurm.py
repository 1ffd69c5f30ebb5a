"""`servematrix submit --slurm`: the scripts it writes, run by bash for real, and the sbatch calls it makes
(against a fake sbatch; tests/integration/test_slurm_real.py runs a real one)."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from servematrix.cli import build_parser, main, parse_args
from servematrix.options import OPTIONS
from servematrix.planning.plan import make_plan
from servematrix.scaleout.slurm import SlurmError, options_from_args, prepare, submit, wait
from servematrix.store.store import Store
from tests.conftest import MATRIX, installed_tool

GLM5 = MATRIX / "glm5-nvfp4.toml"
SMOKE = MATRIX / "cpu-smoke.toml"


def parse(argv: list[str]) -> argparse.Namespace:
    """`servematrix submit ...`'s options, parsed and checked."""
    return parse_args(["submit", *argv])


def cli(argv: list[str]) -> int | str | None:
    """`servematrix submit ...`: its exit code, argparse's refusals included."""
    try:
        return main(["submit", *argv])
    except SystemExit as exc:
        return exc.code


def sbatch_line(script: str, option: str) -> str | None:
    return next((line.split("=", 1)[1] for line in script.splitlines() if line.startswith(f"#SBATCH {option}=")), None)


def run_task(script: Path, index: int) -> list[str]:
    """Run an array script as Slurm would run task `index`, with `printf` as the launcher: its argv."""
    done = subprocess.run(
        ["bash", str(script)],
        env={**os.environ, "SLURM_ARRAY_TASK_ID": str(index)},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.splitlines()


def test_one_array_per_gpu_kind_with_gpus_and_time_from_the_spec(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    options = options_from_args(
        parse([str(GLM5), "--slurm", "--partition", "gpu", "--out", "o", "--max-parallel", "3"])
    )
    submission = prepare(options)
    assert [a.gpu for a in submission.arrays] == ["b200", "rtx-pro-6000"]
    for array, minutes in zip(submission.arrays, (150, 180), strict=True):
        text = array.script.read_text()
        assert sbatch_line(text, "--gres") == "gpu:8"
        assert sbatch_line(text, "--time") == str(minutes)
        assert sbatch_line(text, "--partition") == "gpu"
        assert sbatch_line(text, "--array") == f"0-{array.tasks - 1}%3"
        assert sbatch_line(text, "--chdir") == f'"{tmp_path}"'
        assert len(array.stores) == array.tasks
    assert sum(a.cells for a in submission.arrays) == len(make_plan(GLM5).cells)
    merge = submission.merge_script.read_text()
    assert sbatch_line(merge, "--gres") is None and sbatch_line(merge, "--array") is None
    assert all(str(s) in merge for a in submission.arrays for s in a.stores)


def test_a_cpu_kind_asks_for_no_gpu(tmp_path):
    options = options_from_args(parse([str(SMOKE), "--slurm", "--out", str(tmp_path / "o")]))
    (array,) = prepare(options).arrays
    text = array.script.read_text()
    assert array.gpus_per_task == 0 and sbatch_line(text, "--gres") is None
    assert sbatch_line(text, "--partition") is None  # the cluster's default
    assert sbatch_line(text, "--array") == "0-1"


def test_the_tasks_run_every_cell_once_with_both_modes_of_an_environment_together(tmp_path):
    """The argv each task really runs (bash expands the script; printf stands in for servematrix), parsed by
    `servematrix run`'s own parser and planned."""
    out = tmp_path / "o"
    options = options_from_args(
        parse([str(GLM5), "--slurm", "--out", str(out), "--select", "sglang>=0.5.10", "--launcher", "printf '%s\\n'"])
    )
    submission = prepare(options)
    seen: list[str] = []
    stores: set[str] = set()
    for array in submission.arrays:
        for index in range(array.tasks):
            argv = run_task(array.script, index)
            args = build_parser().parse_args(argv)
            assert args.command == "run" and args.report is None and args.backend == "auto"
            assert args.shard == f"{index + 1}/{array.tasks}"
            assert str(args.store) == str(array.stores[index])
            stores.add(str(args.store))
            cells = make_plan(args.matrix, args.select, args.shard).cells
            assert cells and {c.env.axes["gpu"] for c in cells} == {array.gpu}
            modes: dict[str, set[str]] = {}
            for cell in cells:
                modes.setdefault(cell.env_id, set()).add(cell.mode)
            assert all(m == {"baseline", "piecewise", "breakable", "full"} for m in modes.values())
            seen += [c.id for c in cells]
    assert sorted(seen) == sorted(c.id for c in make_plan(GLM5, ["sglang>=0.5.10"]).cells)
    assert len(stores) == sum(a.tasks for a in submission.arrays)


def test_every_option_submit_shares_with_run_reaches_every_task(tmp_path):
    """Each option declared for both submit and run, given a value other than its default, is what the task's
    own `servematrix run` parses (its --select with the task's GPU kind added, its --workdir absolute)."""
    shared = [o for o in OPTIONS if {"run", "submit"} <= set(o.commands) and not o.positional]
    given = {
        "--select": ["--select", "mode=static", "--select", "torch>=2.9"],
        "--stages": ["--stages", "serve,resolve"],
        "--backend": ["--backend", "image"],
        "--image": ["--image", "localhost/mine:1"],
        "--workdir": ["--workdir", "elsewhere"],
        "--rerun": ["--rerun"],
    }
    assert set(given) == {o.name for o in shared}
    argv = [str(SMOKE), "--slurm", "--out", str(tmp_path / "o"), "--launcher", "printf '%s\\n'"]
    submitted = parse([*argv, *(word for flags in given.values() for word in flags)])
    (array,) = prepare(options_from_args(submitted)).arrays
    task = parse_args(run_task(array.script, 0))
    assert task.select == [*submitted.select, "gpu=cpu"]
    assert task.workdir == Path.cwd() / "elsewhere"
    for option in shared:
        if option.name not in ("--select", "--workdir"):
            assert getattr(task, option.attribute) == getattr(submitted, option.attribute), option.name
    assert task.stages == ("resolve", "serve")


def test_the_merge_script_merges_what_arrived_and_writes_the_table(tmp_path):
    out = tmp_path / "o"
    options = options_from_args(
        parse([str(SMOKE), "--slurm", "--out", str(out), "--launcher", f"{sys.executable} -m servematrix"])
    )
    submission = prepare(options)
    (array,) = submission.arrays
    with Store(array.stores[0]) as shard:  # task 1 died before writing anything
        shard.record(
            run_id="r1", cell_id="c1", env_id="e1", engine="transformers", mode="static", matrix="m.toml",
            axes={"transformers": "5.24.0", "torch": "2.9.1", "gpu": "cpu"}, inputs_hash="h", verdict="pass",
        )  # fmt: skip
    done = subprocess.run(["bash", str(submission.merge_script)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert f"no store at {array.stores[1]}" in done.stderr
    with Store(options.store) as merged:
        assert [r["cell_id"] for r in merged.all_rows()] == ["c1"]
    assert "| 5.24.0 | 2.9.1 | cpu | ✅ `pass`" in (out / "compatibility.md").read_text()


def test_the_merge_script_fails_when_no_task_wrote_a_store(tmp_path):
    options = options_from_args(parse([str(SMOKE), "--slurm", "--out", str(tmp_path / "o")]))
    done = subprocess.run(["bash", str(prepare(options).merge_script)], capture_output=True, text=True, check=False)
    assert done.returncode == 1 and "no task wrote a store" in done.stderr


def test_the_scripts_pass_shellcheck(tmp_path):
    options = options_from_args(
        parse([str(GLM5), "--slurm", "--out", str(tmp_path / "o"), "--select", "sglang>=0.5.10,<0.5.14"])
    )
    submission = prepare(options)
    scripts = [str(a.script) for a in submission.arrays] + [str(submission.merge_script)]
    done = subprocess.run([installed_tool("shellcheck"), *scripts], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


class FakeSbatch:
    def __init__(self, outputs: list[str], returncode: int = 0) -> None:
        self.outputs = outputs
        self.returncode = returncode
        self.calls: list[list[str]] = []

    def __call__(self, argv, **kwargs):
        self.calls.append(list(argv))
        return subprocess.CompletedProcess(argv, self.returncode, self.outputs.pop(0), "sbatch: error: no partition")


def test_the_merge_job_waits_for_every_array(tmp_path):
    options = options_from_args(
        parse([str(GLM5), "--slurm", "--out", str(tmp_path / "o"), "--sbatch-arg=--account=gpu"])
    )
    fake = FakeSbatch(["101\n", "102;cluster\n", "103\n"])
    submission = submit(options, runner=fake)
    assert [c[-1] for c in fake.calls] == [*(str(a.script) for a in submission.arrays), str(submission.merge_script)]
    assert all(c[:2] == ["sbatch", "--parsable"] and "--account=gpu" in c for c in fake.calls)
    assert "--dependency=afterany:101:102" in fake.calls[2]
    assert submission.job_ids == ("101", "102", "103")


def test_dry_run_submits_nothing_and_prints_the_commands(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch anywhere
    assert cli([str(SMOKE), "--slurm", "--out", str(tmp_path / "o"), "--dry-run"]) == 0
    commands = [shlex.split(line) for line in capsys.readouterr().out.splitlines()]
    assert commands[0] == ["sbatch", "--parsable", str(tmp_path / "o" / "array-cpu.sbatch")]
    assert commands[1][2] == "--dependency=afterany:<cpu array id>"


def test_sbatch_failures_are_reported(tmp_path):
    options = options_from_args(parse([str(SMOKE), "--slurm", "--out", str(tmp_path / "o")]))
    with pytest.raises(SlurmError, match="no partition"):
        submit(options, runner=FakeSbatch([""], returncode=1))
    with pytest.raises(SlurmError, match="not found"):
        submit(options, sbatch=str(tmp_path / "no-sbatch"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backend", "nonesuch"], "invalid choice: 'nonesuch'"),
        (["--stages", "serve,nap"], "unknown stage"),
        (["--max-tasks", "0"], "--max-tasks"),
        (["--select", "flavour=mint"], "unknown key"),
        (["--image", "localhost/mine:1"], "--image is for --backend image"),
    ],
)
def test_bad_input_exits_2_before_anything_is_submitted(tmp_path, capsys, argv, message):
    assert cli([str(SMOKE), "--slurm", "--out", str(tmp_path / "o"), "--dry-run", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o" / "merge.sbatch").exists()


def test_submit_needs_a_scheduler():
    with pytest.raises(SystemExit) as exc:
        parse([str(SMOKE)])
    assert exc.value.code == 2


def test_wait_polls_until_the_queue_is_empty():
    queue = ["101_0\n101_1\n102\n", "102\n", ""]
    calls = []

    def squeue(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, queue.pop(0), "")

    wait(["101", "102"], poll_s=0, runner=squeue)
    assert len(calls) == 3 and calls[0][-1] == "101,102"

    def purged(argv, **kwargs):
        return subprocess.CompletedProcess(argv, 1, "", "slurm_load_jobs error: Invalid job id specified")

    wait(["101"], poll_s=0, runner=purged)
    with pytest.raises(SlurmError, match="still queued"):
        wait(
            ["101"], poll_s=0, timeout_s=0, runner=lambda argv, **kw: subprocess.CompletedProcess(argv, 0, "101\n", "")
        )
