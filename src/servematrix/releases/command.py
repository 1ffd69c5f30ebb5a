"""`servematrix releases [MATRIX] [--add] [--since AXIS=V] [--only AXIS=V] [--format table|json]` (its options:
servematrix.options).

The listing goes to stdout, as a table or JSON; what `--add` wrote goes to stderr (and into the JSON's
`added`). Exit 0 with a listing, 2 on bad input (a matrix, an option, a project the index lacks), 1 when the
index does not answer (one line: nothing was decided and nothing written).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from packaging.version import Version

from servematrix.errors import InputError
from servematrix.releases.watch import AxisReport


def _say(line: str) -> None:
    print(f"servematrix: releases: {line}", file=sys.stderr, flush=True)


def axis_versions(flag: str, texts: Sequence[str] | None) -> dict[str, frozenset[str]]:
    """`AXIS=V` terms (repeatable; `AXIS=V1|V2` names several) -> {axis: versions}."""
    out: dict[str, set[str]] = {}
    for text in texts or ():
        axis, sep, versions = text.partition("=")
        if not axis.strip() or not sep or not versions.strip():
            raise InputError(f"{flag} {text!r}: expected AXIS=VERSION, e.g. {flag} sglang=0.5.13")
        out.setdefault(axis.strip(), set()).update(v.strip() for v in versions.split("|") if v.strip())
    return {axis: frozenset(v) for axis, v in out.items()}


def cmd_releases(args: argparse.Namespace) -> int:
    from servematrix.bisection.releases import default_index
    from servematrix.config.spec import load_spec
    from servematrix.releases.edit import add_releases
    from servematrix.releases.index import IndexUnavailable, shown_url
    from servematrix.releases.watch import WatchOptions, watch
    from servematrix.stages.resolve import default_pins_cache_dir

    spec = load_spec(args.matrix)
    since = axis_versions("--since", args.since)
    for axis, versions in since.items():
        if len(versions) > 1:
            raise InputError(f"--since {axis}: give one version, not {'|'.join(sorted(versions))}")
    cuda = [spec.file.cuda[c].index_url for c in spec.file.axes.get("cuda", []) if c in spec.file.cuda]
    index = args.index_url or default_index(next((u for u in cuda if u), None))
    options = WatchOptions(
        index_url=index,
        cache_dir=default_pins_cache_dir(),
        since={axis: next(iter(v)) for axis, v in since.items()},
        only=axis_versions("--only", args.only),
        pre=args.pre,
    )
    try:
        reports = watch(spec, options)
    except IndexUnavailable as exc:
        print(f"servematrix: error: {exc} (nothing written; run it again)", file=sys.stderr)
        return 1
    additions = {r.axis: r.to_add for r in reports if r.to_add}
    added = add_releases(args.matrix, additions) if args.add and additions else None
    if args.format == "json":
        print(
            json.dumps(
                {
                    "matrix": str(args.matrix),
                    "index": shown_url(index),
                    "axes": [r.to_json() for r in reports],
                    "added": None
                    if added is None
                    else {
                        "values": {a: list(v) for a, v in added.values.items()},
                        "new_cells": list(added.new_cells),
                        "new_envs": list(added.new_envs),
                    },
                },
                indent=2,
            )
        )
    else:
        print(render_table(reports, index=shown_url(index), adding=args.add))
    if added is not None:
        written = "; ".join(f"{axis} {', '.join(versions)}" for axis, versions in added.values.items())
        _say(
            f"wrote {sum(len(v) for v in added.values.values())} value(s) into {args.matrix} ({written}): "
            f"{len(added.new_cells)} new cell(s) in {len(added.new_envs)} new environment(s); the "
            f"{added.kept_cells} existing cell(s) keep their ids"
        )
    elif args.add:
        _say(f"nothing to add: {args.matrix} is unchanged")
    return 0


def render_table(reports: Sequence[AxisReport], *, index: str, adding: bool = False) -> str:
    """Per axis: the range looked at, then each release the matrix lacks (or that was left out) with its date,
    whether --add writes it, and why."""
    lines = [f"index: {index}"]
    for report in reports:
        lines.append("")
        head = f"{report.axis} ({report.package})"
        if not report.policy:
            lines.append(f"{head}: {report.note}")
            continue
        lines.append(
            f"{head}: releases from {report.low} ({report.low_from}) to {report.newest} (the index's newest); "
            f"the matrix has {', '.join(report.present)}"
        )
        rows = [(c.version, c.uploaded or "?", "yes" if c.add else "no", c.note) for c in report.missing]
        rows += [(s.version, s.uploaded or "?", "-", f"left out: {s.reason}") for s in report.left_out]
        if not rows:
            lines.append("  nothing missing")
            continue
        rows.sort(key=lambda row: _version_key(row[0]))
        header = ("version", "uploaded", "added" if adding else "--add", "note")
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
        for row in [header, *rows]:
            cells = [row[i].ljust(widths[i]) for i in range(3)]
            lines.append(("  " + "  ".join([*cells, row[3]])).rstrip())
    return "\n".join(lines)


def _version_key(text: str) -> Version:
    return Version(text)
