"""Slurm: a matrix run on the cluster's own scheduler, as job arrays plus a dependent merge job.

One array per GPU kind, because each kind asks for its own GPUs (`--gres=gpu:COUNT` from the spec; none
for a CPU kind) and its own time limit (the kind's `timeout_minutes`). One task per group of environments:
the same groups as the GitHub Actions matrix (`plan.github_matrix`), so task i runs
`servematrix run MATRIX --select gpu=KIND --shard (i+1)/N`, both modes of an environment share a task
and a build, and every task writes its own store. The merge job depends on every array with `afterany`:
a task that failed or hit its time limit still leaves the rows it finished, and those belong in the table.

Everything a task needs is in its script (written under OUT, which must be on a filesystem the compute
nodes share), so a script can be read, and resubmitted, by hand.

The command line is not here: servematrix.options declares submit's options (those it passes to every
task are run's own declarations) and cli.cmd_submit calls `submit`.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from servematrix.errors import InputError
from servematrix.options import passed_on, to_argv
from servematrix.planning.plan import GITHUB_MAX_JOBS, github_matrix, make_plan
from servematrix.stages import STAGES
from servematrix.store import redact
from servematrix.util import DEFAULT_WORKDIR

MERGE_TIME_MINUTES = 30
# `servematrix` as this interpreter runs it; a compute node without it takes --launcher instead.
DEFAULT_LAUNCHER = (sys.executable, "-m", "servematrix")

Runner = Callable[..., subprocess.CompletedProcess[str]]


@dataclass(frozen=True)
class Shell:
    """A word given to the shell as written (a variable expansion), not quoted."""

    text: str


class SlurmError(RuntimeError):
    """sbatch, squeue or scontrol failed: the cluster's fault or its configuration, not the input's."""


@dataclass(frozen=True, kw_only=True)
class SubmitOptions:
    matrix: Path
    select: tuple[str, ...] = ()
    partition: str | None = None
    out_dir: Path
    workdir: Path
    chdir: Path
    stages: tuple[str, ...] = STAGES
    backend: str = "auto"
    image: str | None = None  # --backend image: every task serves from this image
    rerun: bool = False
    launcher: tuple[str, ...] = DEFAULT_LAUNCHER
    max_tasks: int = GITHUB_MAX_JOBS
    max_parallel: int | None = None
    sbatch_args: tuple[str, ...] = ()
    report_out: Path | None = None  # default: OUT

    @property
    def store(self) -> Path:
        return self.out_dir / "results.sqlite"

    @property
    def report_dir(self) -> Path:
        return self.report_out or self.out_dir


@dataclass(frozen=True, kw_only=True)
class ArrayJob:
    gpu: str
    tasks: int
    cells: int
    gpus_per_task: int
    time_minutes: int
    script: Path
    stores: tuple[Path, ...]
    job_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class Submission:
    options: SubmitOptions
    arrays: tuple[ArrayJob, ...]
    merge_script: Path
    merge_job_id: str | None = None
    commands: tuple[tuple[str, ...], ...] = field(default=())

    @property
    def job_ids(self) -> tuple[str, ...]:
        ids = [a.job_id for a in self.arrays if a.job_id]
        return (*ids, self.merge_job_id) if self.merge_job_id else tuple(ids)


def task_argv(options: SubmitOptions, gpu: str, shard: str | Shell, store: str | Shell) -> list[str | Shell]:
    """The `servematrix run` arguments of one task (without the launcher): every option submit passes on to
    run, written from its declaration (`options.to_argv`), the task's GPU kind added to its --select."""
    shared = passed_on("submit")
    values = {option.attribute: getattr(options, option.attribute) for option in shared}
    values["select"] = (*options.select, f"gpu={gpu}")
    # Tasks share the project directory: none of them may write its table; the merge job writes it.
    return ["run", *to_argv(shared, values), "--shard", shard, "--store", store, "--no-report"]


