"""A cell's history on the report: its timeline and figures over time in the HTML table's detail, this
publish's categories at the head of the page and of the Markdown table, with the pre-flight's track record."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

from servematrix.records.history import HistoryCell
from servematrix.report.bisectnote import notes
from servematrix.report.escape import code, text
from servematrix.report.history.record import Advance, verdict_kind
from servematrix.report.history.track import predicted_on, track_record, track_record_markdown
from servematrix.store.rowschema import Row

SHOWN = 8  # a cell's newest entries listed on the page; the feed has all of them
PLOTTED = 30  # a cell's newest entries with figures in its plot


def timeline(cell: HistoryCell | None, row: Row) -> dict[str, Any] | None:
    """What a cell's detail shows of its history: its runs newest first, since when its verdict holds, the
    category of its last run and the bisection notes its row carries."""
    bisected = notes([row])
    if cell is None or not cell.entries:
        if not bisected:
            return None
        # A cell with no history yet but a stored bisection: the same keys, so the page shows the note alone.
        return {
            "entries": [],
            "since": None,
            "first": "",
            "dropped": 0,
            "older": 0,
            "category": None,
            "why": "",
            "bisected": bisected,
        }
    entries = cell.entries
    last = entries[-1]
    shown = []
    for entry in reversed(entries[-SHOWN:]):
        shown.append(
            {
                "date": entry.date or "",
                "last_date": entry.last_date or "",
                "repeats": entry.repeated,
                "run_id": entry.run_id or "",
                "verdict": entry.verdict or "",
                "kind": verdict_kind(str(entry.verdict or "")),
                "on": entry.on or "unknown",
                "inputs": entry.inputs or "not recorded",
                "lock": entry.lock or "",
                "category": entry.category or "",
                "why": entry.why or "",
                "figures": {k: f"{v[1]:,.4g} ({v[0]:,.4g}–{v[2]:,.4g})" for k, v in (entry.figures or {}).items()},
                "lock_changes": [
                    f"{name} {value[0] or '(none)'} → {value[1] or '(none)'}"
                    if isinstance(value, list) and len(value) == 2
                    else f"{value}"
                    for name, value in (entry.lock_changes or {}).items()
                ],
            }
        )
    return {
        "entries": shown,
        "since": cell.since or "",
        "first": cell.first or "",
        "dropped": cell.dropped,
        "older": max(0, len(entries) - SHOWN),  # in the feed, not on the page
        "category": "unchanged" if last.repeated > 1 else last.category or "",
        "why": last.why or "",
        "bisected": bisected,
    }


_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
_LABELS = {"tok_s": "output tok/s", "ttft_ms": "TTFT ms"}


def figures_plot(cell: HistoryCell | None, title: str) -> bytes | None:
    """The figures of a cell over its runs as a small SVG: a panel per kind of figure (output tok/s, TTFT), a
    line per concurrency through the medians, a bar from min to max at each run. None with fewer than two runs
    that measured a figure. Written by hand, not with matplotlib (`plots.py`): a cell's plot is a few kB and
    about a millisecond, where matplotlib's is ~100 kB and ~0.6 s, and a publish draws one per measured cell."""
    measured = [(e, e.figures) for e in (cell.entries if cell is not None else ()) if e.figures][-PLOTTED:]
    if len(measured) < 2:
        return None
    entries = [e for e, _ in measured]
    kinds = [k for k in _LABELS if any(key.startswith(k + "@") for _, found in measured for key in found)]
    width, height, left, top, bottom = 520, 150, 64, 24, 30
    inner_w, inner_h = width - left - 16, height - top - bottom
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height * len(kinds) + 20}" '
        f'font-family="sans-serif" font-size="10">',
        f'<text x="4" y="12" font-size="11">{escape(title)} (median; bars: min–max; a point per run)</text>',
    ]
    step = inner_w / max(1, len(entries) - 1)
    for panel, kind in enumerate(kinds):
        y0 = 20 + panel * height
        keys = sorted(
            {k for _, found in measured for k in found if k.startswith(kind + "@")},
            key=lambda k: int(k.partition("@")[2]),
        )
        values = [v for _, found in measured for k in keys if k in found for v in found[k]]
        high = max(values) * 1.05 or 1.0

        def y(value: float, y0: int = y0, high: float = high) -> float:
            return y0 + top + inner_h * (1 - max(0.0, value) / high)

        parts.append(
            f'<g><line x1="{left}" y1="{y0 + top + inner_h}" x2="{left + inner_w}" y2="{y0 + top + inner_h}" '
            f'stroke="#999"/><line x1="{left}" y1="{y0 + top}" x2="{left}" y2="{y0 + top + inner_h}" stroke="#999"/>'
            f'<text x="{left - 4}" y="{y0 + top + 4}" text-anchor="end">{high:,.4g}</text>'
            f'<text x="{left - 4}" y="{y0 + top + inner_h}" text-anchor="end">0</text>'
            f'<text x="4" y="{y0 + top + inner_h / 2}">{_LABELS[kind]}</text>'
            f'<text x="{left}" y="{y0 + height - 8}">{escape(str(entries[0].date or "")[:10])}</text>'
            f'<text x="{left + inner_w}" y="{y0 + height - 8}" text-anchor="end">'
            f"{escape(str(entries[-1].date or '')[:10])}</text></g>"
        )
        for index, key in enumerate(keys):
            color = _COLORS[index % len(_COLORS)]
            points = [(left + i * step, found[key]) for i, (_, found) in enumerate(measured) if key in found]
            line = " ".join(f"{x:.1f},{y(v[1]):.1f}" for x, v in points)
            parts.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="1.2"/>')
            for x, (low, median, top_) in points:
                parts.append(
                    f'<line x1="{x:.1f}" y1="{y(low):.1f}" x2="{x:.1f}" y2="{y(top_):.1f}" stroke="{color}"/>'
                    f'<circle cx="{x:.1f}" cy="{y(median):.1f}" r="2" fill="{color}"/>'
                )
            parts.append(
                f'<text x="{left + inner_w - 60 * (len(keys) - index)}" y="{y0 + 14}" fill="{color}">'
                f"@{escape(key.partition('@')[2])}</text>"
            )
    parts.append("</svg>")
    return "\n".join(parts).encode()


