"""`servematrix bisect MATRIX --select ... --axis NAME --good V1 --bad V2` (its options: servematrix.options).

Progress goes to stderr as plain lines (one per check, as it ends, and one before a check that runs); the
result goes to stdout, as text or JSON. Exit 0 with a result, 2 on bad input, 1 when an end could not be
checked (a fault: run it again, every finished check is reused), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from servematrix.errors import InputError
from servematrix.store.store import DEFAULT_STORE
from servematrix.util import interrupt_on_signals


def _say(line: str) -> None:
    print(f"servematrix: bisect: {line}", file=sys.stderr, flush=True)


def cmd_bisect(args: argparse.Namespace) -> int:
    from servematrix.backends import Backend
    from servematrix.backends.registry import select_backend
    from servematrix.backends.venv import VenvBackend
    from servematrix.bisection.checks import Checker, CheckOptions, find_target
    from servematrix.bisection.releases import between, check_ends, default_index, fetch_releases
    from servematrix.bisection.runner import Undecided, bisect, record_note
    from servematrix.config.spec import load_spec
    from servematrix.engines.plugins import hooks_of
    from servematrix.planning.plan import Plan
    from servematrix.run.runplan import builds_here

    store = args.store or DEFAULT_STORE
    if not args.matrix.is_file():
        raise InputError(f"{args.matrix}: no such matrix file")
    spec = load_spec(args.matrix)
    if args.probe_entry and hooks_of(spec.engine).probe_entry is None:
        raise InputError(f"--probe-entry: engine {spec.engine.name} has no entry probe (its hooks' probe_entry)")
    if args.probe_entry and args.stage not in (None, "probe"):
        raise InputError(f"--probe-entry decides at the probe stage, not --stage {args.stage}")
    check_ends(args.good, args.bad)
    target = find_target(spec, args.select, args.axis)

    def backend(plan: Plan, stages: tuple[str, ...]) -> Backend:
        if "build" not in stages:
            return VenvBackend(args.workdir / "envs")  # nothing is built: CPU stages only
        return select_backend(
            args.backend, workdir=args.workdir, plan=plan, builds=builds_here(plan, stages), notice=_say
        )

    options = CheckOptions(
        store=store,
        workdir=args.workdir,
        lock_dir=args.lock_dir or args.workdir / "locks",
        probe_entry=args.probe_entry,
    )
    checker = Checker(target, options, backend, say=_say)
    stage = args.stage or ("probe" if args.probe_entry else None)
    here = checker.stages_here()
    if stage is not None and stage not in here:
        raise InputError(f"--stage {stage}: this host decides at {', '.join(here) or 'no stage'} for this environment")
    cuda = spec.file.cuda.get(target.env.axes.get("cuda", ""))
    index = args.index_url or default_index(cuda.index_url if cuda else None)
    releases = fetch_releases(target.package, index)
    candidates = between(releases, args.good, args.bad, pre=args.pre, yanked=args.yanked, package=target.package)
    _say(
        f"{target.package}: {len(candidates)} releases from {candidates[0]} to {candidates[-1]}, in {target.described}"
    )
    try:
        with interrupt_on_signals():
            result = bisect(
                target,
                candidates,
                good=args.good,
                bad=args.bad,
                checker=checker,
                stage=stage,
                say=_say,
            )
    except Undecided as exc:
        print(f"servematrix: error: {exc}", file=sys.stderr)
        return 1
    noted = record_note(result, store, options.run_id)
    report = result.to_dict() | {"noted_rows": noted, "store": str(store)}
    print(json.dumps(report, indent=2) if args.format == "json" else render_text(report))
    return 0


def render_text(report: dict[str, Any]) -> str:
    """The result for a reader: the boundary with the evidence of both sides, then what it cost."""
    package, stage = report["package"], report["stage"]
    axes = " ".join(f"{k}={v}" for k, v in report["environment"].items())
    older, newer = (
        (("last good", report["last_good"]), ("first bad", report["first_bad"]))
        if report["direction"] == "regression"
        else (("last bad", report["first_bad"]), ("first good", report["last_good"]))
    )
    checks = report["checks"]
    lines = [
        f"bisect {package} {report['good']} (good) .. {report['bad']} (bad) in {report['matrix']}",
        f"  environment: {axes}; modes {', '.join(report['modes'])}",
        f"  {len(report['candidates'])} releases: {', '.join(report['candidates'])}",
        f"  deciding stage: {stage}",
        "",
    ]
    width = max(len(older[0]), len(newer[0]))
    for name, side in (older, newer):
        lines.append(f"{name:<{width}}  {package} {side['version']}: {side['evidence']}")
    if report["ambiguous"]:
        lines.append(f"  skipped between them, so the change may be theirs: {', '.join(report['ambiguous'])}")
    lines += [
        "",
        f"tried at {stage}: " + ", ".join(f"{t['version']} {t['label']}" for t in report["tried"]),
        f"skipped: {', '.join(report['skipped']) or 'none'}",
        f"checks: {checks['run']} run, {checks['reused']} reused; at {stage}: {checks['at_stage']['run']} run, "
        f"{checks['at_stage']['reused']} reused (at most {checks['at_most']} for {len(report['candidates'])} releases)",
    ]
    if report["noted_rows"]:
        lines.append(f"noted on {report['noted_rows']} row(s) of {report['store']}: {report['note']}")
    return "\n".join(lines)
