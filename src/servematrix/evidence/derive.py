"""Every cell's evidence, from the rows and the advisories, and the rows as the report shows them.

    shown = apply(rows)                    # derive(rows) applied: the report's and `recommend`'s rows

A GPU observation is a `pass` or `fail:*` row run on a host with a GPU. It speaks to every row of another GPU
kind whose matrix serves the same model architecture (the first of `architectures` in the matrix's model
config), in the same mode:
- of the same release: a `sibling` piece. A pass supports the cell (ranking only, never a pass); a failure is
  carried (`carry.judge`) and predicts `predicted-fail:<class>`, or, refused, marks the cell at risk;
- of a release the cell's matrix does not hold: a `nearby` piece on the nearest releases it does hold in that
  mode (the one below and the one above): a pass supports, a failure marks at risk, and the piece says the
  cell's own release is not yet observed. Only while it is not: once a GPU (of any kind) observed the cell's
  own release in that mode, for the same architecture, that observation speaks instead and no nearby piece
  is added.
An advisory (`servematrix.advisories`) that matches a cell predicts `predicted-fail:<class>` citing it; one
whose condition may or may not hold marks the cell at risk.

Only an open cell (`skipped:no-gpu`) is shown with a predicted verdict; a verdict the cell's own run reached
(observed on its own GPU kind, or a pre-flight's) is never changed.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from packaging.version import InvalidVersion, Version

from servematrix.advisories import facts_for, load_advisories, match
from servematrix.config.spec import load_spec
from servematrix.errors import InputError
from servematrix.evidence.carry import Rules, judge, load_rules
from servematrix.evidence.model import CellEvidence, Piece
from servematrix.planning.cells import expand
from servematrix.store.store import Row

OPEN = "skipped:no-gpu"
NOT_APPLICABLE = "skipped:not-applicable"
_ERROR_CHARS = 140
# (cell id -> its advisory matches), from the rows: `advisory_matches` by default
Advise = Callable[[Sequence[Row]], Mapping[str, Sequence[Any]]]


def derive(rows: Sequence[Row], *, advise: Advise | None = None, rules: Rules | None = None) -> dict[str, CellEvidence]:
    """cell id -> its evidence and the verdict it is shown with."""
    rules = rules or load_rules()
    pieces: dict[str, list[Piece]] = {r.cell_id: [] for r in rows}
    observed = [r for r in rows if is_observed(r)]
    held = _releases_held(rows)
    # (architecture, engine, mode, release) a GPU observed: a release observed in a mode needs no nearby note
    seen = {(architecture(str(r.matrix)), r.engine, r.mode, release_of(r)) for r in observed}
    for source in observed:
        arch = architecture(str(source.matrix))
        if not arch:
            continue
        release = release_of(source)
        for target in rows:
            if (
                target is source
                or target.mode != source.mode
                or target.axes.get("gpu") == source.axes.get("gpu")
                or architecture(str(target.matrix)) != arch
            ):
                continue
            mine = release_of(target)
            if mine == release:
                pieces[target.cell_id].append(_sibling(source, target, rules))
            elif (
                (arch, target.engine, target.mode, mine) not in seen
                and release not in held.get(str(target.matrix), {}).get(target.mode, ())
                and mine in _nearest(release, held.get(str(target.matrix), {}).get(target.mode, ()))
            ):
                pieces[target.cell_id].append(_nearby(source, target))
    not_applicable = {r.cell_id for r in rows if str(r.verdict or "") == NOT_APPLICABLE}
    for cell_id, matches in (advise if advise is not None else advisory_matches)(rows).items():
        if cell_id in pieces and cell_id not in not_applicable:  # a mode the release lacks: nothing to warn of
            pieces[cell_id] += [_advisory(m) for m in matches]
    out = {}
    for row in rows:
        found = _ordered(pieces[row.cell_id])
        own = str(row.verdict or "")
        verdict = own
        predicting = next((p for p in found if p.stance == "predicts-fail" and p.cls), None)
        if own == OPEN and predicting is not None:
            verdict = f"predicted-fail:{predicting.cls}"
        out[row.cell_id] = CellEvidence(cell_id=row.cell_id, own_verdict=own, verdict=verdict, pieces=found)
    return out


def apply(rows: Sequence[Row], derived: Mapping[str, CellEvidence] | None = None) -> list[Row]:
    """The rows as the report shows them: each a copy with its shown verdict, its pieces' lines first in its
    evidence, `evidence_model` (its pieces, as dicts) and, where the verdict was derived, `own_verdict`. Rows
    that carry `evidence_model` already are returned as they are (applied once)."""
    rows = [r if isinstance(r, Row) else Row.of(r) for r in rows]  # a caller's mappings (tests) become rows
    if rows and all(r.evidence_model is not None for r in rows):
        return rows
    derived = derived if derived is not None else derive(rows)
    out: list[Row] = []
    for row in rows:
        found = derived.get(row.cell_id)
        shown = dict(row.values)
        shown["evidence_model"] = [p.to_dict() for p in found.pieces] if found else []
        if found is not None:
            shown["evidence"] = [p.text for p in found.pieces] + list(row.evidence or [])
            if found.changed:
                shown["verdict"] = found.verdict
                shown["own_verdict"] = found.own_verdict
        out.append(Row.of(shown))
    return out


def pieces_of(row: Row) -> tuple[Piece, ...]:
    """An applied row's pieces (`apply`), as `Piece`s again."""
    return tuple(Piece(**{**p, "frames": tuple(p.get("frames") or ())}) for p in row.evidence_model or () if p)