def prepare(options: SubmitOptions) -> Submission:
    """Plan the groups and write the scripts; submit nothing."""
    plan = make_plan(options.matrix, options.select)
    try:
        groups = github_matrix(plan, options.max_tasks)["include"]
    except ValueError as exc:
        raise InputError(str(exc).replace("--max-jobs", "--max-tasks")) from None
    if not groups:
        raise InputError(f"{options.matrix}: the selection has no cells to run")
    logs = options.out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    arrays: list[ArrayJob] = []
    for gpu in dict.fromkeys(g["gpu"] for g in groups):
        mine = [g for g in groups if g["gpu"] == gpu]
        kind = plan.spec.file.gpu[gpu]
        name = _file_safe(gpu)
        tasks = len(mine)
        script = options.out_dir / f"array-{name}.sbatch"
        _write_private(script, _array_script(options, gpu, name, tasks, kind.count, kind.timeout_minutes))
        arrays.append(
            ArrayJob(
                gpu=gpu,
                tasks=tasks,
                cells=sum(g["cells"] for g in mine),
                gpus_per_task=kind.count,
                time_minutes=kind.timeout_minutes,
                script=script,
                stores=tuple(options.out_dir / f"shard-{name}-{i}.sqlite" for i in range(tasks)),
            )
        )
    merge_script = options.out_dir / "merge.sbatch"
    _write_private(merge_script, _merge_script(options, [s for a in arrays for s in a.stores]))
    return Submission(options=options, arrays=tuple(arrays), merge_script=merge_script)


def submit(
    options: SubmitOptions, *, dry_run: bool = False, sbatch: str = "sbatch", runner: Runner = subprocess.run
) -> Submission:
    """Write the scripts and submit every array, then the merge job that waits for all of them."""
    prepared = prepare(options)
    extra = list(options.sbatch_args)
    commands: list[tuple[str, ...]] = []
    arrays: list[ArrayJob] = []
    for array in prepared.arrays:
        command = (sbatch, "--parsable", *extra, str(array.script))
        commands.append(_shown(command, options))
        job_id = None if dry_run else _sbatch(command, runner)
        arrays.append(replace(array, job_id=job_id))
    dependency = ":".join(a.job_id or f"<{a.gpu} array id>" for a in arrays)
    merge = (sbatch, "--parsable", f"--dependency=afterany:{dependency}", *extra, str(prepared.merge_script))
    commands.append(_shown(merge, options))
    merge_id = None if dry_run else _sbatch(merge, runner)
    return Submission(
        options=options,
        arrays=tuple(arrays),
        merge_script=prepared.merge_script,
        merge_job_id=merge_id,
        commands=tuple(commands),
    )


