"""Every option of the `servematrix` commands, declared once, as data (after nox's `_options.py`).

An `Option` names its flags, help, default, type or choices, and the commands that take it. `add_options`
adds a command's options to its parser from these declarations, so `run` and `submit --slurm` get the same
`--backend` (its choices from the backend registry), `--stages`, `--workdir` and `--select`; `run` and
`nix-export` the same `--lock-dir`; `run` and `report` the same `--store` and regression gate. Nothing else
declares an option: `cli.build_parser` and `python -m servematrix.scaleout.nixexport` both build from here.

A value that needs more than argparse's own `type` (stage names, a launcher's words, NAME=URL pairs, a
positive count) has a `check`, which `validate` runs once after parsing: its InputError is the user's one-line
error and exit 2 (cli.main), where an error raised from an argparse `type` would print the usage as well.
Values that need the matrix (`--select`, `--shard`) are checked where the plan is made (`plan.make_plan`).
The rules between options are declared too (`only_with`, `not_with`) and enforced there, in one place, for
every command; and `to_argv` writes a command's arguments back from the same declarations (after nox's
`to_argv`): `submit --slurm` passes every option it shares with `run` on to each task's `run` so.

A flag that means something else in another command (`--out`, `--format`, `--python`) is another option,
declared once for each meaning.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servematrix.backends.registry import CHOICES as BACKENDS
from servematrix.config.spec import MAX_STARTS
from servematrix.errors import InputError
from servematrix.planning.cells import DEFAULT_MAX_CELLS
from servematrix.planning.plan import GITHUB_MAX_JOBS
from servematrix.records.published import PUBLISHED_SITE, RECORD
from servematrix.stages import STAGES
from servematrix.store.store import DEFAULT_STORE
from servematrix.util import DEFAULT_WORKDIR, PREVIEW_DIR, STANDIN_GPUS_ENV

DEFAULT_MATRIX = Path("matrix/glm5-nvfp4.toml")

# nix/envs.json, the export that flake.nix reads (nixexport.DEFAULT_OUT is this path).
NIX_ENVS = Path("nix/envs.json")
EXIT_REGRESSION = 3

SELECT_HELP = """\
select expressions: KEY OP VALUE terms joined by commas, all of which must hold. Keys are the
matrix axes (sglang, torch, flashinfer, cuda, gpu, ...), mode, engine, env and id (id prefixes).
OP is = (exact; VALUE may be a|b), != or a version comparison (>=, <, ~=, ...):
  --select 'sglang>=0.5.10,<0.5.14'   --select 'gpu=b200|rtx-pro-6000'   --select env=3fa9
"""

# `servematrix --help`: the commands a newcomer runs first, in the order they run them.
EPILOG = f"""\
common commands:
  servematrix run matrix/cpu-smoke.toml           every stage, serving and benchmarking included, on a CPU
  servematrix run                                 the default matrix ({DEFAULT_MATRIX}); where the host lacks
                                                  its GPUs, the CPU pre-flight only (resolve, import, probe)
  servematrix run --stages resolve,import,probe   the pre-flight alone, on any host
  servematrix report                              a report of the store, into {PREVIEW_DIR}/
  servematrix recommend                           which stack to pick per GPU kind (the published results)
  servematrix plan matrix/glm5-nvfp4.toml         a matrix's cells, their ids and server argv
  servematrix classify server.log                 the failure cause in a server log

From a clone without servematrix on PATH, nox runs them: nox -s matrix|report|recommend|plan -- ARGS.

{SELECT_HELP}"""

PLAN_EPILOG = f"""\
examples:
  servematrix plan matrix/glm5-nvfp4.toml --select 'sglang>=0.5.10' --select mode=piecewise
  servematrix plan matrix/glm5-nvfp4.toml --format github --max-jobs 64
  servematrix plan matrix/cpu-smoke.toml --shard 1/2 --format json

{SELECT_HELP}"""

RUN_EPILOG = f"""\
examples:
  servematrix run matrix/cpu-smoke.toml                                    every stage, on a CPU
  servematrix run --select 'sglang>=0.5.12' --stages resolve,import,probe  pre-flight only: no GPU needed
  servematrix run --fresh --jobs 3                                         3 environments' pre-flights at once
  servematrix run matrix/cpu-smoke.toml --rerun --report out/              run again, and write a report
  servematrix run matrix/h200-smoke.toml --backend existing --python PATH  serve from an existing install
  servematrix run matrix/h200-smoke.toml --backend image                   serve from sglang's own images

