"""Which stack to pick, per matrix and GPU kind, from the results: the cells that passed on a GPU, ranked by measured
throughput; then the cells nothing has ruled out (every CPU pre-flight passed, no GPU run yet); and for each
failing cell, its nearest cell that is not failing (fewest axis changes) and what differs. Matrices are never
pooled: two matrices may serve different models on the same GPU kind (the GLM-5 architecture and a dense
Llama on an H200), and one's pass says nothing of the other's failure.

Observed and predicted are never mixed up: a ranked stack says whether it was measured on a GPU or only
passed the CPU pre-flights.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from servematrix.engines import load_engine
from servematrix.report.rows import comparison, deciding_evidence, speedup_text, tok_s, ttft_ms, version_key
from servematrix.store.store import Row

# Verdicts that rule a cell out, and those that say nothing yet (a GPU is needed to decide).
FAILING = ("fail", "predicted-fail", "unresolvable")
UNDECIDED = ("skipped:no-gpu",)


@dataclass(frozen=True, kw_only=True)
class Stack:
    cell_id: str
    matrix: str
    axes: Mapping[str, str]
    mode: str
    source: str  # observed (served and benchmarked) or predicted (only the CPU pre-flights passed)
    tok_s: float | None  # median output tok/s at the highest concurrency measured, observed only
    concurrency: int | None
    ttft_ms: float | None = None  # the prefill profile's median TTFT at its lowest level, observed only
    ttft_concurrency: int | None = None
    versus_baseline: str | None = None  # the mode's headline speedup over the environment's baseline


@dataclass(frozen=True, kw_only=True)
class Neighbour:
    cell_id: str
    verdict: str
    nearest: str | None  # cell id
    changes: tuple[str, ...]  # e.g. "flashinfer 0.6.12 instead of pinned", "baseline instead of piecewise"


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    matrix: str
    gpu: str
    stacks: tuple[Stack, ...]
    failing: tuple[Neighbour, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _status(row: Row) -> str:
    verdict = str(row.get("verdict") or "")
    if verdict == "pass":
        return "pass"
    if verdict in UNDECIDED:
        return "open"
    if verdict.split(":")[0] in FAILING:
        return "fail"
    return "other"  # not applicable, errors, interrupted: neither a recommendation nor a failure


def _changes(row: Row, other: Row) -> list[str]:
    out = [
        f"{axis} {other['axes'].get(axis)} instead of {value}"
        for axis, value in sorted(row["axes"].items())
        if axis != "gpu" and other["axes"].get(axis) != value
    ]
    if row["mode"] != other["mode"]:
        out.append(f"{other['mode']} instead of {row['mode']}")
    return out


def _nearest_finder(good: Sequence[Row]) -> Callable[[Row], Row | None]:
    """A failing row's nearest in `good`: fewest changes (`_changes`), then the same mode, then the first.

    Scanning `good` for every failing row was quadratic in environments (issue 38). Rows of one axis set are
    found in buckets instead: a row's axis values and mode with up to two of them left out, each bucket in
    `good`'s order; the first bucket entries at the fewest left out are the answer, exactly as the scan's. Only
    a row more than two changes from every good one is scanned for."""

    def scan(row: Row) -> Row | None:
        return min(good, key=lambda g: (len(_changes(row, g)), g["mode"] != row["mode"]), default=None)

    names = {tuple(sorted(a for a in g["axes"] if a != "gpu")) for g in good}
    if len(names) != 1:
        return scan
    (axes,) = names
    width = len(axes) + 1  # the mode is the last feature
    masks = [m for d in range(3) for m in itertools.combinations(range(width), d)]

    def keys(row: Row) -> Iterator[tuple[tuple[int, ...], tuple[Any, ...]]]:
        features = (*(row["axes"].get(a) for a in axes), row["mode"])
        for mask in masks:
            yield mask, tuple(_ANY if i in mask else v for i, v in enumerate(features))

    buckets: dict[tuple[tuple[int, ...], tuple[Any, ...]], int] = {}
    for position, row in enumerate(good):
        for key in keys(row):
            buckets.setdefault(key, position)  # the first in good's order is all a bucket needs

    def find(row: Row) -> Row | None:
        if tuple(sorted(a for a in row["axes"] if a != "gpu")) != axes:
            return scan(row)
        hits = [(len(mask), width - 1 in mask, buckets[(mask, k)]) for mask, k in keys(row) if (mask, k) in buckets]
        if not hits:
            return scan(row)
        fewest = min(h[0] for h in hits)
        # At the fewest left out, a bucket's entries differ exactly there (none differs in fewer), so a bucket
        # that leaves out the mode holds only rows of another mode.
        return good[min((h[1], h[2]) for h in hits if h[0] == fewest)[1]]

    return find


_ANY = object()


def recommend(rows: Sequence[Row]) -> list[Recommendation]:
    """One recommendation per matrix and GPU kind in the rows."""
    out = []
    for matrix, gpu in sorted({(str(r["matrix"]), str(r["axes"].get("gpu", ""))) for r in rows}):
        # Whatever order the rows come in (a store, the published record), the same recommendation.
        mine = sorted(
            (r for r in rows if str(r["matrix"]) == matrix and str(r["axes"].get("gpu", "")) == gpu),
            key=lambda r: (sorted(r["axes"].items()), r["mode"], r["cell_id"]),
        )
        good = [r for r in mine if _status(r) in ("pass", "open")]
        by_env: dict[str, dict[str, Row]] = {}
        for row in mine:
            by_env.setdefault(str(row.get("env_id") or row["cell_id"]), {})[row["mode"]] = row
        stacks = []
        for row in good:
            measured = tok_s(row) if _status(row) == "pass" else {}
            top = max(measured) if measured else None
            ttft = ttft_ms(row) if _status(row) == "pass" else {}
            low = min(ttft) if ttft else None
            stacks.append(
                Stack(
                    cell_id=row["cell_id"],
                    matrix=row["matrix"],
                    axes=dict(row["axes"]),
                    mode=row["mode"],
                    source="observed: served and benchmarked" if _status(row) == "pass" else _predicted(row),
                    tok_s=measured[top] if top is not None else None,
                    concurrency=top,
                    ttft_ms=ttft[low] if low is not None else None,
                    ttft_concurrency=low,
                    versus_baseline=_versus_baseline(row, by_env[str(row.get("env_id") or row["cell_id"])]),
                )
            )
        # Observed first, fastest first; then the undecided ones, newest versions first.
        observed = sorted((s for s in stacks if s.tok_s is not None), key=lambda s: (-(s.tok_s or 0.0), s.cell_id))
        undecided = sorted(
            (s for s in stacks if s.tok_s is None),
            key=lambda s: tuple(version_key(str(v)) for v in s.axes.values()),
            reverse=True,
        )
        stacks = observed + undecided
        failing = []
        nearest = _nearest_finder(good)
        for row in (r for r in mine if _status(r) == "fail"):
            best = nearest(row)
            failing.append(
                Neighbour(
                    cell_id=row["cell_id"],
                    verdict=str(row["verdict"]),
                    nearest=best["cell_id"] if best else None,
                    changes=tuple(_changes(row, best)) if best else (),
                )
            )
        out.append(Recommendation(matrix=matrix, gpu=gpu, stacks=tuple(stacks), failing=tuple(failing)))
    return out


def _predicted(row: Row) -> str:
    """A cell no CPU pre-flight ruled out, with how far they reached (the load pre-flight's last step), so a
    prediction never reads as more than it is."""
    reach = deciding_evidence(row)
    return f"predicted: passed the CPU pre-flights ({reach})" if reach else "predicted: passed the CPU pre-flights"


def _versus_baseline(row: Row, env: Mapping[str, Row]) -> str | None:
    """The mode's headline speedup over its environment's first mode, as the table shows it."""
    if row.get("verdict") != "pass" or not row.get("engine"):
        return None
    engine = load_engine(row["engine"])
    first = next((env[m] for m in engine.modes if m in env), None)
    if first is None or first is row:
        return None
    found = comparison(engine, first, row)
    if found is None or found.headline is None:
        return None
    return f"{speedup_text(found.headline, bold=False)} over {first['mode']}"


def _stack_line(stack: Stack) -> str:
    axes = " ".join(f"{k} {v}" for k, v in sorted(stack.axes.items()) if k != "gpu")
    figure = f", {stack.tok_s:,.0f} decode tok/s @{stack.concurrency}" if stack.tok_s is not None else ""
    if stack.ttft_ms is not None:
        figure += f", TTFT {stack.ttft_ms:,.1f} ms @{stack.ttft_concurrency}"
    if stack.versus_baseline:
        figure += f"; {stack.versus_baseline}"
    return f"{axes}, {stack.mode}: {stack.source}{figure}"


def render_text(recommendations: Sequence[Recommendation], rows: Sequence[Row]) -> str:
    by_id = {r["cell_id"]: r for r in rows}
    lines = []
    for rec in recommendations:
        lines.append(f"{rec.gpu} ({rec.matrix}):")
        if not rec.stacks:
            lines.append("  nothing is expected to work yet")
        for rank, stack in enumerate(rec.stacks[:5], 1):
            lines.append(f"  {rank}. {_stack_line(stack)}")
        for neighbour in rec.failing:
            row = by_id[neighbour.cell_id]
            axes = " ".join(f"{k} {v}" for k, v in sorted(row["axes"].items()) if k != "gpu")
            fix = "; ".join(neighbour.changes) if neighbour.nearest else "no cell of this GPU kind works"
            lines.append(f"  - {axes}, {row['mode']}: {neighbour.verdict} -> {fix}")
    return "\n".join(lines)


def render_markdown(rows: Sequence[Row]) -> str:
    """The docs' lead: per matrix and GPU kind, the top stacks and how to fix each failing cell."""
    from servematrix.report.escape import code, text

    lines = ["## Recommendation\n"]
    by_id = {r["cell_id"]: r for r in rows}
    for rec in recommend(rows):
        lines.append(f"**{text(rec.matrix)}, {text(rec.gpu)}**\n")
        if not rec.stacks:
            lines.append("- nothing is expected to work yet\n")
        for rank, stack in enumerate(rec.stacks[:3], 1):
            lines.append(f"{rank}. {text(_stack_line(stack))} ({code(stack.cell_id)})")
        fixes = [n for n in rec.failing if n.nearest]
        if fixes:
            lines.append(
                f'\n<details markdown="1"><summary>{len(rec.failing)} failing cell(s): the nearest cell that is not failing</summary>\n'
            )
            for neighbour in fixes:
                row = by_id[neighbour.cell_id]
                axes = " ".join(f"{k} {v}" for k, v in sorted(row["axes"].items()) if k != "gpu")
                lines.append(
                    f"- {text(axes)}, {text(row['mode'])}: {text(neighbour.verdict)} → "
                    f"{text('; '.join(neighbour.changes))}"
                )
            lines.append("\n</details>\n")
        lines.append("")
    lines.append(
        "Observed means served and benchmarked on a GPU; the CPU pre-flights (resolve, flags, FP4 trace, import) "
        "can rule a stack out but never prove it: only a GPU run does.\n"
    )
    return "\n".join(lines)


def nearest_fixes(rows: Sequence[Row]) -> dict[str, str]:
    """cell id -> what its nearest non-failing cell changes, for each failing cell (the failure pages)."""
    return {
        neighbour.cell_id: "; ".join(neighbour.changes)
        for rec in recommend(rows)
        for neighbour in rec.failing
        if neighbour.nearest
    }
