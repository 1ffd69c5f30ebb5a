"""The `servematrix` command. Options are declared once here; every subcommand calls one function of the
package and prints its result. Exit codes: 0 when the harness worked (failed cells are data), 2 on bad
input, 1 on an internal fault."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from servematrix.backends.select import CHOICES as BACKENDS
from servematrix.bisection.command import add_bisect_parser
from servematrix.cells import DEFAULT_MAX_CELLS
from servematrix.errors import EXIT_BAD_INPUT, InputError
from servematrix.pipeline import STAGES
from servematrix.report.publish import PREVIEW_DIR, PUBLISHED_SITE, RECORD
from servematrix.slurm import add_submit_parser
from servematrix.store import DEFAULT_STORE

DEFAULT_MATRIX = Path("matrix/glm5-nvfp4.toml")
TABLE_NAME = "compatibility.md"
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
    parser.add_argument(
        "--max-cells",
        type=int,
        default=DEFAULT_MAX_CELLS,
        metavar="N",
        help=f"refuse a matrix of more than N cells, before expanding it (default: {DEFAULT_MAX_CELLS:,})",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="servematrix",
        description="Which torch x SGLang x FlashInfer x CUDA combinations serve your model, how fast, "
        "and why the others crash.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    plan = commands.add_parser(
        "plan",
        help="expand a matrix into cells and print them",
        description="Expand a matrix into cells with stable ids and the exact server argv of each.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _matrix_args(plan)
    plan.add_argument(
        "--format",
        choices=("table", "json", "github"),
        default="table",
        help="table (default), the contract JSON (a list of cells), or a GitHub Actions strategy.matrix",
    )
    plan.add_argument(
        "--commands", action="store_true", help="table format: print each cell's exact server argv below the table"
    )
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
        choices=BACKENDS,
        default="auto",
        help="where environments are built and servers run. auto: podman or docker when it can get its base "
        "images, else venv (uv); nix: images from flake.nix; existing: build nothing, serve with --python",
    )
    run.add_argument(
        "--python",
        metavar="PATH",
        help="--backend existing: the interpreter whose installed packages serve every cell (default: this one); "
        "a cell whose axis versions are not installed there is refused",
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
    run.add_argument(
        "--model-root",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="a directory besides the workdir where the matrix's built model may live (repeatable)",
    )
    run.add_argument("--rerun", action="store_true", help="run cells again even if their inputs are unchanged")
    run.add_argument(
        "--trust-probe",
        action="store_true",
        help="do not run GPU stages for cells the CPU probe predicts to fail (default: run them to check it)",
    )
    run.add_argument(
        "--report",
        type=Path,
        metavar="DIR_OR_FILE",
        help="after the run, write a report of the store here: a directory, or the table's .md path (default: "
        "none; a run never writes docs/, `servematrix report --publish` publishes)",
    )
    run.add_argument(
        "--no-report", dest="report", action="store_const", const=None, help="write no report (the default)"
    )
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
    lock.add_argument(
        "--format", choices=("table", "json"), default="table", help="table (default) or the contract JSON"
    )
    lock.set_defaults(handler=cmd_lock)

    report = commands.add_parser(
        "report",
        help="write the compatibility table, HTML page, plots and failure pages from a store",
        description=f"Without --publish, a preview of the store's newest finished rows, into {PREVIEW_DIR}/ by "
        f"default (nothing committed changes). With --publish, the store's rows are merged into the published "
        f"results ({PUBLISHED_SITE / RECORD} by default: a cell's newer run replaces the older one, cells the "
        "store lacks stay unless --prune) and the site is rendered from them. A missing or empty store, or one "
        "with no finished row, is an error (exit 2).",
    )
    report.add_argument("--store", type=Path, help=f"SQLite result store to report (default: {DEFAULT_STORE})")
    report.add_argument(
        "--out",
        type=Path,
        help=f"output directory (default: {PREVIEW_DIR}; with --publish, the published site {PUBLISHED_SITE})",
    )
    report.add_argument(
        "--publish",
        action="store_true",
        help=f"merge into the published results and render the site there (default {PUBLISHED_SITE}/)",
    )
    report.add_argument(
        "--prune",
        action="store_true",
        help="with --publish: remove published cells the store does not have (says how many)",
    )
    report.add_argument(
        "--from-published",
        action="store_true",
        help="with --publish: render the site again from the published results alone, no store (the docs build)",
    )
    _regression_args(report)
    report.set_defaults(handler=cmd_report)

    recommend = commands.add_parser(
        "recommend",
        help="which stack to pick per GPU kind, and the nearest fix for each failing cell",
        description="Per GPU kind: the stacks that passed on a GPU (fastest first), then those every CPU "
        "pre-flight passed (a GPU run still decides); for each failing cell, the nearest cell that is not "
        "failing and what differs. From a store, or from the published results.",
    )
    recommend.add_argument(
        "matrix", nargs="?", type=Path, help="only this matrix's cells (default: every matrix in the results)"
    )
    recommend.add_argument(
        "--store", type=Path, help=f"a result store (default: the published {PUBLISHED_SITE / RECORD})"
    )
    recommend.add_argument("--format", choices=("text", "json"), default="text", help="text (default) or JSON")
    recommend.set_defaults(handler=cmd_recommend)

    merge = commands.add_parser("merge", help="merge shard stores into one (idempotent)")
    merge.add_argument("out", type=Path, metavar="OUT.sqlite", help="the store to merge into (created if missing)")
    merge.add_argument("inputs", type=Path, nargs="+", metavar="IN.sqlite", help="shard stores to merge from")
    merge.set_defaults(handler=cmd_merge)

    tiny = commands.add_parser(
        "tiny-model",
        help="build the CPU engine's tiny random Llama into DIR",
        description="Build a deterministic tiny Llama (byte-level BPE trained on built-in text, 2 layers, hidden 64) "
        "with no model hub. Needs torch, transformers and tokenizers in the interpreter given by --python.",
    )
    tiny.add_argument("dir", type=Path, help="where to write the model (config, weights, tokenizer)")
    tiny.add_argument(
        "--python",
        help="interpreter to build with (default: this one if it has torch, transformers and tokenizers, "
        "else a uv-managed environment with them: `uv run --with ...`)",
    )
    tiny.set_defaults(handler=cmd_tiny_model)

    classify = commands.add_parser(
        "classify",
        help="name the failure cause in a server log",
        description="Match a server log against the engine's failure signatures. JSON: "
        "{class, title, line, excerpt}; class is null when nothing matches.",
    )
    classify.add_argument("logfile", type=Path, help="a server log")
    classify.add_argument(
        "--engine", default="sglang", help="whose failure signatures to match (default: sglang; or transformers)"
    )
    classify.add_argument("--format", choices=("text", "json"), default="text", help="text (default) or JSON")
    classify.set_defaults(handler=cmd_classify)
    add_submit_parser(commands)
    add_bisect_parser(commands)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("servematrix")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _regression_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--baseline",
        type=Path,
        help=f"published results to compare with (default: {PUBLISHED_SITE / RECORD}; when publishing, the "
        "record being merged into)",
    )
    parser.add_argument(
        "--fail-on-regression",
        action="store_true",
        help=f"exit {EXIT_REGRESSION} when a cell regressed against the published results (for CI)",
    )


def cmd_plan(args: argparse.Namespace) -> int:
    from servematrix.plan import github_matrix, make_plan, plan_json, print_table

    plan = make_plan(args.matrix, args.select, args.shard, max_cells=args.max_cells)
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
        print_table(plan, commands=args.commands)
    return 0


def _stages(text: str) -> tuple[str, ...]:
    wanted = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [s for s in wanted if s not in STAGES]
    if unknown or not wanted:
        raise InputError(f"--stages {text!r}: unknown stage(s) {unknown} (stages: {','.join(STAGES)})")
    return tuple(s for s in STAGES if s in wanted)


def _say(line: str) -> None:
    print(f"servematrix: {line}", file=sys.stderr, flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    from servematrix.backends.select import select_backend
    from servematrix.pipeline import RunOptions, builds_here, preamble, run_plan
    from servematrix.plan import make_plan

    stages = _stages(args.stages)
    plan = make_plan(args.matrix, args.select, args.shard, max_cells=args.max_cells)
    report_table = _report_table(args.report) if args.report is not None else None
    if report_table is not None:  # before the run, not after it: a refused report must not cost a run
        from servematrix.report.publish import refuse_published

        refuse_published(report_table.parent)
        if args.baseline is not None and not args.baseline.is_file():
            raise InputError(f"--baseline {args.baseline}: no such file")
    options = RunOptions(
        stages=stages,
        store=args.store,
        workdir=args.workdir,
        lock_dir=args.lock_dir,
        rerun=args.rerun,
        trust_probe=args.trust_probe,
        model_roots=tuple(args.model_root),
    )
    for line in preamble(plan, options):
        _say(line)
    if args.python and args.backend != "existing":
        raise InputError("--python is for --backend existing")
    backend = select_backend(
        args.backend, workdir=args.workdir, plan=plan, builds=builds_here(plan, stages), notice=_say, python=args.python
    )
    _say(f"backend: {backend.name}")
    # SIGINT and SIGTERM end the run cleanly (servers stopped, cells marked interrupted, exit 130), even when
    # the harness was started with SIGINT ignored, as a shell's background job is: Python then leaves it so.
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        summary = run_plan(plan, backend, options)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    regressions = _write_report(args.store, report_table, args.baseline) if report_table is not None else []
    print(
        f"run {summary.run_id}: {len(summary.verdicts)} cell(s) run, {summary.skipped_unchanged} unchanged; "
        f"store {args.store}",
        file=sys.stderr,
    )
    return _regression_exit(regressions, args.fail_on_regression)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _report_table(path: Path) -> Path:
    """`run --report PATH`: PATH is the table when it names a .md file, else the directory it goes in."""
    return path if path.suffix == ".md" else path / TABLE_NAME


def _write_report(
    store_path: Path | None,
    table: Path,
    baseline: Path | None,
    *,
    publish: bool = False,
    prune: bool = False,
    from_published: bool = False,
) -> list:  # type: ignore[type-arg]
    """The whole report beside `table`. A preview renders the store alone and writes no record; publishing
    merges the store into the record beside the table (or renders that record alone: `from_published`).
    Everything is read and checked before anything is written."""
    from servematrix.report import publish as publishing
    from servematrix.report.regressions import published_rows
    from servematrix.report.site import build_report

    out_dir, store = table.parent, store_path or DEFAULT_STORE
    record = out_dir / RECORD
    if baseline is not None and not baseline.is_file():  # named, so a gate that compares with nothing is wrong
        raise InputError(f"--baseline {baseline}: no such file")
    if not publish:
        rows = publishing.store_rows(store)  # first: a lost store is the cause worth naming
        publishing.refuse_published(out_dir)
        baseline = baseline or PUBLISHED_SITE / RECORD
        publishing.read_record(baseline)
    else:
        published = publishing.read_record(record)
        baseline = baseline or record
        publishing.read_record(baseline)
        if from_published:
            if not published or not published["cells"]:
                raise InputError(f"{record}: no published results to render")
            rows = published_rows(published)
            done = f"rendered the published results {record} again ({len(rows)} cell(s)); no store"
        else:
            merged = publishing.merge_published(published, publishing.store_rows(store), prune=prune)
            rows = list(merged.rows)
            done = merged.summary(record)
    result = build_report(
        rows,
        out_dir,
        baseline=baseline,
        results=record,
        write_record=publish,
        markdown_name=table.name,
    )
    written = f"{result.markdown}, {result.html}, {len(result.plots)} plot(s)"
    if publish:
        print(f"wrote {written}, {result.results}\n{done}", file=sys.stderr)
    else:
        print(
            f"wrote {written} from {store} (a preview: nothing published; `servematrix report --publish` publishes)",
            file=sys.stderr,
        )
    for regression in result.regressions:
        print(f"servematrix: 🔻 {regression}", file=sys.stderr)
    return list(result.regressions)


def _regression_exit(regressions: list, fail: bool) -> int:  # type: ignore[type-arg]
    if regressions and fail:
        print(f"servematrix: {len(regressions)} regression(s); --fail-on-regression", file=sys.stderr)
        return EXIT_REGRESSION
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    if not args.publish and (args.prune or args.from_published):
        raise InputError(f"{'--prune' if args.prune else '--from-published'} applies to publishing: add --publish")
    if args.from_published and (args.store is not None or args.prune):
        raise InputError("--from-published renders the published results alone: it takes no --store nor --prune")
    out = args.out or (PUBLISHED_SITE if args.publish else PREVIEW_DIR)
    regressions = _write_report(
        args.store,
        out / TABLE_NAME,
        args.baseline,
        publish=args.publish,
        prune=args.prune,
        from_published=args.from_published,
    )
    return _regression_exit(regressions, args.fail_on_regression)


def cmd_recommend(args: argparse.Namespace) -> int:
    from servematrix.report.publish import read_record, store_rows
    from servematrix.report.recommend import recommend, render_text
    from servematrix.report.regressions import published_rows

    if args.store is not None:
        rows = store_rows(args.store)
    else:
        record = read_record(PUBLISHED_SITE / RECORD)
        if record is None:
            raise InputError(f"no published results at {PUBLISHED_SITE / RECORD}: pass --store PATH")
        rows = published_rows(record)
    if args.matrix is not None:
        wanted = {str(args.matrix), args.matrix.as_posix()}
        known = sorted({str(r["matrix"]) for r in rows})
        rows = [r for r in rows if str(r["matrix"]) in wanted]
        if not rows:
            raise InputError(f"{args.matrix}: no results for this matrix (results hold: {', '.join(known)})")
    found = recommend(rows)
    if args.format == "json":
        print(json.dumps([r.to_dict() for r in found], indent=2))
    else:
        print(render_text(found, rows))
    return 0


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

    plan = make_plan(args.matrix, args.select, args.shard, max_cells=args.max_cells)
    outcomes = lock_plan(plan, out_dir=args.out)
    if args.format == "json":
        print(json.dumps([o.to_contract() for o in outcomes], indent=2))
    else:
        print_lock_table(plan, outcomes)
    return 0


def cmd_tiny_model(args: argparse.Namespace) -> int:
    from servematrix.engines import load_engine
    from servematrix.models import ModelBuildError, ensure_model

    python = [args.python] if args.python else _tiny_model_python()
    try:
        built = ensure_model(
            args.dir, builder="tiny-llama", engine=load_engine("transformers"), python=lambda _visible: python
        )
    except ModelBuildError as exc:
        print(f"servematrix: {exc}", file=sys.stderr)
        return 1
    print(built)
    return 0


# What the tiny-model builder imports (pyproject's `tiny-model` extra says the same for pip).
TINY_MODEL_PACKAGES = ("torch", "transformers>=5.5", "tokenizers>=0.20")


def _tiny_model_python() -> list[str]:
    """This interpreter when it can build the model; else uv runs the builder with the packages it needs."""
    import importlib.util
    import shutil

    names = [p.split(">")[0] for p in TINY_MODEL_PACKAGES]
    if all(importlib.util.find_spec(name) is not None for name in names):
        return [sys.executable]
    uv = shutil.which("uv")
    if uv is None:
        raise InputError(
            f"this interpreter lacks {', '.join(names)} and uv is not on PATH: pip install 'servematrix[tiny-model]' "
            "or pass --python PATH"
        )
    _say(f"building with `uv run --with {' --with '.join(TINY_MODEL_PACKAGES)}` (torch is downloaded once)")
    with_args = [arg for package in TINY_MODEL_PACKAGES for arg in ("--with", package)]
    return [uv, "run", "--no-project", "--quiet", *with_args, "python"]


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
    except BrokenPipeError:
        # The reader went away (`servematrix plan | head`): not an error. Point stdout at /dev/null so the
        # interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