def wait(
    job_ids: Sequence[str], *, timeout_s: float | None = None, poll_s: float = 2.0, runner: Runner = subprocess.run
) -> None:
    """Until none of the jobs (array tasks included) is pending or running. squeue, not `sbatch --wait`:
    that one polls every 10 s or so."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        done = runner(
            ["squeue", "-h", "-o", "%i", "-j", ",".join(job_ids)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0 and "Invalid job id" not in done.stderr:
            raise SlurmError(f"squeue failed: {done.stderr.strip()}")
        if done.returncode != 0 or not done.stdout.strip():
            return
        if deadline is not None and time.monotonic() > deadline:
            raise SlurmError(f"jobs {', '.join(job_ids)} still queued or running after {timeout_s:.0f} s")
        time.sleep(poll_s)


def job_state(job_id: str, runner: Runner = subprocess.run) -> str | None:
    """COMPLETED, FAILED, TIMEOUT, ... while the controller remembers the job (MinJobAge), else None."""
    done = runner(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=False)
    match = re.search(r"\bJobState=(\S+)", done.stdout) if done.returncode == 0 else None
    return match.group(1) if match else None


def _write_private(path: Path, text: str) -> None:
    """A script only its owner reads: the launcher (`env HF_TOKEN=...`) may carry a credential, which sbatch
    needs in the script."""
    path.unlink(missing_ok=True)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as handle:
        handle.write(text)


# `NAME=VALUE` words (env's, --export's) in the launcher and the sbatch arguments: their values are masked
# by value wherever a command is shown.
def _shown(command: Sequence[str], options: SubmitOptions) -> tuple[str, ...]:
    """`command` as printed (the dry run): secrets of the launcher and of the sbatch arguments masked."""
    values = [
        value
        for word in (*options.launcher, *options.sbatch_args)
        for value in re.findall(r"[A-Za-z_][A-Za-z0-9_]*=([^,\s]+)", word)
    ]
    return tuple(redact.redact(word, env={}, values=values) for word in command)


def _sbatch(command: Sequence[str], runner: Runner) -> str:
    try:
        done = runner(list(command), capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise SlurmError(f"{command[0]} not found: is this a Slurm login node?") from None
    if done.returncode != 0:
        raise SlurmError(f"{shlex.join(command)} failed: {done.stderr.strip() or done.stdout.strip()}")
    # --parsable prints `JOBID` or `JOBID;CLUSTER`.
    job_id = done.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"{shlex.join(command)}: unexpected output {done.stdout.strip()!r}")
    return job_id


def _file_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def _header(options: SubmitOptions, job_name: str, output: str, time_minutes: int) -> list[str]:
    lines = [
        "#!/bin/bash",
        f"# Written by `servematrix submit --slurm` at {datetime.now(UTC).isoformat(timespec='seconds')}.",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --chdir={_directive_path(options.chdir)}",
        # Slurm fills %-patterns in --output: a % of the path itself is written %%.
        f"#SBATCH --output={_directive_path(str(options.out_dir / 'logs').replace('%', '%%') + '/' + output)}",
        f"#SBATCH --time={time_minutes}",
    ]
    if options.partition:
        lines.append(f"#SBATCH --partition={options.partition}")
    return lines


def _directive_path(path: Path | str) -> str:
    """A path in an `#SBATCH` line, double-quoted (sbatch splits the line at spaces, and reads quotes); a path
    holding a double quote or a line break cannot be written there."""
    text = str(path)
    if '"' in text or "\n" in text or "\r" in text:
        raise InputError(f"{text[:200]!r}: a path with a double quote or a line break cannot go into an #SBATCH line")
    return f'"{text}"'


def _array_script(options: SubmitOptions, gpu: str, name: str, tasks: int, gpus: int, minutes: int) -> str:
    lines = _header(options, f"servematrix-{name}", f"{name}-%a.out", minutes)
    throttle = f"%{options.max_parallel}" if options.max_parallel else ""
    lines.append(f"#SBATCH --array=0-{tasks - 1}{throttle}")
    if gpus > 0:
        lines.append(f"#SBATCH --gres=gpu:{gpus}")
    argv = task_argv(options, gpu, Shell('"$shard"'), Shell('"$store"'))
    store = f'{shlex.quote(str(options.out_dir / f"shard-{name}-"))}"$i".sqlite'
    lines += [
        "set -euo pipefail",
        "i=${SLURM_ARRAY_TASK_ID:?run this script with sbatch, as an array task}",
        f'shard="$((i + 1))/{tasks}"',
        f"store={store}",
        f'echo "servematrix: {name} task $i: shard $shard -> $store" >&2',
        "exec " + _shell([*options.launcher, *argv]),
        "",
    ]
    return "\n".join(lines)


def _shell(words: Sequence[str | Shell]) -> str:
    return " ".join(w.text if isinstance(w, Shell) else shlex.quote(w) for w in words)


def _merge_script(options: SubmitOptions, stores: Sequence[Path]) -> str:
    launcher = shlex.join(options.launcher)
    lines = _header(options, "servematrix-merge", "merge-%j.out", MERGE_TIME_MINUTES)
    lines += [
        "set -euo pipefail",
        "shards=()",
        # A task that died before its first row wrote no store; the others still count.
        f"for store in {' '.join(shlex.quote(str(s)) for s in stores)}; do",
        '  if [ -s "$store" ]; then shards+=("$store"); else echo "servematrix: no store at $store" >&2; fi',
        "done",
        'if [ "${#shards[@]}" -eq 0 ]; then echo "servematrix: no task wrote a store" >&2; exit 1; fi',
        f'{launcher} merge {shlex.quote(str(options.store))} "${{shards[@]}}"',
        f"{launcher} report --store {shlex.quote(str(options.store))} --out {shlex.quote(str(options.report_dir))}",
        "",
    ]
    return "\n".join(lines)


def options_from_args(args: argparse.Namespace) -> SubmitOptions:
    """`servematrix submit`'s parsed and checked options (servematrix.options declares and checks them)."""
    cwd = Path.cwd()
    out = args.out or DEFAULT_WORKDIR / "slurm" / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    # Absolute, because the jobs resolve paths on other nodes; the matrix stays as given (resolved from
    # --chdir, the submitting directory) so stored rows and reproduce commands read as in a local run.
    return SubmitOptions(
        matrix=args.matrix,
        select=tuple(args.select),
        partition=args.partition,
        out_dir=(cwd / out).resolve(),
        workdir=(cwd / args.workdir).resolve(),
        chdir=cwd,
        stages=args.stages,
        backend=args.backend,
        image=args.image,
        rerun=args.rerun,
        launcher=args.launcher or DEFAULT_LAUNCHER,
        max_tasks=args.max_tasks,
        max_parallel=args.max_parallel,
        sbatch_args=tuple(args.sbatch_args),
        report_out=(cwd / args.report_out).resolve() if args.report_out else None,
    )
