"""The `servematrix` command: the parser built from servematrix.options (every option is declared there, once)
and one handler per subcommand, which calls the package and prints its result. Exit codes: 0 when the harness worked (failed cells are data), 2 on bad
input, 1 on an internal fault."""

from __future__ import annotations

import argparse
import errno
import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from servematrix.bisection.command import cmd_bisect
from servematrix.errors import EXIT_BAD_INPUT, InputError
from servematrix.options import COMMANDS, EPILOG, EXIT_REGRESSION, Parser, add_options, validate
from servematrix.records.published import PUBLISHED_SITE, RECORD
from servematrix.releases.command import cmd_releases
from servematrix.report import command as reporting
from servematrix.report.command import TABLE_NAME
from servematrix.run import hostinfo, pool
from servematrix.store.store import DEFAULT_STORE
from servematrix.util import PREVIEW_DIR, interrupt_on_signals


def build_parser() -> argparse.ArgumentParser:
    """Every command, with the options servematrix.options declares for it."""
    parser = Parser(
        prog="servematrix",
        description="Which torch x SGLang x FlashInfer x CUDA combinations serve your model, how fast, "
        "and why the others crash.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        subparser = commands.add_parser(command.name, help=command.help, **command.parser_kwargs())
        add_options(subparser, command.name)
        subparser.set_defaults(handler=HANDLERS[command.name])
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, parsed and checked (each option's check, once: servematrix.options.validate). A bad
    value is an InputError; what argparse refuses exits 2 with the usage."""
    return validate(build_parser().parse_args(argv))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("servematrix")
    except PackageNotFoundError:
        return "unknown (not installed)"


def cmd_plan(args: argparse.Namespace) -> int:
    from servematrix.planning.plan import github_matrix, make_plan, plan_json, print_table

    plan = make_plan(args.matrix, args.select, args.shard, max_cells=args.max_cells)
    if args.format == "json":
        print(plan_json(plan))
    elif args.format == "github":
        try:
            print(json.dumps(github_matrix(plan, args.max_jobs)))
        except ValueError as exc:
            raise InputError(str(exc)) from None
    else:
        print_table(plan, commands=args.commands)
    return 0


def _say(line: str) -> None:
    print(f"servematrix: {line}", file=sys.stderr, flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    from servematrix.backends.registry import select_backend
    from servematrix.planning.plan import make_plan, with_starts
    from servematrix.run.pipeline import run_plan
    from servematrix.run.reuse import PUBLISHED
    from servematrix.run.runplan import RunOptions, builds_here, preamble

    stages, store = args.stages, args.store or DEFAULT_STORE
    if args.standin_gpus is not None:  # through the environment: the packed jobs' processes see it too
        os.environ[hostinfo.STANDIN_GPUS_ENV] = str(args.standin_gpus)
        hostinfo.host.cache_clear()
    plan = make_plan(args.matrix, args.select, args.shard, max_cells=args.max_cells)
    if args.starts is not None:
        plan = with_starts(plan, args.starts)
    report_table = _report_table(args.report) if args.report is not None else None
    if report_table is not None:  # before the run, not after it: a refused report must not cost a run
        from servematrix.report.publish import refuse_published

        refuse_published(report_table.parent)
        if args.baseline is not None and not args.baseline.is_file():
            raise InputError(f"--baseline {args.baseline}: no such file")
    options = RunOptions(
        stages=stages,
        store=store,
        workdir=args.workdir,
        lock_dir=args.lock_dir,
        rerun=args.rerun,
        fresh=args.fresh,
        published=PUBLISHED,
        trust_probe=args.trust_probe,
        model_roots=tuple(args.model_root),
        jobs=args.jobs or pool.room(args.workdir / "cache", plan.spec.engine).jobs,
    )
    for line in preamble(plan, options):
        _say(line)
    builds = builds_here(plan, stages)
    backend = select_backend(
        args.backend, workdir=args.workdir, plan=plan, builds=builds, notice=_say, python=args.python, image=args.image
    )
    # Only a run that builds an environment uses its backend: naming one that was never tried would mislead.
    _say(f"backend: {backend.name}" if builds else "backend: none used (no environment is built on this host)")
    # SIGINT and SIGTERM end the run cleanly: servers stopped, the programs of worker threads (import checks,
    # resolutions) killed, cells marked interrupted, exit 130.
    with interrupt_on_signals():
        summary = run_plan(plan, backend, options)
    regressions = reporting.report(store, report_table, args.baseline) if report_table is not None else []
    print(
        f"run {summary.run_id}: {len(summary.verdicts)} cell(s) run ({summary.reused} reused from the published "
        f"results, {len(summary.verdicts) - summary.reused} decided now), {summary.skipped_unchanged} unchanged; "
        f"store {store}",
        file=sys.stderr,
    )
    for line in next_steps(store, reported=report_table):
        _say(line)
    return _regression_exit(regressions, args.fail_on_regression)


def command_hint(command: str, *args: str) -> str:
    """How to run a servematrix command from here: the nox session that runs it when nox ran this one (its venv
    is on PATH only inside nox: the README's route) or servematrix is not on PATH, else `servematrix ...`."""
    import shutil

    if "NOX_CURRENT_SESSION" not in os.environ and shutil.which("servematrix") is not None:
        return shlex.join(["servematrix", command, *args])
    session = NOX_SESSIONS[command]
    return shlex.join(["nox", "-s", session, *(["--", *args] if args else [])])


# The nox session that runs each servematrix command (noxfile.py); `matrix` is the README's first command.
NOX_SESSIONS = {"run": "matrix", "report": "report", "recommend": "recommend", "plan": "plan", "lock": "lock"}


def next_steps(store: Path, *, reported: Path | None) -> list[str]:
    """What to do with a run's results: where its report is, or how to make one, and how to pick a stack."""
    from servematrix.report.site import HTML_NAME

    store_args = () if store == DEFAULT_STORE else ("--store", str(store))
    if reported is not None:
        report = f"report: {reported.parent / HTML_NAME}"
    else:
        report = f"report: `{command_hint('report', *store_args)}` writes {PREVIEW_DIR / HTML_NAME}"
    return [report, f"which stack to pick: `{command_hint('recommend', '--store', str(store))}`"]


def _report_table(path: Path) -> Path:
    """`run --report PATH`: PATH is the table when it names a .md file, else the directory it goes in."""
    return path if path.suffix == ".md" else path / TABLE_NAME


def _regression_exit(regressions: list, fail: bool) -> int:  # type: ignore[type-arg]
    if regressions and fail:
        print(f"servematrix: {len(regressions)} regression(s); --fail-on-regression", file=sys.stderr)
        return EXIT_REGRESSION
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    # The rules between its options are options.validate's; what to write, report.command's.
    table = args.out / TABLE_NAME if args.out else None
    regressions = reporting.report(
        args.store,
        table,
        args.baseline,
        publish=args.publish,
        prune=args.prune,
        from_published=args.from_published,
        no_store=no_store_yet,
    )
    return _regression_exit(regressions, args.fail_on_regression)


def no_store_yet(store: Path) -> str:
    """Why `report` has nothing to report yet, and the two ways to get something: run, or the published results."""
    from servematrix.report.site import HTML_NAME
    from servematrix.run.runplan import CPU_SMOKE

    return (
        f"{store}: no such store: nothing has run here yet. Run a matrix first (`{command_hint('run', CPU_SMOKE)}` "
        f"on any CPU), or read the published results, {PUBLISHED_SITE / HTML_NAME} (rendered again from "
        f"{PUBLISHED_SITE / RECORD} by `{command_hint('report', '--publish', '--from-published')}`; "
        "`recommend` reads that record when given no --store)"
    )


def cmd_recommend(args: argparse.Namespace) -> int:
    from servematrix.evidence import apply as apply_evidence
    from servematrix.report.publish import read_record, store_rows
    from servematrix.report.recommend import recommend, render_text
    from servematrix.report.regressions import published_rows
    from servematrix.store.redact import strip_terminal_controls

    if args.store is not None:
        rows = store_rows(args.store)
    else:
        record = read_record(PUBLISHED_SITE / RECORD)
        if record is None:
            raise InputError(f"no published results at {PUBLISHED_SITE / RECORD}: pass --store PATH")
        rows = published_rows(record)
    rows = apply_evidence(rows)  # from every matrix's rows: a lane's observation reaches the product's cells
    if args.matrix is not None:
        wanted = {str(args.matrix), args.matrix.as_posix()}
        known = sorted({r.matrix for r in rows})
        rows = [r for r in rows if r.matrix in wanted]
        if not rows:
            raise InputError(f"{args.matrix}: no results for this matrix (results hold: {', '.join(known)})")
    found = recommend(rows)
    if args.format == "json":
        print(json.dumps([r.to_dict() for r in found], indent=2))
    else:
        print(
            strip_terminal_controls(render_text(found, rows, every=args.all))
        )  # a row's text never drives the terminal
        if args.store is None:  # the published rows: the pre-flight's track record, with the recommendation
            from servematrix.report.history.track import published_line

            print(published_line(PUBLISHED_SITE, rows))
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from servematrix.store.store import merge_stores

    missing = [str(p) for p in args.inputs if not p.is_file()]
    if missing:
        raise InputError(f"no such store(s): {', '.join(missing)}")
    # All or nothing: one transaction, every input checked before the target is touched.
    kept: list[int] = []
    added = merge_stores(args.out, args.inputs, kept)
    for source, count, same in zip(args.inputs, added, kept, strict=True):
        unchanged = f"; {same} row(s) the target already held finished were kept as they were" if same else ""
        print(f"{source}: {count} new row(s){unchanged}", file=sys.stderr)
    return 0


def cmd_lock(args: argparse.Namespace) -> int:
    from servematrix.planning.plan import make_plan
    from servematrix.stages.locking import lock_plan, print_lock_table

    plan = make_plan(args.matrix, args.select, args.shard, max_cells=args.max_cells)
    # SIGINT and SIGTERM kill the uv resolutions in flight (none is left behind, orphaned), exit 130.
    with interrupt_on_signals():
        outcomes = lock_plan(plan, out_dir=args.out)
    if args.format == "json":
        print(json.dumps([o.to_contract() for o in outcomes], indent=2))
    else:
        print_lock_table(plan, outcomes)
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from servematrix.config.spec import matrix_json_schema

    print(json.dumps(matrix_json_schema(), indent=2, sort_keys=True))
    return 0


def cmd_tiny_model(args: argparse.Namespace) -> int:
    from servematrix.engines import load_engine
    from servematrix.run.models import ModelBuildError, ensure_model

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


def cmd_advisories(args: argparse.Namespace) -> int:
    from servematrix.advisories import load_advisories
    from servematrix.advisories.command import render_json, render_table, touched
    from servematrix.planning.plan import make_plan
    from servematrix.stages.locking import default_lock_dir

    advisories = load_advisories(args.advisories_dir)
    plan = make_plan(args.matrix) if args.matrix is not None else None
    rows = touched(advisories, plan, default_lock_dir(plan) if plan is not None else None)
    if args.format == "json":
        print(render_json(rows, with_cells=plan is not None))
    else:
        print(render_table(rows, plan=plan))
    return 0


def cmd_classify(args: argparse.Namespace) -> int:
    from servematrix.classify import NO_MATCH, match_file

    if not args.logfile.is_file():
        raise InputError(f"{args.logfile}: no such log file")
    found = match_file(args.logfile, engine=args.engine)
    if args.format == "json":
        print(json.dumps(found.to_contract() if found is not None else NO_MATCH, indent=2))
    elif found is None:
        print("no known failure signature matched")
    else:
        evidence = "".join(f"evidence: {line}\n" for line in found.evidence)
        print(f"{found.cls}: {found.title} (line {found.line})\n{evidence}\n{found.excerpt}")
    return 0


def cmd_reclassify(args: argparse.Namespace) -> int:
    from servematrix.report import reclassify
    from servematrix.store.store import DEFAULT_STORE, Store

    path = args.store or DEFAULT_STORE
    if not path.is_file():
        raise InputError(f"{path}: no such store")
    with Store(path, read_only=args.dry_run) as store:
        changes = list(reclassify.renamed(store, path))
        for change in changes:
            print(
                f"{change.cell_id} {change.matrix} mode={change.mode}: {change.was} -> {change.now} "
                f"({change.log}, line {change.line})"
            )
        if not args.dry_run:
            reclassify.apply(store, changes)
    verb = "would be named again (--dry-run: nothing written)" if args.dry_run else "named again"
    print(f"{len(changes)} failure cause(s) {verb}", file=sys.stderr)
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from servematrix.scaleout.slurm import SlurmError, job_state, options_from_args, submit, wait

    options = options_from_args(args)
    try:
        submission = submit(options, dry_run=args.dry_run)
    except SlurmError as exc:
        print(f"servematrix: {exc}", file=sys.stderr)
        return 1
    for array in submission.arrays:
        gres = f"{array.gpus_per_task} GPU(s)" if array.gpus_per_task else "no GPU"
        print(
            f"{array.job_id or 'array'} {array.gpu}: {array.tasks} task(s), {array.cells} cell(s), {gres} and "
            f"{array.time_minutes} min per task: {array.script}",
            file=sys.stderr,
        )
    print(
        f"{submission.merge_job_id or 'merge'}: merge into {options.store}: {submission.merge_script}", file=sys.stderr
    )
    if args.dry_run:
        for command in submission.commands:
            print(shlex.join(command))
        return 0
    print(" ".join(submission.job_ids))
    if not args.wait:
        return 0
    assert submission.merge_job_id is not None
    try:
        wait(submission.job_ids, timeout_s=args.wait_timeout)
    except SlurmError as exc:
        print(f"servematrix: {exc}", file=sys.stderr)
        return 1
    state = job_state(submission.merge_job_id)
    print(f"merge job {submission.merge_job_id}: {state or 'ended'}", file=sys.stderr)
    return 0 if (state == "COMPLETED" or (state is None and options.store.is_file())) else 1


def cmd_nix_export(args: argparse.Namespace) -> int:
    from servematrix.scaleout.nixexport import ExportError, command

    try:
        return command(args)
    except ExportError as exc:  # the export cannot be faithful: the input's problem, named by env and package
        raise InputError(str(exc)) from None


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "plan": cmd_plan,
    "run": cmd_run,
    "lock": cmd_lock,
    "report": cmd_report,
    "recommend": cmd_recommend,
    "merge": cmd_merge,
    "bisect": cmd_bisect,
    "schema": cmd_schema,
    "tiny-model": cmd_tiny_model,
    "classify": cmd_classify,
    "advisories": cmd_advisories,
    "reclassify": cmd_reclassify,
    "submit": cmd_submit,
    "nix-export": cmd_nix_export,
    "releases": cmd_releases,
}


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        handler: Callable[[argparse.Namespace], int] = args.handler
        return handler(args)
    except InputError as exc:
        print(f"servematrix: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        # The reader went away (`servematrix plan | head`): not an error. Point stdout at /dev/null so the
        # interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # after BrokenPipeError, one of its kind
        if exc.errno != errno.ENAMETOOLONG:
            raise
        # A path the system refuses by its length, wherever it was first touched: one line, not a traceback.
        print(f"servematrix: error: {str(exc.filename)[:80]}...: {exc.strerror}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("servematrix: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
