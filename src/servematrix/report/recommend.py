"""Which stack to pick, per matrix and GPU kind, ranked by evidence (docs/evidence.md); the failing cells summarised
by cause with the fix each needs; and for each failing cell its nearest cell that is not failing (fewest axis
changes) and what differs. Matrices are never pooled: two matrices may serve different models on the same GPU kind
(the GLM-5 architecture and a dense Llama on an H200), and one's pass says nothing of the other's failure; a GPU
lane's observation reaches another matrix's cells only through the evidence layer (`servematrix.evidence`).

The order of the picks (`TIERS`): observed on this GPU kind (fastest first); observed on a sibling GPU in this
release and mode; the load pre-flight reached the module build; lighter pre-flights. Within a tier, the release's
own pins before crossed ones, a nearby release's observation before none, newer releases first. No pick has
evidence against it (a carried failure, an at-risk mark, an advisory): those cells are held back and said why.
Observed and predicted are never mixed up: each pick says what it rests on, what has not been shown, and the one
run that would settle it.
"""

from __future__ import annotations

import functools
import itertools
import tomllib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from servematrix.classify.placeholder import placeholder_fault
from servematrix.engines import load_engine
from servematrix.evidence import apply as apply_evidence
from servematrix.evidence.derive import gpu_label, gpu_name, pieces_of, release_of
from servematrix.evidence.model import Piece
from servematrix.formats.lockfile import parse_pins
from servematrix.report.rows import comparison, deciding_evidence, speedup_text, tok_s, ttft_ms, version_key
from servematrix.store.store import Row

# Verdicts that rule a cell out, and those that say nothing yet (a GPU is needed to decide).
FAILING = ("fail", "predicted-fail", "unresolvable")
UNDECIDED = ("skipped:no-gpu",)
TIERS = (
    "observed on this GPU kind",
    "observed on a sibling GPU in this release and mode",
    "the load pre-flight reached the module build",
    "lighter CPU pre-flights",
)
# Which of a stack's open modes leads: breakable is the release default from sglang 0.5.15 and goes through no
# dynamo trace; piecewise next; full; the baseline (no prefill graph) last, though the likeliest to start.
MODE_PREFERENCE = ("breakable", "piecewise", "full", "baseline")
PICKS = 3  # per GPU kind in the short answer
MODULE_BUILD = "load: loaded to the module build"


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
    release: str = ""  # the engine's release (its axis)
    tier: int = 0  # index into TIERS
    crossed: tuple[str, ...] = ()  # packages whose release pin the cell crosses
    words: str = ""  # the stack in the user's words: "sglang 0.5.23 · flashinfer 0.7.2 (its pin) · … · breakable"
    rests_on: str = ""
    not_shown: str = ""
    settle: str = ""  # the one run that would settle it
    evidence: tuple[str, ...] = ()  # the evidence layer's pieces (supporting ones, for a pick)
    against: tuple[str, ...] = ()  # evidence against it (its pieces' headlines): a held-back cell's


@dataclass(frozen=True, kw_only=True)
class Neighbour:
    cell_id: str
    verdict: str
    nearest: str | None  # cell id
    changes: tuple[str, ...]  # e.g. "flashinfer 0.6.12 instead of pinned", "baseline instead of piecewise"


@dataclass(frozen=True, kw_only=True)
class Cause:
    """The failing cells of one class, and the fix most of them share (their nearest non-failing cell's change)."""

    cls: str
    cells: tuple[str, ...]
    fix: str
    fixed: int  # how many of the cells that fix is the nearest for


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    matrix: str
    gpu: str
    stacks: tuple[Stack, ...]  # every cell that is not failing and has no evidence against it, best first
    failing: tuple[Neighbour, ...]
    held: tuple[Stack, ...] = ()  # not failing, but evidence against it: never a pick
    causes: tuple[Cause, ...] = ()
    undecided: tuple[tuple[str, str], ...] = ()  # (why, release) of each cell whose check could not run (an error)

    @property
    def picks(self) -> tuple[Stack, ...]:
        """The short answer: the best cell of each of the first PICKS environments. Where every cell that is not
        failing has evidence against it, the best of those, each saying what is against it."""
        seen: set[tuple[Any, ...]] = set()
        out = []
        for stack in self.stacks or self.held:
            # Observed cells are picked by their figures, every mode; the rest one per environment (its best mode).
            key = (stack.cell_id,) if stack.tier == 0 else tuple(sorted(stack.axes.items()))
            if key not in seen:
                seen.add(key)
                out.append(stack)
        return tuple(out[:PICKS])

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "picks": [s.cell_id for s in self.picks]}