def is_observed(row: Row) -> bool:
    """Served on a GPU: a pass, or a failure, of a run on a host with a GPU (not a CPU pre-flight's verdict)."""
    verdict = str(row.verdict or "")
    host = row.host or {}
    return (verdict == "pass" or verdict.startswith("fail:")) and bool(host.get("gpus") or host.get("gpu_sku"))


def release_of(row: Row) -> str:
    """The engine's release: the axis named after the engine (`sglang`)."""
    return str(row.axes.get(str(row.engine or ""), ""))


def gpu_label(row: Row) -> str:
    """The GPU kind of a row as a reader knows it (`gpu_name`)."""
    return gpu_name(str(row.matrix or ""), str(row.axes.get("gpu", "")))


@functools.cache
def gpu_name(matrix: str, kind: str) -> str:
    """A GPU kind's card: its `sku` in the matrix (`[gpu.<kind>] sku`, "NVIDIA RTX PRO 6000 Blackwell"), with
    `×<count>` where another kind of the matrix names the same card (`h200` and `h200x2`); the kind's name where
    the matrix names no card or cannot be read here."""
    try:
        kinds = tomllib.loads(Path(matrix).read_text(encoding="utf-8")).get("gpu") or {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return kind
    mine = kinds.get(kind) if isinstance(kinds, dict) else None
    if not isinstance(mine, dict) or not isinstance(mine.get("sku"), str) or not mine["sku"].strip():
        return kind
    sku = mine["sku"]
    shared = [k for k, v in kinds.items() if k != kind and isinstance(v, dict) and v.get("sku") == sku]
    count = mine.get("count")
    return f"{sku} ×{count}" if shared and isinstance(count, int) and count > 1 else sku


@functools.cache
def architecture(matrix: str) -> str:
    """The model architecture a matrix serves: its `[model] config_dir`'s config.json `architectures[0]`, read where
    the report is built. "" where the matrix or its config cannot be read: nothing is carried to or from it."""
    try:
        data = tomllib.loads(Path(matrix).read_text(encoding="utf-8"))
        config_dir = (data.get("model") or {}).get("config_dir")
        if not isinstance(config_dir, str):
            return ""
        config = json.loads((Path(matrix).parent / config_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, json.JSONDecodeError):
        return ""
    found = config.get("architectures") if isinstance(config, dict) else None
    return str(found[0]) if isinstance(found, list) and found else ""


def _version(value: str) -> Version | None:
    try:
        return Version(value)
    except InvalidVersion:
        return None


def _releases_held(rows: Iterable[Row]) -> dict[str, dict[str, set[str]]]:
    """matrix -> mode -> the releases it holds in that mode (a cell the release has: not `not-applicable`)."""
    held: dict[str, dict[str, set[str]]] = {}
    for row in rows:
        if str(row.verdict or "") != NOT_APPLICABLE:
            held.setdefault(str(row.matrix), {}).setdefault(row.mode, set()).add(release_of(row))
    return held


def _nearest(release: str, held: Iterable[str]) -> set[str]:
    """The release just below and the one just above `release` among `held`."""
    mine = _version(release)
    if mine is None:
        return set()
    versions = sorted((v, r) for r in held if (v := _version(r)) is not None)
    below = [r for v, r in versions if v < mine]
    above = [r for v, r in versions if v > mine]
    return {*below[-1:], *above[:1]}


def _short(text: str) -> str:
    return text if len(text) <= _ERROR_CHARS else text[: _ERROR_CHARS - 1] + "…"


def _where(source: Row) -> str:
    return f"cell {source.cell_id}, {source.matrix}"


def _seen(source: Row) -> str:
    engine = str(source.engine or "")
    verb = "served" if source.verdict == "pass" else "failed"
    return f"{source.mode} {verb} on {gpu_label(source)} with {engine} {release_of(source)}".strip()


def _sibling(source: Row, target: Row, rules: Rules) -> Piece:
    common = {
        "kind": "sibling",
        "source": source.cell_id,
        "gpu": str(source.axes.get("gpu", "")),
        "matrix": str(source.matrix),
        "release": release_of(source),
    }
    headline = f"{_seen(source)} (cell {source.cell_id})"
    if source.verdict == "pass":
        return Piece(
            stance="supports",
            text=f"supports: {_seen(source)} ({_where(source)}), {architecture(str(source.matrix))}",
            headline=headline,
            **common,  # type: ignore[arg-type]
        )
    cls = str(source.verdict).partition(":")[2] or None
    found = judge(source, target, rules)
    frames = found.frames[:2]
    at = f" at {'; '.join(frames)}" if frames else ""
    error = f": {_short(found.error)}" if found.error else ""
    if found.rule is not None:
        return Piece(
            stance="predicts-fail",
            cls=cls,
            frames=found.frames,
            rule=found.rule.id,
            headline=f"{headline}, carried (rule {found.rule.id})",
            detail=found.rule.what,
            text=f"carried from {gpu_label(source)}: {_seen(source)} ({_where(source)}){error}{at} "
            f"[rule {found.rule.id}]",
            **common,  # type: ignore[arg-type]
        )
    return Piece(
        stance="at-risk",
        cls=cls,
        frames=found.frames,
        rule=f"not carried: {found.why}",
        headline=f"{headline}, not carried",
        detail=f"not carried: {found.why}",
        text=f"at-risk: {_seen(source)} ({_where(source)}){error}{at}; not carried: {found.why}",
        **common,  # type: ignore[arg-type]
    )


def _nearby(source: Row, target: Row) -> Piece:
    engine = str(source.engine or "")
    unseen = f"{engine} {release_of(target)} not yet observed in {target.mode}"
    common = {
        "kind": "nearby",
        "source": source.cell_id,
        "gpu": str(source.axes.get("gpu", "")),
        "matrix": str(source.matrix),
        "release": release_of(source),
    }
    if source.verdict == "pass":
        return Piece(
            stance="supports",
            text=f"nearby release: {_seen(source)} ({_where(source)}); {unseen}",
            headline=f"{_seen(source)} (cell {source.cell_id}), the nearest observed release",
            **common,  # type: ignore[arg-type]
        )
    frames = _frames(source)
    error = _error(source)
    return Piece(
        stance="at-risk",
        cls=str(source.verdict).partition(":")[2] or None,
        frames=frames,
        text=f"at-risk: {_seen(source)} ({_where(source)}){': ' + _short(error) if error else ''}; {unseen}",
        headline=f"{_seen(source)} (cell {source.cell_id}); {release_of(target)} not yet observed",
        **common,  # type: ignore[arg-type]
    )


def _frames(source: Row) -> tuple[str, ...]:
    from servematrix.evidence.carry import frames_of

    return frames_of(source)


def _error(source: Row) -> str:
    from servematrix.evidence.carry import error_line

    return error_line(source, load_rules())[1]


def _advisory(found: Any) -> Piece:
    """An `AdvisoryMatch` (advisory, status `affected`|`at-risk`, why) as a piece."""
    advisory = found.advisory
    cls = getattr(advisory, "cls", None)
    source = str(getattr(advisory, "source", "") or "")
    affected = found.status == "affected"
    headline = f"advisory {advisory.id} ({cls}): {advisory.summary}"
    detail = [f"matched: {found.why}"] if getattr(found, "why", "") else []
    if getattr(advisory, "fixed", None):
        detail.append(f"fixed in: {advisory.fixed}")
    if getattr(advisory, "workaround", None):
        detail.append(f"instead: {advisory.workaround}")
    return Piece(
        kind="advisory",
        stance="predicts-fail" if affected else "at-risk",
        cls=cls,
        source=str(advisory.id),
        link=source,
        headline=headline,
        detail="; ".join(detail),
        text=f"{'' if affected else 'at-risk: '}{headline} {source}".rstrip(),
    )


_ORDER = {"predicts-fail": 0, "at-risk": 1, "supports": 2}
_KINDS = {"sibling": 0, "advisory": 1, "nearby": 2}


def _ordered(pieces: Iterable[Piece]) -> tuple[Piece, ...]:
    unique = {(p.stance, p.text): p for p in pieces}
    return tuple(sorted(unique.values(), key=lambda p: (_ORDER[p.stance], _KINDS[p.kind], p.text)))


def advisory_matches(rows: Sequence[Row]) -> dict[str, tuple[Any, ...]]:
    """cell id -> the advisories that touch it (`servematrix.advisories`), for the rows whose matrix plans their cell
    here; for a matrix that cannot be planned here, none: the rows are the record."""
    advisories = load_advisories()
    out: dict[str, tuple[Any, ...]] = {}
    for matrix in sorted({str(r.matrix) for r in rows}):
        try:
            # Expanded from the spec alone, as `report.site.moved_cells` does: no engine hooks run for a report,
            # and a plan's warnings belong to `plan`. `facts_for` reads the plan's spec.
            with contextlib.redirect_stderr(io.StringIO()):
                spec = load_spec(matrix)
                plan = SimpleNamespace(spec=spec, cells=tuple(expand(spec)))
        except (InputError, OSError, ValueError):
            continue
        cells = {c.id: c for c in plan.cells}
        lock_dir = Path(matrix).parent / "locks"
        for row in rows:
            cell = cells.get(row.cell_id) if str(row.matrix) == matrix else None
            if cell is None:
                continue
            found = tuple(match(advisories, facts_for(plan, cell, lock_dir)))  # type: ignore[arg-type]
            if found:
                out[row.cell_id] = found
    return out