def history_view(advance: Advance | None, sections: Sequence[dict[str, Any]], rows: Sequence[Row]) -> dict[str, Any]:
    """Each cell view of the HTML page (`site._cell_view`) gets its `history` (its timeline) and
    `history_plot` (its figures over time, a data URI); returned: what the page's head shows of this publish
    (its categories, the cells in the news, the pre-flight's track record)."""
    import base64

    cells = advance.history.cells if advance is not None else {}
    for section in sections:
        for view in section.get("cells", []):
            cell = cells.get(view["id"])
            view["history"] = timeline(cell, Row.of({"evidence": view.get("evidence") or []}))
            svg = figures_plot(cell, f"cell {view['id']} ({view['mode']}): figures over time") if cell else None
            view["history_plot"] = "data:image/svg+xml;base64," + base64.b64encode(svg).decode() if svg else ""
    if advance is None:
        return {}
    found = track_record(advance.history, rows)
    return {
        "summary": advance.summary(),
        "counts": {c: n for c, n in advance.counts().items() if n},
        "lines": advance.lines(),
        "track": found.line(),
        "contradicted": [
            f"{c.cell_id}: predicted {c.predicted.verdict} on {predicted_on(c.predicted)} "
            f"({str(c.predicted.date or '')[:10]}, "
            f"run {c.predicted.run_id}); observed {c.observed.verdict} on {c.observed.on} "
            f"({str(c.observed.date or '')[:10]}, run {c.observed.run_id})"
            for c in found.contradicted
        ],
    }


def history_markdown(advance: Advance | None, rows: Sequence[Row]) -> str:
    """The Markdown table's lines for the history: this publish's categories, the cells in the news, and the
    pre-flight's track record (shown after the recommendation). Empty without a history (a preview)."""
    if advance is None:
        return ""
    lines = [f"**This publish**: {text(advance.summary())}. The feed: `results/history.json`.\n"]
    for category, (cell, why) in (
        (cat, (cell_id, reason))
        for cell_id, (cat, reason) in sorted(advance.categories.items(), key=lambda kv: (kv[1][0], kv[0]))
        if cat not in ("new", "unchanged")
    ):
        lines.append(f"- {text(category)}: {code(cell)}: {text(why)}")
    if len(lines) > 1:
        lines.append("")
    lines.append(track_record_markdown(advance.history, rows))
    return "\n".join(lines)
