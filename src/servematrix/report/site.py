"""The whole published report: the markdown table, the static HTML page, the SVG plots, one page per failure
class, and the JSON record of the results that the next run is compared with.

    build_report(rows, Path("docs"), baseline=Path("docs/results/latest.json"))

The HTML page is one self-contained file (inline CSS and JS, plots as data URIs), so it works opened from
disk with no server and no network. Its table sorts by any column and filters by axis, mode and verdict;
the filters are also read from the page's query string (`compatibility.html?mode=piecewise&verdict=fail`),
so a filtered view can be linked. Failure classes are explained in the page itself; the docs site has a
page per class (`failures/<class>.md`).

Every field of a row is escaped where it lands: Jinja's autoescape on the HTML page, `report.escape` on the
Markdown pages (their templates' every `{{ }}` goes through it), matplotlib in the SVGs. Rows may come from
any merged store, and mkdocs passes raw HTML in Markdown through.
"""

from __future__ import annotations

import base64
import contextlib
import io
import re
import shlex
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import markupsafe

from servematrix.classify import Signature, load_signatures
from servematrix.classify.fixes import package_fixes
from servematrix.config.spec import load_spec
from servematrix.engines import Engine, available_engines, load_engine
from servematrix.errors import InputError
from servematrix.evidence import apply as apply_evidence
from servematrix.evidence.derive import gpu_name
from servematrix.planning.cells import expand
from servematrix.report import escape, markdown
from servematrix.report.bisectnote import notes as bisection_notes
from servematrix.report.history.page import history_markdown, history_view
from servematrix.report.history.record import Advance
from servematrix.report.markdown import (
    Extras,
    axes_text,
    cell_order,
    deciding_evidence,
    deciding_line,
    failure_class,
    moved_note,
    no_speedup,
    no_speedup_text,
    reproduce,
)
from servematrix.report.owned import own_folder, replace_owned
from servematrix.report.plots import Plot, write_plots
from servematrix.report.recommend import TIERS, matrix_order, nearest_fixes, recommend, serves_real_model
from servematrix.report.regressions import (
    Regression,
    detect_regressions,
    export_results,
    load_export,
    portable_argv,
    spreads,
    write_export,
)
from servematrix.report.rows import PROVENANCE_NOTES, comparison, measured_notes, tok_s, ttft_ms, version_key
from servematrix.store.store import Row
from servematrix.util import atomic_write

MARKDOWN_NAME = "compatibility.md"
HTML_NAME = "compatibility.html"
RESULTS_PATH = Path("results") / "latest.json"
FAILURES_DIR = "failures"
# Verdict kinds in the order the filter offers them; each has a badge style in site.css.
VERDICT_KINDS = ("pass", "fail", "predicted-fail", "unresolvable", "skipped", "error", "interrupted")


@dataclass(frozen=True, kw_only=True)
class ReportResult:
    markdown: Path
    html: Path
    plots: tuple[Path, ...]
    failure_pages: tuple[Path, ...]
    results: Path | None  # the JSON record written for the next comparison; None for a preview
    regressions: tuple[Regression, ...]
    baseline: Path | None  # the record compared with, if there was one
    history: Path | None = None  # the feed (`report.history`), when published
    history_summary: str = ""  # this publish's categories, one line