def _status(row: Row) -> str:
    verdict = str(row.verdict or "")
    if verdict == "pass":
        return "pass"
    if verdict in UNDECIDED:
        return "open"
    if verdict.split(":")[0] in FAILING:
        return "fail"
    if verdict.startswith("error:"):
        return "error"  # the check could not run: neither a recommendation nor a failure, but said
    return "other"  # not applicable, interrupted: neither a recommendation nor a failure


def _undecided_why(row: Row) -> str:
    """Why a cell's check could not run, in one line: a placeholder pin (the same for every host that reaches
    only the index), else the error's verdict."""
    found = placeholder_fault(str(row.excerpt or ""))
    if found is not None:
        return (
            f"the lock pins {found.name} {found.version}, a placeholder sdist the index has no wheel of; "
            f"a host that reaches {found.index} decides them with --fresh"
        )
    return str(row.verdict)


def _undecided_summary(undecided: Sequence[tuple[str, str]]) -> list[str]:
    """Cells whose check could not run, grouped by why: how many, and which releases."""
    groups: dict[str, list[str]] = {}
    for why, release in undecided:
        groups.setdefault(why, []).append(release)
    return [
        f"{len(releases)} cell(s) ({', '.join(sorted(set(releases), key=version_key))}): {why}"
        for why, releases in groups.items()
    ]


def _changes(row: Row, other: Row) -> list[str]:
    out = [
        f"{axis} {other.axes.get(axis)} instead of {value}"
        for axis, value in sorted(row.axes.items())
        if axis != "gpu" and other.axes.get(axis) != value
    ]
    if row.mode != other.mode:
        out.append(f"{other.mode} instead of {row.mode}")
    return out


def _nearest_finder(good: Sequence[Row]) -> Callable[[Row], Row | None]:
    """A failing row's nearest in `good`: fewest changes (`_changes`), then the same mode, then the first.

    Scanning `good` for every failing row was quadratic in environments (issue 38). Rows of one axis set are
    found in buckets instead: a row's axis values and mode with up to two of them left out, each bucket in
    `good`'s order; the first bucket entries at the fewest left out are the answer, exactly as the scan's. Only
    a row more than two changes from every good one is scanned for."""

    def scan(row: Row) -> Row | None:
        return min(good, key=lambda g: (len(_changes(row, g)), g.mode != row.mode), default=None)

    names = {tuple(sorted(a for a in g.axes if a != "gpu")) for g in good}
    if len(names) != 1:
        return scan
    (axes,) = names
    width = len(axes) + 1  # the mode is the last feature
    masks = [m for d in range(3) for m in itertools.combinations(range(width), d)]

    def keys(row: Row) -> Iterator[tuple[tuple[int, ...], tuple[Any, ...]]]:
        features = (*(row.axes.get(a) for a in axes), row.mode)
        for mask in masks:
            yield mask, tuple(_ANY if i in mask else v for i, v in enumerate(features))

    buckets: dict[tuple[tuple[int, ...], tuple[Any, ...]], int] = {}
    for position, row in enumerate(good):
        for key in keys(row):
            buckets.setdefault(key, position)  # the first in good's order is all a bucket needs

    def find(row: Row) -> Row | None:
        if tuple(sorted(a for a in row.axes if a != "gpu")) != axes:
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
    """One recommendation per matrix and GPU kind in the rows, with the evidence layer applied (rows it was applied
    to already are taken as they are)."""
    rows = apply_evidence(rows)
    out = []
    for matrix, gpu in sorted({(str(r.matrix), str(r.axes.get("gpu", ""))) for r in rows}):
        # Whatever order the rows come in (a store, the published record), the same recommendation.
        mine = sorted(
            (r for r in rows if str(r.matrix) == matrix and str(r.axes.get("gpu", "")) == gpu),
            key=lambda r: (sorted(r.axes.items()), r.mode, r.cell_id),
        )
        good = [r for r in mine if _status(r) in ("pass", "open")]
        by_env: dict[str, dict[str, Row]] = {}
        for row in mine:
            by_env.setdefault(str(row.env_id or row.cell_id), {})[row.mode] = row
        stacks = [_stack(row, by_env[str(row.env_id or row.cell_id)]) for row in good]
        clean = _ranked(s for s in stacks if not s.against)
        held = _ranked(s for s in stacks if s.against)
        failing = []
        nearest = _nearest_finder(good)
        for row in (r for r in mine if _status(r) == "fail"):
            best = nearest(row)
            failing.append(
                Neighbour(
                    cell_id=row.cell_id,
                    verdict=str(row.verdict),
                    nearest=best.cell_id if best else None,
                    changes=tuple(_changes(row, best)) if best else (),
                )
            )
        undecided = tuple((_undecided_why(r), release_of(r)) for r in mine if _status(r) == "error")
        out.append(
            Recommendation(
                matrix=matrix,
                gpu=gpu,
                stacks=tuple(clean),
                failing=tuple(failing),
                held=tuple(held),
                causes=_causes(failing),
                undecided=undecided,
            )
        )
    return out


