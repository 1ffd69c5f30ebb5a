"""The `servematrix` command. Options are declared once here; every subcommand calls one function of the
package and prints its result. Exit codes: 0 when the harness worked (failed cells are data), 2 on bad
input, 1 on an internal fault."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from servematrix.errors import EXIT_BAD_INPUT, InputError

DEFAULT_MATRIX = Path("matrix/glm5-nvfp4.toml")
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
        "matrix", type=Path, nargs="?", default=DEFAULT_MATRIX,
        help=f"a matrix TOML file (default: {DEFAULT_MATRIX})",
    )
    parser.add_argument(
        "--select", action="append", default=[], metavar="EXPR",
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
        "plan", help="expand a matrix into cells and print them",
        description="Expand a matrix into cells with stable ids and the exact server argv of each.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _matrix_args(plan)
    plan.add_argument("--format", choices=("table", "json", "github"), default="table")
    plan.add_argument(
        "--max-jobs", type=int, default=256,
        help="github format: group cells into at most this many jobs (a workflow run takes 256)",
    )
    plan.set_defaults(handler=cmd_plan)

    classify = commands.add_parser(
        "classify", help="name the failure cause in a server log",
        description="Match a server log against the engine's failure signatures. JSON: "
        "{class, title, line, excerpt}; class is null when nothing matches.",
    )
    classify.add_argument("logfile", type=Path)
    classify.add_argument("--engine", default="sglang")
    classify.add_argument("--format", choices=("text", "json"), default="text")
    classify.set_defaults(handler=cmd_classify)
    return parser


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
