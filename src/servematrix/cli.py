"""The `servematrix` command. Options are declared once here; every subcommand calls one function of the
package and prints its result. Exit codes: 0 when the harness worked (failed cells are data), 2 on bad
input, 1 on an internal fault."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from servematrix.errors import EXIT_BAD_INPUT, InputError
from servematrix.pipeline import STAGES
from servematrix.slurm import add_submit_parser
from servematrix.store import DEFAULT_STORE

DEFAULT_MATRIX = Path("matrix/glm5-nvfp4.toml")
DEFAULT_REPORT = Path("docs/compatibility.md")
# The published results a report is compared with, and rewritten: results/latest.json beside the table.
RESULTS = Path("results/latest.json")
EXIT_REGRESSION = 3
EPILOG = """\
examples:
  servematrix plan matrix/glm5-nvfp4.toml --select 'sglang>=0.5.10' --select mode=piecewise
  servematrix plan matrix/glm5-nvfp4.toml --format github --max-jobs 64
  servematrix plan matrix/cpu-smoke.toml --shard 1/2 --format json

select expressions: KEY OP VALUE terms joined by commas, all of which must hold. Keys are the
matrix axes (sglang, torch, flashinfer, cuda, gpu, ...), mode, engine, env and id (id prefixes).
OP is = (exact; VALUE may be a|b), != or a version comparison (>=, <, ~=, ...):
  --select 'sglang>=0.5.10,<0.5.14'   --select 'gpu=b200|rtx-pro-6000'   --select env=3fa9