def _ranked(stacks: Iterable[Stack]) -> list[Stack]:
    """Best first (`TIERS`, then the tie-breaks the module's docstring lists); newest release first among equals."""
    newest_first = sorted(stacks, key=lambda s: (version_key(_release(s)), s.cell_id), reverse=True)
    return sorted(newest_first, key=_rank)  # stable: the release order stays among equal ranks


def _rank(stack: Stack) -> tuple[Any, ...]:
    nearby = any(e.startswith("nearby release:") for e in stack.evidence)
    return (
        stack.tier,
        -(stack.tok_s or 0.0),  # observed: the fastest first
        bool(stack.crossed),  # the release's own pins before crossed ones
        not nearby,  # a nearby release's observation before none
    ) + (() if stack.tier == 0 else (MODE_PREFERENCE.index(stack.mode) if stack.mode in MODE_PREFERENCE else 99,))


def _stack(row: Row, env: Mapping[str, Row]) -> Stack:
    passed = _status(row) == "pass"
    measured = tok_s(row) if passed else {}
    top = max(measured) if measured else None
    ttft = ttft_ms(row) if passed else {}
    low = min(ttft) if ttft else None
    pieces = pieces_of(row)
    tier = 0 if passed else 1 if any(p.kind == "sibling" and p.stance == "supports" for p in pieces) else 2
    if tier == 2 and not any(str(e).startswith(MODULE_BUILD) for e in row.evidence or ()):
        tier = 3
    stack = Stack(
        cell_id=row.cell_id,
        matrix=row.matrix,
        axes=dict(row.axes),
        mode=row.mode,
        source="observed: served and benchmarked" if passed else _predicted(row),
        tok_s=measured[top] if top is not None else None,
        concurrency=top,
        ttft_ms=ttft[low] if low is not None else None,
        ttft_concurrency=low,
        versus_baseline=_versus_baseline(row, env),
        release=release_of(row) or str(row.axes.get("sglang", "")),
        tier=tier,
        crossed=tuple(sorted(row.crossed_pins or {})),
        words=stack_words(row),
        evidence=tuple(p.text for p in pieces if not p.against),
        against=tuple(p.headline or p.text for p in pieces if p.against),
    )
    return Stack(
        **{
            **asdict(stack),
            "axes": stack.axes,
            "rests_on": _rests_on(stack, row, pieces),
            "not_shown": _not_shown(stack, row),
            "settle": _settle(stack, row),
        }
    )


def _predicted(row: Row) -> str:
    """A cell no CPU pre-flight ruled out, with how far they reached (the load pre-flight's last step), so a
    prediction never reads as more than it is."""
    reach = deciding_evidence(row)
    return f"predicted: passed the CPU pre-flights ({reach})" if reach else "predicted: passed the CPU pre-flights"


@functools.cache
def _lock_pins(path: str) -> dict[str, str]:
    try:
        return parse_pins(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}


# An axis that names a package, and the package's name in a lock.
_PACKAGES = {"flashinfer": "flashinfer-python", "torch": "torch", "transformers": "transformers"}
_QUIET = {("resolution", "today"), ("kernels", "locked")}  # the default of an axis: said by saying nothing