def build_report(
    rows: Sequence[Row],
    out_dir: Path,
    *,
    baseline: Path | None,
    results: Path | None = None,
    write_record: bool = True,
    title: str = "Compatibility",
    markdown_name: str = MARKDOWN_NAME,
    shown_from: Path | None = None,
    packing: Sequence[str] = (),
    history: Advance | None = None,
) -> ReportResult:
    """Write the report for `rows` under `out_dir`, comparing with the published record at `baseline`.

    `results` is where the new record goes (default `out_dir/results/latest.json`; none at all without
    `write_record`, for a preview that publishes nothing); `markdown_name` names the table's file
    (`servematrix run --report PATH` picks it); `shown_from` is the folder the pages will be read in, when
    they are written elsewhere first (`publish.write_report` stages them). The record may be the baseline itself: the baseline is read
    first, and the record keeps what each cell was compared with, so building the same report twice flags
    the same regressions."""
    previous = load_export(baseline) if baseline is not None else None
    regressions = tuple(detect_regressions(rows, previous))
    # The pages show each cell with the evidence layer applied (a carried failure, an advisory, a sibling GPU's
    # observation); the record, the regressions and the history keep what each cell's own run decided.
    shown = apply_evidence(rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = write_plots(rows, out_dir / "plots")
    classes = failure_classes(shown)
    moved = moved_cells(rows)
    failure_pages = write_failure_pages(classes, shown, out_dir / FAILURES_DIR, table=markdown_name, moved=moved)
    shown_baseline = _shown(baseline, shown_from or out_dir) if baseline is not None and previous is not None else None
    descriptions = matrix_descriptions(rows)
    extras = Extras(
        failure_pages={cls: f"{FAILURES_DIR}/{_page_name(cls)}" for cls in classes},
        regressions=regressions,
        plots={
            matrix: [(p.title, p.path.relative_to(out_dir).as_posix()) for p in plots if p.matrix == matrix]
            for matrix in {p.matrix for p in plots}
        },
        html=HTML_NAME,
        baseline=shown_baseline,
        packing=packing,
        history=history_markdown(history, rows),
        descriptions=descriptions,
        moved=moved,
    )
    md_path = markdown.write(shown, out_dir / markdown_name, title, extras)
    html_path = atomic_write(
        out_dir / HTML_NAME,
        render_html(
            shown,
            title=title,
            plots=plots,
            regressions=regressions,
            baseline=shown_baseline,
            history=history,
            descriptions=descriptions,
            moved=moved,
        ),
    )
    results_path = (
        write_export(export_results(rows, previous=previous), results or out_dir / RESULTS_PATH)
        if write_record
        else None
    )
    return ReportResult(
        markdown=md_path,
        html=html_path,
        plots=tuple(p.path for p in plots),
        failure_pages=tuple(failure_pages),
        results=results_path,
        regressions=regressions,
        baseline=baseline if previous is not None else None,
        history_summary=history.summary() if history is not None else "",
    )


def matrix_descriptions(rows: Sequence[Row]) -> dict[str, str]:
    """Each matrix's `description`, from its file where the report is built (a row names its matrix by the path
    the run was given). A matrix file that is gone or unreadable only loses its line: the rows are the record."""
    found = {}
    for matrix in sorted({row.matrix for row in rows}):
        try:
            description = tomllib.loads(Path(matrix).read_text(encoding="utf-8")).get("description")
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue
        if isinstance(description, str) and description.strip():
            found[matrix] = description.strip()
    return found


def moved_cells(rows: Sequence[Row]) -> dict[str, str | None]:
    """Rows whose matrix, planned where the report is built, no longer has their cell id: the id it gives the
    same axes and mode now (the matrix changed the cell's server argv, variables or install since the run), or None
    where it has no such cell. Their reproduce command selects the new id and says why. A matrix that cannot
    be planned here (gone, invalid, another engine's data) moves nothing: the rows are the record."""
    moved: dict[str, str | None] = {}
    for matrix in sorted({row.matrix for row in rows}):
        try:
            # Expanded from the spec alone (no engine hooks run for a report); its warnings belong to `plan`.
            with contextlib.redirect_stderr(io.StringIO()):
                cells = expand(load_spec(matrix))
        except (InputError, OSError, ValueError):
            continue
        planned = {c.id for c in cells}
        now = {(c.mode, tuple(sorted(c.env.axes.items()))): c.id for c in cells}
        for row in rows:
            if row.matrix == matrix and row.cell_id not in planned:
                moved[row.cell_id] = now.get((row.mode, tuple(sorted(row.axes.items()))))
    return moved


def _shown(path: Path, out_dir: Path) -> str:
    """The baseline as readers see it: relative to the report, else to the project, else its name only (no
    host paths in a page)."""
    for root in (out_dir, Path.cwd()):
        try:
            return path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            continue
    return path.name


def _environment(**options: Any) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("servematrix.report", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        **options,
    )


def _html_environment() -> jinja2.Environment:
    """For the HTML page: every `{{ }}` HTML-escaped (only the page's own CSS and JS are marked safe), and without
    bidirectional controls: a U+202E in a field reversed the page's own text around it."""
    return _environment(autoescape=True, finalize=_no_bidi)


_BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _no_bidi(value: Any) -> Any:
    if isinstance(value, str) and not isinstance(value, markupsafe.Markup) and _BIDI_CONTROLS.search(value):
        return _BIDI_CONTROLS.sub("", value)
    return value


def _markdown_environment() -> jinja2.Environment:
    """For the Markdown pages: every `{{ }}` is escaped as Markdown text unless a filter made it Markdown
    already: `code` (inline code), `markdown` (the project's own signature text), `fragment` (a link part)."""
    env = _environment(autoescape=False, finalize=escape.text)
    env.filters["code"] = escape.code
    env.filters["markdown"] = escape.Markdown
    env.filters["fragment"] = lambda value: escape.Markdown(escape.fragment(value))
    return env


def _asset(name: str) -> str:
    return (resources.files("servematrix.report") / "templates" / name).read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------------ failure pages


@dataclass(frozen=True, kw_only=True)
class FailureClass:
    id: str
    # engine -> its signature of this class; empty for a class the harness assigns without signature data
    signatures: Mapping[str, Signature]

    @property
    def title(self) -> str:
        titles = list(dict.fromkeys(s.title for s in self.signatures.values()))
        return " / ".join(titles) if titles else "Assigned by the harness (no signature data)"


def failure_classes(rows: Sequence[Row] = ()) -> dict[str, FailureClass]:
    """Every class in the signature data of every engine, and every class a row failed with."""
    found: dict[str, dict[str, Signature]] = {}
    for engine in available_engines():
        try:
            signatures = load_signatures(engine)
        except Exception:  # an engine without signature data has no classes to show
            continue
        for signature in signatures:
            found.setdefault(signature.id, {})[engine] = signature
    for row in rows:
        cls = failure_class(str(row.verdict))
        if cls:
            found.setdefault(cls, {})
    return {cls: FailureClass(id=cls, signatures=found[cls]) for cls in sorted(found)}


def _page_name(cls: str) -> str:
    return f"{cls}.md"


def write_failure_pages(
    classes: Mapping[str, FailureClass],
    rows: Sequence[Row],
    out_dir: Path,
    *,
    table: str = MARKDOWN_NAME,
    moved: Mapping[str, str | None] | None = None,  # `moved_cells`
) -> list[Path]:
    """`<class>.md` for every class (explanation and workaround from the signature data, then the cells that
    failed with it) and `index.md`. Pages of classes that no longer exist are removed (those an earlier report
    recorded as its own: `report.owned`)."""
    env = _markdown_environment()
    own_folder(out_dir)
    by_class: dict[str, list[Row]] = {}
    for row in rows:
        cls = failure_class(str(row.verdict))
        if cls:
            by_class.setdefault(cls, []).append(row)
    written = []
    page = env.get_template("failure.md.j2")
    nearest = nearest_fixes(rows)
    for entry in classes.values():
        cells = [
            _failure_cell(row, nearest, moved or {}) for row in sorted(by_class.get(entry.id, []), key=_failure_order)
        ]
        bisected = bisection_notes(by_class.get(entry.id, []))
        pins = _package_pins(by_class.get(entry.id, []))
        text = page.render(cls=entry, cells=cells, html=HTML_NAME, table=table, bisected=bisected, pins=pins)
        written.append(atomic_write(out_dir / _page_name(entry.id), text))
    index = env.get_template("failures-index.md.j2").render(
        classes=list(classes.values()), counts={cls: len(rows) for cls, rows in by_class.items()}
    )
    written.append(atomic_write(out_dir / "index.md", index))
    replace_owned(out_dir, (p.name for p in written))  # only pages an earlier report wrote are removed
    return written


def _package_pins(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Package pins the signature data says fix these cells (`classify.fixes`), each with the cells it fixes."""
    found: dict[str, dict[str, Any]] = {}
    for row in sorted(rows, key=_failure_order):
        for fix in package_fixes(row):
            entry = found.setdefault(fix.text, {"fix": fix, "cells": []})
            entry["cells"].append(row.cell_id)
    return list(found.values())


def _failure_cell(row: Row, nearest: Mapping[str, str], moved: Mapping[str, str | None]) -> dict[str, Any]:
    return {
        "id": row.cell_id,
        "matrix": row.matrix,
        "axes": axes_text(row, _engine_axes(row)),
        "mode": row.mode,
        "verdict": row.verdict,
        "evidence": deciding_evidence(row),
        "nearest": nearest.get(row.cell_id, ""),
        "line": deciding_line(row),
        "reproduce": reproduce(row, moved),
        "moved": moved_note(row, moved),
    }


def _engine_axes(row: Row) -> list[str]:
    engine_axes = load_engine(row.engine).axes
    return [*engine_axes, *sorted(set(row.axes) - {*engine_axes, "gpu"}), "gpu"]


def _failure_order(row: Row) -> tuple[Any, ...]:
    engine = load_engine(row.engine)
    return (row.matrix, cell_order(row, [*engine.axes, "gpu"], engine.modes))


# -------------------------------------------------------------------------------------------------- HTML


def render_html(
    rows: Sequence[Row],
    *,
    title: str = "Compatibility",
    plots: Sequence[Plot] = (),
    regressions: Sequence[Regression] = (),
    baseline: str | None = None,
    history: Advance | None = None,
    descriptions: Mapping[str, str] | None = None,  # matrix -> its description (`matrix_descriptions`)
    moved: Mapping[str, str | None] | None = None,  # `moved_cells`
) -> str:
    classes = failure_classes(rows)
    used = sorted({c for r in rows if (c := failure_class(str(r.verdict)))})
    by_matrix: dict[str, list[Row]] = {}
    for row in rows:
        by_matrix.setdefault(row.matrix, []).append(row)
    sections = [
        {
            **_matrix_view(matrix, group, [p for p in plots if p.matrix == matrix], regressions, moved or {}),
            "description": (descriptions or {}).get(matrix, ""),
        }
        for matrix, group in by_matrix.items()
    ]
    changes = history_view(history, sections, rows)  # each cell's timeline, and this publish's categories
    # The product leads (a matrix serving a real checkpoint), then the matrix just run: the most recently finished
    # first, each with counts of its own.
    order = matrix_order([s["matrix"] for s in sections], {s["matrix"]: s["finished"] for s in sections})
    sections.sort(key=lambda s: order.index(s["matrix"]))
    counts = {kind: sum(1 for r in rows if _kind(r) == kind) for kind in VERDICT_KINDS}
    return (
        _html_environment()
        .get_template("page.html.j2")
        .render(
            title=title,
            sections=sections,
            counts={k: v for k, v in counts.items() if v},
            total=len(rows),
            regressions=[{"text": str(r), **r.to_dict()} for r in regressions],
            baseline=baseline,
            classes=[classes[c] for c in used if c in classes],
            provenance=markdown.provenance(list(rows)).strip() if rows else "",
            answer=answer_view(rows, order),
            changes=changes,
            css=_asset("site.css"),
            js=_asset("site.js"),
        )
    )


def answer_view(rows: Sequence[Row], order: Sequence[str]) -> list[dict[str, Any]]:
    """The page's opening: per matrix (the product first) and GPU kind, the picks with what each rests on, what has
    not been shown and the run that settles it; how many cells are held back or failing, and their causes."""
    out = []
    recs = recommend(rows)
    for matrix in order:
        for rec in (r for r in recs if r.matrix == matrix):
            out.append(
                {
                    "matrix": rec.matrix,
                    "gpu": rec.gpu,
                    "name": gpu_name(rec.matrix, rec.gpu),
                    "product": serves_real_model(rec.matrix),
                    "at_risk_only": bool(rec.picks) and not rec.stacks,
                    "picks": [
                        {
                            "cell": s.cell_id,
                            "words": s.words,
                            "tier": TIERS[s.tier],
                            "rests_on": s.rests_on,
                            "not_shown": s.not_shown,
                            "settle": s.settle,
                            "against": list(s.against),
                        }
                        for s in rec.picks
                    ],
                    "held": len(rec.held),
                    "failing": len(rec.failing),
                    "causes": [
                        {"cls": c.cls, "count": len(c.cells), "fix": c.fix, "fixed": c.fixed} for c in rec.causes
                    ],
                }
            )
    return out


def _kind(row: Row) -> str:
    return str(row.verdict or "").partition(":")[0]


def prediction(row: Row) -> dict[str, str] | None:
    """Predicted against observed, from what the row carries: a `prediction` field (a verdict string) when
    the store has one, else a `predicted-fail:*` verdict. The observed outcome is a pass or fail verdict."""
    predicted = row.prediction
    if not predicted and _kind(row) == "predicted-fail":
        predicted = str(row.verdict)
    observed = str(row.verdict) if _kind(row) in ("pass", "fail") else None
    if not predicted and not observed:
        return None
    if predicted and observed:
        agrees = predicted.partition(":")[0].removeprefix("predicted-") == observed.partition(":")[0]
        status = "confirmed" if agrees else "missed"
    else:
        status = "predicted" if predicted else "observed"
    return {"predicted": predicted or "", "observed": observed or "", "status": status}


def _matrix_view(
    matrix: str,
    rows: list[Row],
    plots: Sequence[Plot],
    regressions: Sequence[Regression],
    moved: Mapping[str, str | None],
) -> dict:
    engine = load_engine(rows[0].engine)
    modes = [m for m in engine.modes if any(r.mode == m for r in rows)]
    axes = [*engine.axes, "gpu"]
    concurrencies = sorted({c for r in rows for c in tok_s(r)})
    envs: dict[str, dict[str, Row]] = {}
    for row in rows:
        envs.setdefault(row.env_id, {})[row.mode] = row
    cells = []
    for row in sorted(
        rows,
        key=lambda r: (
            [version_key(str(r.axes.get(a))) for a in axes],
            modes.index(r.mode) if r.mode in modes else 99,
        ),
    ):
        cells.append(_cell_view(engine, row, axes, concurrencies, modes, envs[row.env_id], regressions, moved))
    return {
        "matrix": matrix,
        "slug": Path(matrix).stem,
        "engine": engine.name,
        "axes": axes,
        "axis_values": {a: sorted({str(r.axes.get(a)) for r in rows}, key=version_key) for a in axes},
        "modes": modes,
        "verdicts": [k for k in VERDICT_KINDS if any(_kind(r) == k for r in rows)],
        "counts": {k: n for k in VERDICT_KINDS if (n := sum(1 for r in rows if _kind(r) == k))},
        "finished": max((str(r.finished_at or "") for r in rows), default=""),
        "concurrencies": concurrencies,
        "ttft_levels": sorted({c for r in rows for c in ttft_ms(r)}),
        "second_mode": modes[1] if len(modes) > 1 else None,
        "first_mode": modes[0] if modes else None,
        "cells": cells,
        "plots": [{"title": p.title, "kind": p.kind, "src": _data_uri(p.path)} for p in plots],
    }


def _cell_view(
    engine: Engine,
    row: Row,
    axes: Sequence[str],
    concurrencies: Sequence[int],
    modes: Sequence[str],
    env: Mapping[str, Row],
    regressions: Sequence[Regression],
    moved: Mapping[str, str | None],
) -> dict:
    values = spreads(row.metrics)
    medians = tok_s(row)
    found, why = None, ""
    if len(modes) > 1 and row.mode != modes[0]:
        found = comparison(engine, env.get(modes[0]), row)
        why = "" if found else no_speedup_text(no_speedup(env.get(modes[0]), row), modes[0], row.mode)
    headline = found.headline if found is not None else None
    mine = [r for r in regressions if r.cell_id == row.cell_id]
    slower = {r.concurrency: r for r in mine if r.kind == "throughput"}
    host = row.on_host
    excerpt = (row.excerpt or "").strip()
    return {
        "id": row.cell_id,
        "env_id": row.env_id,
        "axes": {a: str(row.axes.get(a, "")) for a in axes},
        "crossed": sorted(row.crossed_pins or {}),
        "mode": row.mode,
        "verdict": str(row.verdict),
        "kind": _kind(row),
        "cls": failure_class(str(row.verdict)),
        # What decided it and the evidence layer's pieces, inline; provenance and long lists (a bundle's dozens of
        # package differences from the lock) folded behind a toggle.
        "evidence": (lead := _evidence_lead(row)),
        "evidence_more": [str(e) for e in row.evidence or [] if str(e) not in lead],
        "pieces": [p for p in row.evidence_model or [] if isinstance(p, dict)],
        "own_verdict": str(row.own_verdict or ""),
        "measured": measured_notes(row),
        "prediction": prediction(row),
        "tok_s": [
            {
                "concurrency": c,
                "median": medians.get(c),
                "spread": values.get(c),
                "regression": slower[c].reason if c in slower else None,
            }
            for c in concurrencies
        ],
        "speedup": (
            {
                "ratio": headline.ratio,
                "heading": headline.heading,
                "range": headline.range_text,
                "conclusive": not headline.inconclusive,
                "verdict": headline.verdict,
                "others": [f"{s.ratio:.2f}× {s.heading} ({s.range_text})" for s in found.others],
            }
            if found is not None and headline is not None
            else None
        ),
        "ttft_ms": ttft_ms(row) if row.verdict == "pass" else {},
        "no_speedup": why,
        "regressions": [str(r.reason) for r in mine],
        "verdict_regression": next((r.reason for r in mine if r.kind == "verdict"), None),
        "reproduce": reproduce(row, moved),
        "moved": moved_note(row, moved),
        "argv": shlex.join(portable_argv(row.argv or [], Path.cwd())) if row.argv else "",
        "lock_hash": row.lock_hash or "",
        "lock_file": row.lock_file or "",
        "image_digest": row.image_digest or "",
        "host": {
            "name": host.hostname or "",
            "cpu": host.cpu or "",
            "cpus": host.cpus or "",
            "os": host.os or "",
            "gpu": host.gpu_sku or "",
            "gpus": len(host.gpus or []),
            "driver": host.driver or "",
        },
        "run_id": row.run_id or "",
        "finished_at": row.finished_at or "",
        "excerpt": excerpt if row.verdict != "pass" else "",
    }


EVIDENCE_INLINE = 3  # evidence lines shown beside a verdict; the rest are folded


_STANCE = {"predicts-fail": "predicts the failure", "at-risk": "at risk", "supports": "supports"}


def _evidence_lead(row: Row) -> list[str]:
    """The lines beside a verdict: the evidence layer's pieces by their headlines, then what decided the verdict;
    never provenance."""
    pieces = {p.get("text"): p for p in row.evidence_model or [] if isinstance(p, dict)}
    lead = []
    for line in (str(e) for e in row.evidence or []):
        piece = pieces.get(line)
        if piece is not None:
            lead.append(f"{_STANCE.get(str(piece.get('stance')), '')}: {piece.get('headline') or line}")
        elif not line.startswith(PROVENANCE_NOTES):
            lead.append(line)
    return lead[:EVIDENCE_INLINE]


def _data_uri(path: Path) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(path.read_bytes()).decode("ascii")