{SELECT_HELP}"""


# ------------------------------------------------------------------------------------------------ checks
# Each takes the option's name (for the message) and its parsed value, and returns the value to use.


def stage_list(name: str, text: str) -> tuple[str, ...]:
    """`resolve,serve` -> the named stages in pipeline order; unknown or no stage is an InputError."""
    wanted = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [s for s in wanted if s not in STAGES]
    if unknown or not wanted:
        raise InputError(f"{name} {text!r}: unknown stage(s) {unknown} (stages: {','.join(STAGES)})")
    return tuple(s for s in STAGES if s in wanted)


def did_you_mean(word: str, candidates: Sequence[str]) -> str:
    """`; did you mean 'docker'?` when one candidate is close to `word`, else nothing."""
    close = difflib.get_close_matches(word, list(candidates), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def one_of(name: str, value: str | None, choices: Sequence[str]) -> str | None:
    """A value of an option with choices; any other is an InputError that suggests the closest."""
    if value is not None and value not in choices:
        raise InputError(
            f"{name}: invalid choice: {value!r}{did_you_mean(value, choices)} (choices: {', '.join(choices)})"
        )
    return value


def matrix_file(name: str, path: Path) -> Path:
    """A matrix file that exists; a misspelt one is an InputError naming the matrix files beside it (or in
    matrix/, where the README's matrices are)."""
    if path.is_file():
        return path
    folder = path.parent if path.parent.is_dir() and path.parent != Path(".") else DEFAULT_MATRIX.parent
    known = sorted(str(folder / p.name) for p in folder.glob("*.toml")) if folder.is_dir() else []
    close = difflib.get_close_matches(str(path), known, n=1, cutoff=0.5)
    suggestion = f"; did you mean {close[0]}?" if close else ""
    listing = f" (matrix files in {folder}/: {', '.join(Path(k).name for k in known)})" if known else ""
    what = "not a file" if path.exists() else "no such matrix file"
    raise InputError(f"{path}: {what}{suggestion}{listing}")


def optional_matrix_file(name: str, path: Path | None) -> Path | None:
    """`matrix_file` for a command whose matrix may be left out (`advisories`)."""
    return matrix_file(name, path) if path is not None else None


def at_least_one(name: str, value: int | None) -> int | None:
    if value is not None and value < 1:
        raise InputError(f"{name} must be at least 1")
    return value


def server_starts(name: str, value: int | None) -> int | None:
    """Server starts per mode: within the bound a matrix's `[bench] starts` has."""
    if value is not None and value > MAX_STARTS:
        raise InputError(f"{name} must be at most {MAX_STARTS} (the bound of a matrix's [bench] starts)")
    return at_least_one(name, value)


def github_jobs(name: str, value: int | None) -> int | None:
    """At least one job, and no more than a GitHub workflow run takes."""
    if value is not None and value > GITHUB_MAX_JOBS:
        raise InputError(f"{name} must be at most {GITHUB_MAX_JOBS}: a workflow run takes no more jobs")
    return at_least_one(name, value)


def command_words(name: str, text: str | None) -> tuple[str, ...] | None:
    """A command line as the shell splits it: `srun --container-image=X servematrix` -> its words."""
    if text is None:
        return None
    try:
        words = tuple(shlex.split(text))
    except ValueError as exc:  # an unclosed quote
        raise InputError(f"{name} {text!r}: {exc}") from None
    if not words:
        raise InputError(f"{name} is empty")
    return words


def slurm_name(name: str, text: str | None) -> str | None:
    """A Slurm partition (or a comma-separated list of them): a name, never a second line of the script."""
    if text is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*", text):
        raise InputError(f"{name} {text[:80]!r}: a Slurm partition is letters, digits and . _ - (comma-separated)")
    return text


def url_bases(name: str, texts: Sequence[str]) -> dict[str, str]:
    """`NAME=URL` pairs -> {NAME: URL}."""
    bases: dict[str, str] = {}
    for text in texts:
        base, sep, url = text.partition("=")
        if not base or not sep or "://" not in url:
            raise InputError(f"{name} {text!r}: expected NAME=URL")
        bases[base] = url
    return bases


# ----------------------------------------------------------------------------------------- declarations


@dataclass(frozen=True, kw_only=True)
class Command:
    """A subcommand: its one-line help in `servematrix --help`, and its own --help."""

    name: str
    help: str
    description: str
    epilog: str | None = None
    # `submit` runs `servematrix run` in every task: the options it shares with that command are passed on,
    # and its --help lists them in a group of their own.
    passes_to: str | None = None

    def parser_kwargs(self) -> dict[str, Any]:
        if self.epilog is None:
            return {"description": self.description}
        # Raw, so the epilog's examples keep their lines.
        return {
            "description": self.description,
            "epilog": self.epilog,
            "formatter_class": argparse.RawDescriptionHelpFormatter,
        }


@dataclass(frozen=True, kw_only=True)
class Option:
    """One option (or positional argument) and every command that takes it, as argparse's add_argument
    would be given it. Fields left None are left to argparse."""

    flags: tuple[str, ...]  # a positional argument: its name alone
    help: str
    commands: tuple[str, ...]
    dest: str | None = None
    default: Any = None
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    action: str | None = None
    nargs: str | None = None
    metavar: str | None = None
    required: bool = False
    check: Callable[[str, Any], Any] | None = None
    # Given only with another option's value: ("--backend", "existing") refuses it with any other backend;
    # ("--publish", True) refuses it without that flag.
    only_with: tuple[str, Any] | None = None
    not_with: tuple[str, ...] = ()  # options it is never given with
    why: str = ""  # what a broken rule's message adds: why the rule holds

    def given(self, value: Any) -> bool:
        """Whether `value` (parsed) was given rather than left at the default."""
        return value is not None and value is not False and value != self.default and value != []

    @property
    def name(self) -> str:
        """What messages call it: its first flag, or a positional argument's name."""
        return self.flags[0]

    @property
    def attribute(self) -> str:
        """Where argparse puts its value on the namespace."""
        return self.dest or self.flags[0].lstrip("-").replace("-", "_")

    @property
    def positional(self) -> bool:
        return not self.flags[0].startswith("-")

    def add_to(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> argparse.Action:
        fields = {
            "dest": self.dest,
            "default": self.default,
            "type": self.type,
            "choices": self.choices,
            "action": self.action,
            "nargs": self.nargs,
            "metavar": self.metavar,
        }
        kwargs: dict[str, Any] = {key: value for key, value in fields.items() if value is not None}
        if self.action == "append":  # a fresh list per parser: argparse appends to a copy of the default
            kwargs["default"] = list(self.default or ())
        if self.required:
            kwargs["required"] = True
        return parser.add_argument(*self.flags, help=self.help, **kwargs)


BISECT_EPILOG = """\
examples:
  servematrix bisect matrix/h200-smoke.toml --axis kernels --good 0.14.1 --bad 0.17.2
  servematrix bisect matrix/h200-smoke.toml --select mode=piecewise --axis flashinfer \\
      --good 0.6.12 --bad 0.6.11.post1 --probe-entry custom-op

--good may be newer than --bad: the search then finds the release that fixed it.
"""
BISECT_STAGES = ("probe", "import", "serve")
PROBE_ENTRIES = ("plain", "custom-op", "sglang-op")

PLANNED = ("plan", "run", "lock", "submit", "bisect")  # commands that plan a matrix
SHARDED = ("plan", "run", "lock")

COMMANDS: tuple[Command, ...] = (
    Command(
        name="plan",
        help="expand a matrix into cells and print them",
        description="Expand a matrix into cells with stable ids and the exact server argv of each.",
        epilog=PLAN_EPILOG,
    ),
    Command(
        name="run",
        help="run the cells of a matrix through the stages and store the results",
        description=f"Run cells through {' → '.join(STAGES)} (import and probe are CPU pre-flights; on a host "
        "without a cell's GPUs it runs those alone and ends skipped:no-gpu). Exit 0 when the harness "
        "worked, even if cells failed (failures are data); 2 on bad input; 130 when interrupted. Cells whose "
        "inputs are unchanged since a finished run are not run again (--rerun forces them).",
        epilog=RUN_EPILOG,
    ),
    Command(
        name="lock",
        help="resolve a lock file per environment with uv",
        description="Resolve each environment's requirements for its target Python and platform, with hashes. "
        "status: resolved | unresolvable (the stack cannot be installed) | error (infrastructure; retried).",
        epilog=SELECT_HELP,
    ),
    Command(
        name="report",
        help="write the compatibility table, HTML page, plots and failure pages from a store",
        description=f"Without --publish, a preview of the store's newest finished rows, into {PREVIEW_DIR}/ by "
        f"default (nothing committed changes). With --publish, the store's rows are merged into the published "
        f"results ({PUBLISHED_SITE / RECORD} by default: a cell's newer run replaces the older one, cells the "
        "store lacks stay unless --prune) and the site is rendered from them. A missing or empty store, or one "
        "with no finished row, is an error (exit 2).",
    ),
    Command(
        name="recommend",
        help="which stack to pick per matrix and GPU kind, and the nearest fix for each failing cell",
        description="Per matrix and GPU kind (matrices are never pooled: each may serve another model): the "
        "stacks that passed on a GPU (fastest first), then those every CPU pre-flight passed (a GPU run still "
        "decides); for each failing cell, the nearest cell of its matrix that is not failing and what differs. "
        "From a store, or from the published results.",
    ),
    Command(
        name="merge",
        help="merge shard stores into one (idempotent)",
        description="Merge shard stores into one, all or nothing: every input is checked before the target "
        "is touched, and rows the target has already are not added again.",
    ),
    Command(
        name="bisect",
        help="find the release of a package where an environment's verdict flips",
        description="Binary search over a package's releases on the index, between --good and --bad, in one "
        "environment of a matrix: both ends are checked stage by stage (probe, import, serve) until a stage "
        "tells them apart, and the releases between are checked with that stage alone. Every check is a cell "
        "run in the store; a bisection run again reuses them. Releases that cannot be installed are skipped "
        "and reported.",
        epilog=BISECT_EPILOG,
    ),
    Command(
        name="schema",
        help="print the JSON schema of a matrix file, for editors",
        description="Print the JSON schema of a matrix file (what `plan` validates, less the checks that need "
        "the engine's data). Editors that read TOML with a schema use it: taplo or VS Code's Even Better TOML "
        "(`#:schema ./schema.json` on a matrix's first line). matrix/schema.json is this output.",
    ),
    Command(
        name="tiny-model",
        help="build the CPU engine's tiny random Llama into DIR",
        description="Build a deterministic tiny Llama (byte-level BPE trained on built-in text, 2 layers, hidden "
        "64) with no model hub. Needs torch, transformers and tokenizers in the interpreter given by --python.",
    ),
    Command(
        name="classify",
        help="name the failure cause in a server log",
        description="Match a server log against the engine's failure signatures. JSON: "
        "{class, title, line, excerpt}; class is null when nothing matches.",
    ),
    Command(
        name="reclassify",
        help="name the causes of a store's failures again from their server logs, by this release's signatures",
        description="For each cell's newest failing row whose server log decided its class (a class of the "
        "engine's signatures, or server-exited), match the stored log again and, where this release's signatures "
        "name another cause, write it into the row, with a line of evidence saying it was named again and what "
        "the run had named it. Nothing runs again: a GPU failure's cause is refreshed without the GPU. Logs are "
        "found as stored (relative to where the run ran) or beside the store. Then `report --publish --store` "
        "publishes the rows. Exit 0 whether or not anything changed; 2 on a missing store.",
        epilog="example:\n  servematrix reclassify --store gpu-results/results.sqlite --dry-run",
    ),
    Command(
        name="advisories",
        help="list the known failures from public reports, and the cells of a matrix each one touches",
        description="List the advisories (known failures from public sglang and flashinfer reports, packaged "
        "as OSV records: docs/advisories.md) and, given a matrix, the applicable cells each one touches: "
        "affected (every condition holds: the cell is predicted to fail with the advisory's class) or at-risk "
        "(the advisory's condition may or may not hold for the cell). A malformed advisory is an error "
        "naming its file, record and key (exit 2).",
        epilog="examples:\n  servematrix advisories\n  servematrix advisories matrix/glm5-nvfp4.toml --format json",
    ),
    Command(
        name="releases",
        help="list the index's releases a matrix lacks, with their upload dates; --add writes them in",
        description="For each version axis of a matrix (the engine's own, pinnable axes with a version, package "
        "axes), the index's releases from the axis's oldest version on that the matrix lacks, with their upload "
        "dates. The engine's axis gets every one; any other axis the index's newest. Left out, with a note: "
        "pre-releases, yanked releases, releases without a wheel for the matrix's platforms and Python, and "
        "post releases whose Requires-Dist is their base release's. --add writes them into the matrix, all or "
        "nothing. Exit 0 with a listing; 2 on bad input; 1 when the index does not answer.",
        epilog="examples:\n  servematrix releases matrix/glm5-nvfp4.toml --since sglang=0.5.10\n"
        "  servematrix releases MATRIX --add --only sglang=0.5.13 --format json",
    ),
    Command(
        name="submit",
        help="run a matrix on a Slurm cluster: a job array per GPU kind and a merge job",
        description="Write and submit one Slurm job array per GPU kind (one task per group of environments, "
        "GPUs and time limit from the spec, each task with its own store) and a merge job that runs after "
        "all of them, merges the stores and writes the table. Scripts, task logs and stores go under --out.",
        epilog=SELECT_HELP,
        passes_to="run",
    ),
    Command(
        name="nix-export",
        help=f"write {NIX_ENVS}, the locked environments with their exact wheels, for flake.nix",
        description="Write the matrices' locked environments, with the exact wheel of every locked package, as "
        "the JSON flake.nix reads. Needs the package index (uv is asked where each locked file lives); "
        "--check needs nothing but the files.",
    ),
)

OPTIONS: tuple[Option, ...] = (
    # --- what to run: the matrix and which of its cells
    Option(
        flags=("matrix",),
        type=Path,
        nargs="?",
        default=DEFAULT_MATRIX,
        help=f"a matrix TOML file (default: {DEFAULT_MATRIX})",
        check=matrix_file,
        commands=(*PLANNED, "releases"),
    ),
    Option(
        flags=("--select",),
        action="append",
        metavar="EXPR",
        help="keep only cells matching EXPR (repeatable; all must hold)",
        commands=PLANNED,
    ),
    Option(
        flags=("--shard",),
        metavar="I/N",
        help="run the I-th of N stable shards (by environment)",
        commands=SHARDED,
    ),
    Option(
        flags=("--max-cells",),
        type=int,
        default=DEFAULT_MAX_CELLS,
        metavar="N",
        help=f"refuse a matrix of more than N cells, before expanding it (default: {DEFAULT_MAX_CELLS:,})",
        commands=SHARDED,
    ),
    # --- plan
    Option(
        flags=("--format",),
        choices=("table", "json", "github"),
        default="table",
        help="table (default), the contract JSON (a list of cells), or a GitHub Actions strategy.matrix",
        commands=("plan",),
    ),
    Option(
        flags=("--commands",),
        action="store_true",
        help="table format: print each cell's exact server argv below the table",
        commands=("plan",),
    ),
    Option(
        flags=("--max-jobs",),
        type=int,
        default=GITHUB_MAX_JOBS,
        metavar="N",
        help=f"github format: group cells into at most this many jobs (a workflow run takes {GITHUB_MAX_JOBS})",
        check=github_jobs,
        commands=("plan",),
    ),
    # --- run (and what submit passes to every task's run)
    Option(
        flags=("--stages",),
        default=",".join(STAGES),
        metavar="LIST",
        help=f"comma-separated stages to run, in pipeline order (default: {','.join(STAGES)})",
        check=stage_list,
        commands=("run", "submit"),
    ),
    Option(
        flags=("--backend",),
        choices=BACKENDS,
        default="auto",
        help="where environments are built and servers run. auto: podman or docker when it can get its base "
        "images, else venv (uv); nix: images from flake.nix; image: serve from the engine's published image of "
        "each release (podman or docker); existing: build nothing, serve with --python",
        commands=("run", "submit", "bisect"),
    ),
    Option(
        flags=("--python",),
        metavar="PATH",
        help="--backend existing: the interpreter whose installed packages serve every cell (default: this one); "
        "a cell whose axis versions are not installed there is refused",
        commands=("run",),
        only_with=("--backend", "existing"),
    ),
    Option(
        flags=("--image",),
        metavar="REF",
        help="--backend image: serve every cell from this image (default: the engine's published image of each "
        "release and CUDA version, from its data); a cell whose axis versions it does not hold is skipped",
        commands=("run", "submit"),
        only_with=("--backend", "image"),
    ),
    Option(
        flags=("--store",),
        type=Path,
        help=f"the SQLite result store (default: {DEFAULT_STORE})",
        commands=("run", "report", "bisect"),
    ),
    Option(
        flags=("--workdir",),
        type=Path,
        default=DEFAULT_WORKDIR,
        metavar="DIR",
        help=f"environments, logs and built models (default: {DEFAULT_WORKDIR}); for submit, on a filesystem "
        "the nodes share",
        commands=("run", "submit", "bisect"),
    ),
    Option(
        flags=("--lock-dir",),
        type=Path,
        metavar="DIR",
        help="where the lock files are: run writes them, nix-export reads them (default: locks/ beside each "
        "matrix; for bisect, WORKDIR/locks)",
        commands=("run", "nix-export", "bisect"),
    ),
    Option(
        flags=("--model-root",),
        type=Path,
        action="append",
        metavar="DIR",
        help="a directory besides the workdir where the matrix's built model may live (repeatable)",
        commands=("run",),
    ),
    Option(
        flags=("--rerun",),
        action="store_true",
        help="run cells again even if their inputs are unchanged",
        commands=("run", "submit"),
    ),
    Option(
        flags=("--fresh",),
        action="store_true",
        help="decide every cell here: reuse no published CPU verdict (default: a cell whose CPU pre-flight inputs "
        "match a row of docs/results/latest.json takes that row's verdict, and says so)",
        commands=("run",),
    ),
    Option(
        flags=("--jobs", "-j"),
        type=int,
        metavar="N",
        help="how many environments' CPU pre-flights (resolve, import check, the engine's own such as sglang's "
        "load) run at once, each in a process of its own: while one environment's lock installs and imports, "
        "another's load pre-flight runs. Only environments this host does not serve; served ones run one at a "
        "time. Default: what this host has room for, a core, 3 GB of available memory and one import check's disk "
        "(the engine's import_check cost_gb) each; 1: one environment at a time, in this process",
        check=at_least_one,
        commands=("run",),
    ),
    Option(
        flags=("--trust-probe",),
        action="store_true",
        help="do not run GPU stages for cells the CPU probe predicts to fail (default: run them to check it)",
        commands=("run",),
    ),
    Option(
        flags=("--starts",),
        type=int,
        metavar="N",
        help="server starts per mode, interleaved across an environment's modes, instead of the matrix's [bench] "
        "starts: the unit a speedup's interval counts. An indeterminate figure says how many starts would likely "
        "resolve it; a different count is a different workload, so its cells run again",
        check=server_starts,
        commands=("run",),
    ),
    Option(
        flags=("--standin-gpus",),
        type=int,
        metavar="N",
        help=f"a test device: run as if this host had N GPUs of any arch (default: {STANDIN_GPUS_ENV}, else the "
        "GPUs nvidia-smi lists). Cells that need GPUs are served on the backend (the tests' fake server) and "
        "packed onto the stand-ins; rows record the stand-ins as the host's GPUs",
        check=at_least_one,
        commands=("run",),
    ),
    Option(
        flags=("--report",),
        type=Path,
        metavar="DIR_OR_FILE",
        help="after the run, write a report of the store here: a directory, or the table's .md path (default: "
        "none; a run never writes docs/, `servematrix report --publish` publishes)",
        commands=("run",),
    ),
    Option(
        flags=("--no-report",),
        dest="report",
        action="store_const",
        help="write no report (the default)",
        commands=("run",),
    ),
    # --- lock
    Option(
        flags=("--out",),
        type=Path,
        help="directory for lock files (default: locks/ beside the matrix)",
        commands=("lock",),
    ),
    Option(
        flags=("--format",),
        choices=("table", "json"),
        default="table",
        help="table (default) or the contract JSON",
        commands=("lock",),
    ),
    # --- report
    Option(
        flags=("--out",),
        type=Path,
        help=f"output directory (default: {PREVIEW_DIR}; with --publish, the published site {PUBLISHED_SITE})",
        commands=("report",),
    ),
    Option(
        flags=("--publish",),
        action="store_true",
        help=f"merge into the published results and render the site there (default {PUBLISHED_SITE}/)",
        commands=("report",),
    ),
    Option(
        flags=("--prune",),
        action="store_true",
        help="with --publish: remove published cells the store does not have (says how many)",
        commands=("report",),
        only_with=("--publish", True),
    ),
    Option(
        flags=("--from-published",),
        action="store_true",
        help="with --publish: render the site again from the published results alone, no store (the docs build)",
        commands=("report",),
        only_with=("--publish", True),
        not_with=("--store", "--prune"),
        why="it renders the published results alone",
    ),
    Option(
        flags=("--baseline",),
        type=Path,
        help=f"published results to compare with (default: {PUBLISHED_SITE / RECORD}; when publishing, the "
        "record being merged into)",
        commands=("run", "report"),
    ),
    Option(
        flags=("--fail-on-regression",),
        action="store_true",
        help=f"exit {EXIT_REGRESSION} when a cell regressed against the published results (for CI)",
        commands=("run", "report"),
    ),
    # --- recommend
    Option(
        flags=("matrix",),
        nargs="?",
        type=Path,
        help="only this matrix's cells (default: every matrix in the results)",
        commands=("recommend",),
    ),
    Option(
        flags=("--store",),
        type=Path,
        help=f"a result store (default: the published {PUBLISHED_SITE / RECORD})",
        commands=("recommend",),
    ),
    Option(
        flags=("--all",),
        action="store_true",
        help="text format: every ranked cell, every held-back one and every failing cell, not only the answer",
        commands=("recommend",),
    ),
    # --- merge
    Option(
        flags=("out",),
        type=Path,
        metavar="OUT.sqlite",
        help="the store to merge into (created if missing)",
        commands=("merge",),
    ),
    Option(
        flags=("inputs",),
        type=Path,
        nargs="+",
        metavar="IN.sqlite",
        help="shard stores to merge from",
        commands=("merge",),
    ),
    # --- tiny-model
    Option(
        flags=("dir",),
        type=Path,
        help="where to write the model (config, weights, tokenizer)",
        commands=("tiny-model",),
    ),
    Option(
        flags=("--python",),
        help="interpreter to build with (default: this one if it has torch, transformers and tokenizers, "
        "else a uv-managed environment with them: `uv run --with ...`)",
        commands=("tiny-model",),
    ),
    # --- classify (and recommend's output format)
    Option(
        flags=("logfile",),
        type=Path,
        help="a server log",
        commands=("classify",),
    ),
    Option(
        flags=("--engine",),
        default="sglang",
        help="whose failure signatures to match (default: sglang; or transformers)",
        commands=("classify",),
    ),
    Option(
        flags=("--format",),
        choices=("text", "json"),
        default="text",
        help="text (default) or JSON",
        commands=("recommend", "classify", "bisect"),
    ),
    # --- advisories
    Option(
        flags=("matrix",),
        nargs="?",
        type=Path,
        help="also list the applicable cells of this matrix each advisory touches (default: the advisories alone)",
        check=optional_matrix_file,
        commands=("advisories",),
    ),
    Option(
        flags=("--format",),
        choices=("table", "json"),
        default="table",
        help="table (default) or JSON (each advisory, and with a matrix the ids of the cells it touches)",
        commands=("advisories",),
    ),
    Option(
        flags=("--advisories-dir",),
        type=Path,
        metavar="DIR",
        help="read the advisories of DIR instead of the packaged ones",
        commands=("advisories",),
    ),
    # --- reclassify
    Option(
        flags=("--store",),
        type=Path,
        help=f"the SQLite result store whose failures to name again (default: {DEFAULT_STORE})",
        commands=("reclassify",),
    ),
    Option(
        flags=("--dry-run",),
        action="store_true",
        help="say what would change and write nothing",
        commands=("reclassify",),
    ),
    # --- bisect
    Option(
        flags=("--axis",),
        required=True,
        metavar="NAME",
        help="a matrix axis (sglang, torch, flashinfer, a `packages` axis) or any package the environment installs",
        commands=("bisect",),
    ),
    Option(
        flags=("--good",), required=True, metavar="V1", help="a release with the good verdict", commands=("bisect",)
    ),
    Option(flags=("--bad",), required=True, metavar="V2", help="a release with the bad verdict", commands=("bisect",)),
    Option(
        flags=("--pre",),
        action="store_true",
        help="take pre-releases too (bisect: try them between the ends; releases: list them)",
        commands=("bisect", "releases"),
    ),
    Option(
        flags=("--yanked",), action="store_true", help="also try yanked releases between them", commands=("bisect",)
    ),
    Option(
        flags=("--stage",),
        choices=BISECT_STAGES,
        help="decide at this stage alone (default: the cheapest at which the ends differ)",
        commands=("bisect",),
    ),
    Option(
        flags=("--probe-entry",),
        choices=PROBE_ENTRIES,
        help="decide with the FP4 trace probe of this entry point alone (whether it exists and traces), on the "
        "cells of trace modes",
        commands=("bisect",),
    ),
    Option(
        flags=("--index-url",),
        metavar="URL",
        help="the index to list releases from (default: the one uv would use)",
        commands=("bisect", "releases"),
    ),
    # --- releases
    Option(
        flags=("--add",),
        action="store_true",
        help="write the releases marked for adding into the matrix file (its comments and layout kept; all or "
        "nothing; every existing cell keeps its id)",
        commands=("releases",),
    ),
    Option(
        flags=("--since",),
        action="append",
        metavar="AXIS=V",
        help="look at AXIS's releases from V on (default: the axis's oldest version in the matrix; repeatable)",
        commands=("releases",),
    ),
    Option(
        flags=("--only",),
        action="append",
        metavar="AXIS=V",
        help="list and add only these releases (V1|V2 names several; repeatable), e.g. --only sglang=0.5.13",
        commands=("releases",),
    ),
    Option(
        flags=("--format",),
        choices=("table", "json"),
        default="table",
        help="table (default) or JSON (each axis's range, missing and left-out releases, and what --add wrote)",
        commands=("releases",),
    ),
    # --- submit --slurm
    Option(
        flags=("--slurm",),
        action="store_true",
        required=True,
        help="submit to Slurm (the only scheduler)",
        commands=("submit",),
    ),
    Option(
        flags=("--partition",),
        metavar="P",
        help="Slurm partition for every job (default: the cluster's)",
        commands=("submit",),
        check=slurm_name,
    ),
    Option(
        flags=("--out",),
        type=Path,
        metavar="DIR",
        help="scripts, task logs, shard stores and the merged results.sqlite; on a filesystem the nodes "
        "share (default: .servematrix/slurm/TIMESTAMP)",
        commands=("submit",),
    ),
    Option(
        flags=("--report-out",),
        type=Path,
        metavar="DIR",
        help="where the merge job writes compatibility.md (default: --out)",
        commands=("submit",),
    ),
    Option(
        flags=("--launcher",),
        metavar="CMD",
        help='how a node runs servematrix, e.g. "srun --container-image=IMAGE servematrix" for enroot/pyxis '
        "(default: this interpreter, `python -m servematrix`)",
        check=command_words,
        commands=("submit",),
    ),
    Option(
        flags=("--max-tasks",),
        type=int,
        default=GITHUB_MAX_JOBS,
        metavar="N",
        help=f"at most this many tasks in all (default: {GITHUB_MAX_JOBS})",
        check=at_least_one,
        commands=("submit",),
    ),
    Option(
        flags=("--max-parallel",),
        type=int,
        metavar="N",
        help="run at most N tasks of an array at once",
        check=at_least_one,
        commands=("submit",),
    ),
    Option(
        flags=("--sbatch-arg",),
        dest="sbatch_args",
        action="append",
        metavar="ARG",
        help="extra sbatch option for every job, e.g. --sbatch-arg=--account=gpu (repeatable)",
        commands=("submit",),
    ),
    Option(
        flags=("--dry-run",),
        action="store_true",
        help="write the scripts and print the sbatch commands only",
        commands=("submit",),
    ),
    Option(
        flags=("--wait",),
        action="store_true",
        help="return when the merge job has ended; exit 1 unless it completed",
        commands=("submit",),
    ),
    Option(
        flags=("--wait-timeout",),
        type=float,
        metavar="S",
        help="give up waiting after S seconds",
        commands=("submit",),
    ),
    # --- nix-export
    Option(
        flags=("matrices",),
        type=Path,
        nargs="*",
        metavar="MATRIX",
        help="matrix TOML files (default: matrix/*.toml under --root)",
        commands=("nix-export",),
    ),
    Option(
        flags=("--out",),
        type=Path,
        default=NIX_ENVS,
        help=f"the JSON to write, or to check (default: {NIX_ENVS})",
        commands=("nix-export",),
    ),
    Option(
        flags=("--wheel-base",),
        dest="bases",
        action="append",
        metavar="NAME=URL",
        help="name a URL prefix that wheels are fetched from; the URL itself is never written out (repeatable)",
        check=url_bases,
        commands=("nix-export",),
    ),
    Option(
        flags=("--root",),
        type=Path,
        default=Path("."),
        help="the repository root (default: .)",
        commands=("nix-export",),
    ),
    Option(
        flags=("--uv",),
        default="uv",
        metavar="PATH",
        help="the uv that is asked where each locked wheel lives (default: uv on PATH)",
        commands=("nix-export",),
    ),
    Option(
        flags=("--check",),
        action="store_true",
        help="compare --out with the locks, offline; exit 1 if stale",
        commands=("nix-export",),
    ),
)

COMMAND = {command.name: command for command in COMMANDS}


def options_of(command: str) -> tuple[Option, ...]:
    """The options `command` takes, in declaration order (its --help lists them so)."""
    return tuple(option for option in OPTIONS if command in option.commands)


def add_options(parser: argparse.ArgumentParser, command: str) -> None:
    """Add `command`'s options to its parser. A command that passes options on to another (submit: run) lists
    those in a group named for it."""
    target = COMMAND[command].passes_to
    passed = parser.add_argument_group(f"passed to every task's `servematrix {target}`") if target is not None else None
    for option in options_of(command):
        if passed is not None and target in option.commands and not option.positional:
            option.add_to(passed)
        else:
            option.add_to(parser)


class Parser(argparse.ArgumentParser):
    """argparse's parser, but a value that is not among an option's choices (or a misspelt command) is the
    one-line InputError of `one_of`, with a did-you-mean, instead of argparse's usage and bare list."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # argparse's own hook for this check (a private method, unchanged since Python 3.2).
        if action.choices is not None and value not in action.choices:
            name = action.option_strings[0] if action.option_strings else (action.metavar or action.dest)
            one_of(str(name), value, [str(c) for c in action.choices])


def command_parser(command: str, *, prog: str) -> argparse.ArgumentParser:
    """A parser for one command alone (`python -m servematrix.scaleout.nixexport` is `servematrix nix-export`)."""
    parser = Parser(prog=prog, **COMMAND[command].parser_kwargs())
    add_options(parser, command)
    parser.set_defaults(command=command)
    return parser


def validate(args: argparse.Namespace) -> argparse.Namespace:
    """Run the checks of `args.command`'s options on the parsed values, once, and keep what they return.
    An InputError names the option."""
    options = options_of(args.command)
    for option in options:
        if option.check is not None:
            setattr(args, option.attribute, option.check(option.name, getattr(args, option.attribute)))
    named = {option.name: option for option in options}
    for option in options:
        if not option.given(getattr(args, option.attribute)):
            continue
        because = f": {option.why}" if option.why else ""
        if option.only_with is not None:
            flag, value = option.only_with
            if getattr(args, named[flag].attribute) != value:
                raise InputError(f"{option.name} is for {flag}" + ("" if value is True else f" {value}") + because)
        clashes = [flag for flag in option.not_with if named[flag].given(getattr(args, named[flag].attribute))]
        if clashes:
            raise InputError(f"{option.name} takes no {' nor '.join(clashes)}{because}")
    return args


def passed_on(command: str) -> tuple[Option, ...]:
    """The options `command` passes on to the command it runs (`submit`: `run`), in declaration order."""
    target = COMMAND[command].passes_to
    return tuple(option for option in options_of(command) if target is not None and target in option.commands)


def to_argv(options: Sequence[Option], values: Mapping[str, Any]) -> list[str]:
    """The arguments that parse back to `values` (by attribute) for `options`, from their declarations (nox's
    `to_argv`): a positional argument as itself, a flag when set, a repeatable option once per value, a list
    of names comma-separated; an option left at its default is left out."""
    argv: list[str] = []
    for option in options:
        value = values.get(option.attribute)
        if option.positional:
            argv.append(str(value))
        elif option.action == "store_true":
            argv += [option.name] if value else []
        elif option.action == "append":
            argv += [word for item in value or () for word in (option.name, str(item))]
        elif value is not None:
            text = ",".join(value) if isinstance(value, tuple | list) else str(value)
            argv += [option.name, text] if text != str(option.default) else []
    return argv