def stack_words(row: Row) -> str:
    """The stack as a user would say it: "sglang 0.5.23 · flashinfer 0.7.2 (its pin) · torch 2.14.1 (its pin) ·
    CUDA 13.0 · breakable". A `pinned` axis is named by the version its lock holds, where the lock is here."""
    axes = {k: str(v) for k, v in row.axes.items() if k != "gpu"}
    engine = str(row.engine or "")
    pins = _lock_pins(str(row.lock_file or "")) if row.lock_file else {}
    crossed = row.crossed_pins or {}
    parts = [f"{engine} {axes.pop(engine)}"] if engine in axes else []
    for axis in ("flashinfer", "torch"):
        if axis not in axes:
            continue
        value = axes.pop(axis)
        package = _PACKAGES[axis]
        if value == "pinned":
            parts.append(f"{axis} {pins.get(package, '')} (its pin)".replace("  ", " "))
        else:
            pin = (crossed.get(package) or {}).get("release_pin") if isinstance(crossed.get(package), dict) else None
            parts.append(f"{axis} {value} (crosses its pin{' ' + str(pin) if pin else ''})")
    if "cuda" in axes:
        parts.append(f"CUDA {axes.pop('cuda')}")
    for axis, value in sorted(axes.items()):
        if (axis, value) in _QUIET:
            continue
        if axis == "resolution":
            parts.append("resolved as of its release" if value == "as-released" else f"resolved {value}")
        else:
            parts.append(f"{axis.replace('_', ' ')} {value}")
    parts.append(str(row.mode))
    return " · ".join(parts)


def _reach(row: Row) -> str:
    for line in row.evidence or ():
        if str(line).startswith(MODULE_BUILD):
            return str(line).removeprefix("load: ").split(";")[0]
    return ""


def _rests_on(stack: Stack, row: Row, pieces: Sequence[Piece]) -> str:
    gpu = gpu_label(row)
    parts = []
    if stack.tier == 0:
        figure = f"{stack.tok_s:,.0f} decode tok/s @{stack.concurrency}" if stack.tok_s is not None else "no figures"
        checked = ((row.metrics or {}).get("correctness") or {}).get("summary")
        parts.append(f"served on {gpu}: {figure}" + (f"; {checked}" if checked else ""))
    for piece in pieces:
        if piece.stance == "supports" and piece.kind == "sibling":
            card = gpu_name(piece.matrix, piece.gpu)
            parts.append(f"{row.mode} served on {card} with {piece.release} (cell {piece.source})")
    if stack.tier >= 2 or stack.tier == 1:
        reach = _reach(row)
        parts.append(f"load pre-flight: {reach}" if reach else "the CPU pre-flights (resolve, import, flags, trace)")
    for piece in pieces:
        if piece.stance == "supports" and piece.kind == "nearby":
            parts.append(
                f"{row.mode} served on {gpu_name(piece.matrix, piece.gpu)} with {piece.release}, "
                "the nearest observed release"
            )
    return "; ".join(parts)


def _not_shown(stack: Stack, row: Row) -> str:
    gpu = gpu_label(row)
    if stack.tier == 0:
        correctness = (row.metrics or {}).get("correctness")
        ok = isinstance(correctness, dict) and (correctness.get("result") or {}).get("ok") is True
        return "" if ok or row.mode == "baseline" else "its answers against the baseline's"
    return f"that it starts and serves on {gpu}: no {gpu} has run it; its answers; its speed"


def _settle(stack: Stack, row: Row) -> str:
    if stack.tier == 0:
        return ""
    gpu = gpu_label(row)
    return f"servematrix run {row.matrix} --select id={row.cell_id}  (on {gpu})"


def _causes(failing: Sequence[Neighbour]) -> tuple[Cause, ...]:
    by_class: dict[str, list[Neighbour]] = {}
    for neighbour in failing:
        kind, _, cls = neighbour.verdict.partition(":")
        by_class.setdefault(cls or kind, []).append(neighbour)
    out = []
    for cls, group in by_class.items():
        fixes = Counter("; ".join(n.changes) for n in group if n.nearest)
        fix, fixed = fixes.most_common(1)[0] if fixes else ("no cell of this GPU kind works", 0)
        out.append(Cause(cls=cls, cells=tuple(n.cell_id for n in group), fix=fix, fixed=fixed))
    return tuple(sorted(out, key=lambda c: (-len(c.cells), c.cls)))