"""


def _matrix_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "matrix",
        type=Path,
        nargs="?",
        default=DEFAULT_MATRIX,
        help=f"a matrix TOML file (default: {DEFAULT_MATRIX})",
    )
    parser.add_argument(
        "--select",
        action="append",
        default=[],
        metavar="EXPR",
        help="keep only cells matching EXPR (repeatable; all must hold)",
    )
    parser.add_argument("--shard", metavar="I/N", help="run the I-th of N stable shards (by environment)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="servematrix",
        description="Which torch x SGLang x FlashInfer x CUDA combinations serve your model, how fast, "
        "and why the others crash.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    plan = commands.add_parser(
        "plan",
        help="expand a matrix into cells and print them",
        description="Expand a matrix into cells with stable ids and the exact server argv of each.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _matrix_args(plan)
    plan.add_argument("--format", choices=("table", "json", "github"), default="table")
    plan.add_argument(
        "--max-jobs",
        type=int,
        default=256,
        help="github format: group cells into at most this many jobs (a workflow run takes 256)",
    )
    plan.set_defaults(handler=cmd_plan)

    run = commands.add_parser(
        "run",
        help="run the cells of a matrix through the stages and store the results",
        description="Run cells through resolve → build → probe → serve → bench. Exit 0 when the harness "
        "worked, even if cells failed (failures are data); 2 on bad input; 130 when interrupted. Cells whose "
        "inputs are unchanged since a finished run are not run again (--rerun forces them).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _matrix_args(run)
    run.add_argument(
        "--stages",
        default=",".join(STAGES),
        metavar="LIST",
        help=f"comma-separated stages to run, in pipeline order (default: {','.join(STAGES)})",
    )
    run.add_argument(
        "--backend",
        choices=("auto", "podman", "docker", "venv", "nix"),
        default="auto",
        help="where environments are built and servers run (auto: the best available)",
    )
    run.add_argument(
        "--store", type=Path, default=DEFAULT_STORE, help=f"SQLite result store (default: {DEFAULT_STORE})"
    )
    run.add_argument(
        "--workdir",
        type=Path,
        default=Path(".servematrix"),
        help="environments, logs and built models (default: .servematrix)",
    )
    run.add_argument("--lock-dir", type=Path, help="where locks are written (default: locks/ beside the matrix)")
    run.add_argument("--rerun", action="store_true", help="run cells again even if their inputs are unchanged")
    run.add_argument(
        "--trust-probe",
        action="store_true",
        help="do not run GPU stages for cells the CPU probe predicts to fail (default: run them to check it)",
    )
    run.add_argument(
        "--report",
        type=Path,
        default=DEFAULT_REPORT,
        help=f"write the compatibility table here after the run (default: {DEFAULT_REPORT})",
    )
    run.add_argument("--no-report", dest="report", action="store_const", const=None, help="do not write the table")
    _regression_args(run)
    run.set_defaults(handler=cmd_run)

    lock = commands.add_parser(
        "lock",
        help="resolve a lock file per environment with uv",
        description="Resolve each environment's requirements for its target Python and platform, with hashes. "
        "status: resolved | unresolvable (the stack cannot be installed) | error (infrastructure; retried).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _matrix_args(lock)
    lock.add_argument("--out", type=Path, help="directory for lock files (default: locks/ beside the matrix)")
    lock.add_argument("--format", choices=("table", "json"), default="table")
    lock.set_defaults(handler=cmd_lock)

    report = commands.add_parser(
        "report",
        help="write the compatibility table, HTML page, plots and failure pages from a store",
        description="Without a store, the published results (--baseline) are rendered again.",
    )
    report.add_argument("--store", type=Path, default=DEFAULT_STORE)
    report.add_argument(
        "--out", type=Path, default=DEFAULT_REPORT.parent, help=f"output directory (default: {DEFAULT_REPORT.parent})"
    )
    _regression_args(report)
    report.set_defaults(handler=cmd_report)

    merge = commands.add_parser("merge", help="merge shard stores into one (idempotent)")
    merge.add_argument("out", type=Path, metavar="OUT.sqlite")
    merge.add_argument("inputs", type=Path, nargs="+", metavar="IN.sqlite")
    merge.set_defaults(handler=cmd_merge)

    tiny = commands.add_parser(
        "tiny-model",
        help="build the CPU engine's tiny random Llama into DIR",
        description="Build a deterministic tiny Llama (byte-level BPE trained on built-in text, 2 layers, hidden 64) "
        "with no model hub. Needs torch, transformers and tokenizers in the interpreter given by --python.",
    )
    tiny.add_argument("dir", type=Path)
    tiny.add_argument("--python", default=sys.executable, help="interpreter to build with (default: this one)")
    tiny.set_defaults(handler=cmd_tiny_model)

    classify = commands.add_parser(
        "classify",
        help="name the failure cause in a server log",
        description="Match a server log against the engine's failure signatures. JSON: "
        "{class, title, line, excerpt}; class is null when nothing matches.",
    )
    classify.add_argument("logfile", type=Path)
    classify.add_argument("--engine", default="sglang")
    classify.add_argument("--format", choices=("text", "json"), default="text")
    classify.set_defaults(handler=cmd_classify)
    add_submit_parser(commands)
    return parser


def _regression_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--baseline",
        type=Path,
        help=f"published results to compare with and rewrite (default: {RESULTS} beside the table)",
    )
    parser.add_argument(
        "--fail-on-regression",
        action="store_true",
        help=f"exit {EXIT_REGRESSION} when a cell regressed against the published results (for CI)",
    )


def cmd_plan(args: argparse.Namespace) -> int:
    from servematrix.plan import github_matrix, make_plan, plan_json, print_table

    plan = make_plan(args.matrix, args.select, args.shard)
    if args.format == "json":
        print(plan_json(plan))
    elif args.format == "github":
        if args.max_jobs < 1:
            raise InputError("--max-jobs must be at least 1")
        try:
            print(json.dumps(github_matrix(plan, args.max_jobs)))
        except ValueError as exc:
            raise InputError(str(exc)) from None
    else:
        print_table(plan)
    return 0


def _stages(text: str) -> tuple[str, ...]:
    wanted = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [s for s in wanted if s not in STAGES]
    if unknown or not wanted:
        raise InputError(f"--stages {text!r}: unknown stage(s) {unknown} (stages: {','.join(STAGES)})")
    return tuple(s for s in STAGES if s in wanted)


def _backend(name: str, workdir: Path, plan):  # type: ignore[no-untyped-def]
    if name == "nix":
        from servematrix.backends.nix import nix_backend

        return nix_backend(workdir, plan=plan)
    from servematrix.backends.select import select_backend

    return select_backend(name, workdir=workdir, plan=plan)


def cmd_run(args: argparse.Namespace) -> int:
    from servematrix.pipeline import RunOptions, run_plan
    from servematrix.plan import make_plan

    stages = _stages(args.stages)
    plan = make_plan(args.matrix, args.select, args.shard)
    options = RunOptions(
        stages=stages,
        store=args.store,
        workdir=args.workdir,
        lock_dir=args.lock_dir,
        rerun=args.rerun,
        trust_probe=args.trust_probe,
    )
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        summary = run_plan(plan, _backend(args.backend, args.workdir, plan), options)
    finally:
        signal.signal(signal.SIGTERM, previous)
    regressions = _write_report(args.store, args.report, args.baseline) if args.report is not None else []
    print(
        f"run {summary.run_id}: {len(summary.verdicts)} cell(s) run, {summary.skipped_unchanged} unchanged; "
        f"store {args.store}",
        file=sys.stderr,
    )
    return _regression_exit(regressions, args.fail_on_regression)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _write_report(store_path: Path | None, out: Path, baseline: Path | None) -> list:  # type: ignore[type-arg]
    """The whole report beside `out` (the table's path); rows from the store, or else the published results."""
    from servematrix.report.regressions import load_export, published_rows
    from servematrix.report.site import build_report
    from servematrix.store import Store

    baseline = baseline or out.parent / RESULTS
    try:
        published = load_export(baseline)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if store_path is not None and store_path.is_file():
        with Store(store_path) as store:
            rows = store.latest()
    elif published is not None:
        rows = published_rows(published)
        print(f"no store {store_path}: rendering the published results {baseline}", file=sys.stderr)
    else:
        raise InputError(f"{store_path}: no such store and no published results at {baseline} (run first)")
    result = build_report(rows, out.parent, baseline=baseline, results=baseline, markdown_name=out.name)
    print(f"wrote {result.markdown}, {result.html}, {len(result.plots)} plot(s), {result.results}", file=sys.stderr)
    for regression in result.regressions:
        print(f"servematrix: 🔻 {regression}", file=sys.stderr)
    return list(result.regressions)


def _regression_exit(regressions: list, fail: bool) -> int:  # type: ignore[type-arg]
    if regressions and fail:
        print(f"servematrix: {len(regressions)} regression(s); --fail-on-regression", file=sys.stderr)
        return EXIT_REGRESSION
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    regressions = _write_report(args.store, args.out / "compatibility.md", args.baseline)
    return _regression_exit(regressions, args.fail_on_regression)


def cmd_merge(args: argparse.Namespace) -> int:
    from servematrix.store import merge_stores

    missing = [str(p) for p in args.inputs if not p.is_file()]
    if missing:
        raise InputError(f"no such store(s): {', '.join(missing)}")
    # All or nothing: one transaction, every input checked before the target is touched.
    added = merge_stores(args.out, args.inputs)
    for source, count in zip(args.inputs, added, strict=True):
        print(f"{source}: {count} new row(s)", file=sys.stderr)
    return 0


def cmd_lock(args: argparse.Namespace) -> int:
    from servematrix.locking import lock_plan, print_lock_table
    from servematrix.plan import make_plan

    plan = make_plan(args.matrix, args.select, args.shard)
    outcomes = lock_plan(plan, out_dir=args.out)
    if args.format == "json":
        print(json.dumps([o.to_contract() for o in outcomes], indent=2))
    else:
        print_lock_table(plan, outcomes)
    return 0


def cmd_tiny_model(args: argparse.Namespace) -> int:
    from servematrix.engines import load_engine
    from servematrix.models import ModelBuildError, ensure_model

    try:
        built = ensure_model(
            args.dir, builder="tiny-llama", engine=load_engine("transformers"), python=lambda _visible: [args.python]
        )
    except ModelBuildError as exc:
        print(f"servematrix: {exc}", file=sys.stderr)
        return 1
    print(built)
    return 0


def cmd_classify(args: argparse.Namespace) -> int:
    from servematrix.classify import classify_file

    if not args.logfile.is_file():
        raise InputError(f"{args.logfile}: no such log file")
    result = classify_file(args.logfile, engine=args.engine)
    if args.format == "json":
        print(json.dumps(result, indent=2))
    elif result["class"] is None:
        print("no known failure signature matched")
    else:
        print(f"{result['class']}: {result['title']} (line {result['line']})\n\n{result['excerpt']}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except InputError as exc:
        print(f"servematrix: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("servematrix: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
