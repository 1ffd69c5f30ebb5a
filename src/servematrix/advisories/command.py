"""`servematrix advisories [MATRIX]`: the advisories, and the cells of a matrix each one touches."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servematrix.advisories.match import AdvisoryMatch, facts_for, match
from servematrix.advisories.model import Advisory
from servematrix.planning.plan import Plan


@dataclass(frozen=True, kw_only=True)
class Touched:
    """One advisory and the applicable cells of a plan it touches."""

    advisory: Advisory
    affected: tuple[AdvisoryMatch, ...] = ()
    at_risk: tuple[AdvisoryMatch, ...] = ()
    cell_ids: tuple[tuple[str, str], ...] = ()  # (cell id, status), in plan order

    def to_dict(self, with_cells: bool) -> dict[str, Any]:
        out = self.advisory.to_dict()
        if with_cells:
            out["cells"] = {
                "affected": [cell for cell, status in self.cell_ids if status == "affected"],
                "at_risk": [cell for cell, status in self.cell_ids if status == "at-risk"],
            }
        return out


def touched(advisories: Sequence[Advisory], plan: Plan | None, lock_dir: Path | None) -> list[Touched]:
    """Each advisory with the applicable cells of `plan` it touches (none without a plan)."""
    if plan is None or lock_dir is None:
        return [Touched(advisory=a) for a in advisories]
    found: dict[str, list[tuple[str, AdvisoryMatch]]] = {a.id: [] for a in advisories}
    for cell in plan.cells:
        if not cell.applicable:
            continue
        for hit in match(advisories, facts_for(plan, cell, lock_dir)):
            found[hit.advisory.id].append((cell.id, hit))
    return [
        Touched(
            advisory=a,
            affected=tuple(h for _, h in found[a.id] if h.status == "affected"),
            at_risk=tuple(h for _, h in found[a.id] if h.status == "at-risk"),
            cell_ids=tuple((cell, h.status) for cell, h in found[a.id]),
        )
        for a in advisories
    ]


def render_json(rows: Sequence[Touched], *, with_cells: bool) -> str:
    return json.dumps([row.to_dict(with_cells) for row in rows], indent=2)


def render_table(rows: Sequence[Touched], *, plan: Plan | None) -> str:
    """One block per advisory: id, class, certainty, summary, source, fixed, workaround, and with a plan the
    cells it touches (counts, then ids)."""
    lines: list[str] = []
    applicable = sum(1 for c in plan.cells if c.applicable) if plan is not None else 0
    for row in rows:
        a = row.advisory
        lines.append(f"{a.id}  {a.cls}  ({a.certainty})  {a.summary}")
        lines.append(f"  source: {a.source}")
        lines.append(f"  affects: {'; '.join(p.describe() for p in a.affected)}" + _where(a))
        lines.append(f"  fixed: {a.fixed}")
        lines.append(f"  instead: {a.workaround}")
        if plan is not None:
            lines.append(f"  cells: {len(row.affected)} affected, {len(row.at_risk)} at-risk")
            for status in ("affected", "at-risk"):
                ids = [cell for cell, s in row.cell_ids if s == status]
                if ids:
                    lines.append(f"    {status}: {' '.join(ids)}")
        lines.append("")
    count = f"{len(rows)} advisories"
    if plan is not None:
        hit = {cell for row in rows for cell, _ in row.cell_ids}
        affected = {cell for row in rows for cell, s in row.cell_ids if s == "affected"}
        count += (
            f"; {plan.spec.path}: {len(hit)} of {applicable} applicable cells touched "
            f"({len(affected)} affected by at least one)"
        )
    lines.append(count)
    return "\n".join(lines)


def _where(a: Advisory) -> str:
    parts = []
    if a.gpu_arch:
        parts.append("/".join(a.gpu_arch))
    if a.modes:
        parts.append("mode " + "/".join(a.modes))
    if a.architectures:
        parts.append("/".join(a.architectures))
    parts += [f.replace(" | ", " or ") for f in a.flags]
    parts += [f"env {e}" for e in a.env]
    parts += [f"{x} != {y}" for x, y in a.mismatch]
    return f"; on {', '.join(parts)}" if parts else ""