def _versus_baseline(row: Row, env: Mapping[str, Row]) -> str | None:
    """The mode's headline speedup over its environment's first mode, as the table shows it."""
    if row.verdict != "pass" or not row.engine:
        return None
    engine = load_engine(row.engine)
    first = next((env[m] for m in engine.modes if m in env), None)
    if first is None or first is row:
        return None
    found = comparison(engine, first, row)
    if found is None or found.headline is None:
        return None
    return f"{speedup_text(found.headline, bold=False)} over {first.mode}"


@functools.cache
def serves_real_model(matrix: str) -> bool:
    """A matrix whose model servematrix does not build (`[model] build`): a real checkpoint, the product's answer.
    The lanes that serve a random or tiny stand-in follow it."""
    try:
        data = tomllib.loads(Path(matrix).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    model = data.get("model")
    return isinstance(model, dict) and not model.get("build")


def matrix_order(matrices: Sequence[str], latest: Mapping[str, str] | None = None) -> list[str]:
    """The product first (a matrix serving a real checkpoint), then the rest, the most recently run first."""
    latest = latest or {}
    by_recent = sorted(matrices, key=lambda m: latest.get(m, ""), reverse=True)
    return sorted(by_recent, key=lambda m: not serves_real_model(m))


def _held_summary(held: Sequence[Stack]) -> list[str]:
    """Held-back cells grouped by the first piece against them: how many, which releases and modes."""
    groups: dict[str, list[Stack]] = {}
    for stack in held:
        groups.setdefault(_against_short(stack.against[0]), []).append(stack)
    lines = []
    for why, group in groups.items():
        which = sorted({f"{_release(s)} {s.mode}" for s in group})
        lines.append(f"{len(group)} open cell(s) ({', '.join(which)}): {why}")
    return lines


def _release(stack: Stack) -> str:
    return stack.release


def _against_short(text: str) -> str:
    return text


def render_text(recommendations: Sequence[Recommendation], rows: Sequence[Row], *, every: bool = False) -> str:
    """The answer first: per matrix (the product first) and GPU kind, the picks, each with what it rests on, what
    has not been shown and the run that would settle it; the cells held back by evidence against them; the failing
    cells by cause with their fix. `every`: every ranked cell, every held one and every failing cell."""
    shown = {r.cell_id: r for r in apply_evidence(rows)}
    latest: dict[str, str] = {}
    for row in rows:
        latest[str(row.matrix)] = max(latest.get(str(row.matrix), ""), str(row.finished_at or ""))
    order = {m: i for i, m in enumerate(matrix_order(sorted(latest), latest))}
    lines = []
    for rec in sorted(recommendations, key=lambda r: (order.get(r.matrix, len(order)), r.gpu)):
        lines.append(f"{gpu_name(rec.matrix, rec.gpu)} ({rec.gpu}, {rec.matrix}):")
        picks = rec.stacks if every else rec.picks
        if not picks:
            lines.append("  nothing is expected to work yet")
        elif not rec.stacks:
            lines.append("  every cell that is not failing has evidence against it: the best of them, at risk")
        for rank, stack in enumerate(picks, 1):
            lines.append(f"  {rank}. {stack.words}  [{TIERS[stack.tier]}]")
            if stack.against:
                lines.append(f"     at risk: {'; '.join(stack.against)}")
            if stack.tier == 0:
                figure = _stack_figures(stack)
                lines.append(f"     rests on: {stack.rests_on}" + (f"; {figure}" if figure else ""))
            else:
                lines.append(f"     rests on: {stack.rests_on}")
            if stack.not_shown:
                lines.append(f"     not shown: {stack.not_shown}")
            if stack.settle:
                lines.append(f"     settle it: {stack.settle}")
        if rec.held and rec.stacks:
            lines.append("  held back (evidence against them):")
            if every:
                lines += [f"    - {s.words}: {'; '.join(s.against)}" for s in rec.held]
            else:
                lines += [f"    - {line}" for line in _held_summary(rec.held)]
        if rec.undecided:
            lines.append("  not decided here (the check could not run):")
            lines += [f"    - {line}" for line in _undecided_summary(rec.undecided)]
        if rec.failing:
            lines.append(f"  failing: {len(rec.failing)} cell(s), by cause -> the nearest fix")
            for cause in rec.causes:
                share = "" if cause.fixed == len(cause.cells) else f" ({cause.fixed} of them)"
                lines.append(f"    - {cause.cls}: {len(cause.cells)} -> {cause.fix}{share}")
            if every:
                for neighbour in rec.failing:
                    row = shown[neighbour.cell_id]
                    fix = "; ".join(neighbour.changes) if neighbour.nearest else "no cell of this GPU kind works"
                    lines.append(f"      {stack_words(row)}: {neighbour.verdict} -> {fix}")
    return "\n".join(lines)


def _stack_figures(stack: Stack) -> str:
    figure = f"TTFT {stack.ttft_ms:,.1f} ms @{stack.ttft_concurrency}" if stack.ttft_ms is not None else ""
    if stack.versus_baseline:
        figure += ("; " if figure else "") + stack.versus_baseline
    return figure


def render_markdown(rows: Sequence[Row]) -> str:
    """The docs' lead, the answer first: per matrix (the product first) and GPU kind, the picks with what each
    rests on; the held-back and failing cells folded."""
    from servematrix.report.escape import code, text

    rows = apply_evidence(rows)
    recs = recommend(rows)
    latest: dict[str, str] = {}
    for row in rows:
        latest[str(row.matrix)] = max(latest.get(str(row.matrix), ""), str(row.finished_at or ""))
    lines = ["## Recommendation\n"]
    lanes_open = False
    for matrix in matrix_order(sorted(latest), latest):
        if not serves_real_model(matrix) and not lanes_open:
            lines.append(
                '<details markdown="1"><summary>The GPU lanes (a stand-in model on the GPUs lent here): their picks'
                "</summary>\n"
            )
            lanes_open = True
        for rec in (r for r in recs if r.matrix == matrix):
            lines.append(f"**{text(rec.matrix)}, {text(gpu_name(rec.matrix, rec.gpu))}**\n")
            if not rec.picks:
                lines.append("- nothing is expected to work yet\n")
            elif not rec.stacks:
                lines.append("Every cell that is not failing has evidence against it: the best of them, at risk.\n")
            for rank, stack in enumerate(rec.picks, 1):
                lines.append(f"{rank}. **{text(stack.words)}** ({code(stack.cell_id)}, {text(TIERS[stack.tier])})")
                if stack.against:
                    lines.append(f"    - at risk: {text('; '.join(stack.against))}")
                figure = _stack_figures(stack) if stack.tier == 0 else ""
                lines.append(f"    - rests on: {text(stack.rests_on + ('; ' + figure if figure else ''))}")
                if stack.not_shown:
                    lines.append(f"    - not shown: {text(stack.not_shown)}")
                if stack.settle:
                    lines.append(f"    - settle it: {code(stack.settle)}")
            folded = []
            if rec.held:
                folded.append(f"Held back, evidence against them ({len(rec.held)}):\n")
                folded += [f"- {text(s.words)}: {text('; '.join(s.against))}" for s in rec.held]
                folded.append("")
            if rec.undecided:
                folded.append(f"Not decided here ({len(rec.undecided)}): the check could not run\n")
                folded += [f"- {text(line)}" for line in _undecided_summary(rec.undecided)]
                folded.append("")
            if rec.failing:
                folded.append(f"Failing ({len(rec.failing)}), by cause, and the nearest cell that is not failing:\n")
                for cause in rec.causes:
                    share = "" if cause.fixed == len(cause.cells) else f" ({cause.fixed} of them)"
                    folded.append(f"- {code(cause.cls)}: {len(cause.cells)} → {text(cause.fix + share)}")
                folded.append("")
            if folded:
                lines.append(
                    f'\n<details markdown="1"><summary>{len(rec.held)} held back, {len(rec.failing)} failing'
                    + (f", {len(rec.undecided)} not decided" if rec.undecided else "")
                    + ": why, and the fix</summary>\n"
                )
                lines += folded
                lines.append("</details>\n")
            lines.append("")
    if lanes_open:
        lines.append("</details>\n")
    lines.append(
        "Observed means served and benchmarked on a GPU; the CPU pre-flights (resolve, flags, FP4 trace, import, "
        "load) can rule a stack out but never prove it: only a GPU run does. What a sibling GPU or a public report "
        "adds, and what it never decides, is in [the evidence model](evidence.md).\n"
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
