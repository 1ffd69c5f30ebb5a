"""SVG plots of a matrix's results (matplotlib, Agg): throughput against concurrency, and the speedup heatmap.

The SVGs are deterministic for the same rows (fixed hash salt, no date), so a re-render that changed
nothing changes no file in the docs.
"""

from __future__ import annotations

import hashlib
import io
import statistics
import textwrap
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.colors import TwoSlopeNorm

from servematrix.engines import Engine, load_engine
from servematrix.report.escape import slug
from servematrix.report.markdown import NO_SPEEDUP, headline_heading, no_speedup, no_speedup_text
from servematrix.report.owned import own_folder, replace_owned
from servematrix.report.regressions import spreads
from servematrix.report.rows import comparison, version_key
from servematrix.store.store import Row
from servematrix.util import atomic_write

MODE_STYLES = ("-", "--", ":", "-.")
# How a square without a speedup looks, per `markdown.NO_SPEEDUP` status: (face, hatch, edge). Observed
# failures red and hatched; CPU-only predictions lighter, dotted, with a lighter edge, so they never read
# as observed; environments that cannot be installed grey; what the host could not run or the version does
# not have pale and plain; what was not run blank.
SQUARE_STYLES: dict[str, tuple[str, str | None, str]] = {
    "second-fails": ("#f4c7c3", "//", "#999999"),
    "both-fail": ("#e3aaa4", "xx", "#999999"),
    "first-fails": ("#f4c7c3", "\\\\", "#999999"),
    "predicted": ("#fcefed", "..", "#cccccc"),
    "first-predicted": ("#fcefed", "..", "#cccccc"),
    "unresolvable": ("#d9d9d9", "--", "#999999"),
    "error": ("#fff3cd", None, "#999999"),
    "interrupted": ("#fff3cd", "..", "#999999"),
    "not-measured": ("#ffffff", None, "#999999"),
    "no-gpu": ("#eaf0f8", None, "#999999"),
    "not-applicable": ("#eeeeee", None, "#999999"),
    "skipped": ("#eeeeee", None, "#999999"),
    "no-first": ("#ffffff", None, "#999999"),
    "not-run": ("#ffffff", None, "#999999"),
}
STYLE: Any = {  # rc parameters (matplotlib types their names as literals)
    "svg.hashsalt": "servematrix",
    "svg.fonttype": "none",
    # Names from the rows (GPU kinds, versions) are text, never mathtext: a `$` must not start a formula.
    "text.parse_math": False,
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


@dataclass(frozen=True, kw_only=True)
class Plot:
    matrix: str
    kind: str  # throughput | speedup
    title: str
    path: Path


def matrix_slug(matrix: str) -> str:
    """The matrix's file stem, fit for a file name and a link (rows may come from any merged store)."""
    return slug(Path(matrix).stem, "matrix")


def plot_stems(matrices: Iterable[str]) -> dict[str, str]:
    """Each matrix's stem for its plot files: its file's stem, unless two matrices share one (`a/glm.toml`,
    `b/glm.toml`); those are named by their whole path, and a hash of it if even that is shared."""
    stems = {m: matrix_slug(m) for m in dict.fromkeys(matrices)}
    shared = Counter(stems.values())
    stems = {m: s if shared[s] == 1 else slug(Path(m).with_suffix("").as_posix(), "matrix") for m, s in stems.items()}
    shared = Counter(stems.values())
    return {m: s if shared[s] == 1 else f"{s}-{hashlib.sha256(m.encode()).hexdigest()[:8]}" for m, s in stems.items()}


def write_plots(rows: Sequence[Row], out_dir: Path) -> list[Plot]:
    """Every plot for every matrix in `rows`, written under `out_dir`; matrices with nothing to draw get none.
    Plots of matrices no longer in the rows (pruned from the published results) are removed."""
    by_matrix: dict[str, list[Row]] = {}
    for row in rows:
        by_matrix.setdefault(row.matrix, []).append(row)
    plots: list[Plot] = []
    own_folder(out_dir)
    stems = plot_stems(by_matrix)
    for matrix, group in by_matrix.items():
        stem = stems[matrix]
        for plot in (throughput_plot(matrix, group, out_dir, stem), *speedup_heatmaps(matrix, group, out_dir, stem)):
            if plot is not None:
                plots.append(plot)
    replace_owned(out_dir, (p.path.name for p in plots))  # only plots an earlier report wrote are removed
    return plots


def _env_label(cells: dict[str, Row], varying: Sequence[str]) -> str:
    axes = next(iter(cells.values())).axes
    return " · ".join(f"{a} {axes[a]}" for a in varying) or "all"


def _environments(rows: Sequence[Row], axes: Sequence[str]) -> tuple[dict[str, dict[str, Row]], list[str]]:
    envs: dict[str, dict[str, Row]] = {}
    for row in rows:
        envs.setdefault(row.env_id, {})[row.mode] = row
    varying = [a for a in axes if len({str(r.axes.get(a)) for r in rows}) > 1] or list(axes[:1])
    ordered = dict(
        sorted(
            envs.items(),
            key=lambda item: [version_key(str(next(iter(item[1].values())).axes.get(a))) for a in axes],
        )
    )
    return ordered, varying


MAX_PANELS = 24  # environments in one throughput figure (issue 38: 1500 panels took 20 minutes)


def throughput_plot(matrix: str, rows: Sequence[Row], out_dir: Path, stem: str | None = None) -> Plot | None:
    """One panel per environment that measured anything (the newest `MAX_PANELS`); one line per mode (median,
    min–max bars)."""
    with plt.rc_context(STYLE):
        return _throughput_plot(matrix, rows, out_dir, stem or matrix_slug(matrix))


def _throughput_plot(matrix: str, rows: Sequence[Row], out_dir: Path, stem: str) -> Plot | None:
    engine = load_engine(rows[0].engine)
    modes = [m for m in engine.modes if any(r.mode == m for r in rows)]
    envs, varying = _environments(rows, [*engine.axes, "gpu"])
    measured = {
        env: cells
        for env, cells in envs.items()
        if any(r.verdict == "pass" and spreads(r.metrics) for r in cells.values())
    }
    if not measured:
        return None
    shown = ""
    if len(measured) > MAX_PANELS:  # a figure's layout grows faster than its panels: the newest, and say so
        shown = f"; the newest {MAX_PANELS} of {len(measured)} environments, the table has every one"
        measured = dict(list(measured.items())[-MAX_PANELS:])
    cols = min(4, len(measured))
    nrows = -(-len(measured) // cols)
    fig, axes_grid = plt.subplots(
        nrows, cols, figsize=(3.2 * cols + 0.4, 2.6 * nrows + 0.8), squeeze=False, layout="constrained"
    )
    for ax in axes_grid.flat[len(measured) :]:
        ax.set_visible(False)
    colors = plt.get_cmap("tab10")
    for ax, (_env, cells) in zip(axes_grid.flat, measured.items(), strict=False):
        for index, mode in enumerate(modes):
            row = cells.get(mode)
            data = spreads(row.metrics) if row is not None and row.verdict == "pass" else {}
            if not data:
                continue
            xs = sorted(data)
            med = [data[c]["median"] for c in xs]
            low = [data[c]["median"] - data[c]["min"] for c in xs]
            high = [data[c]["max"] - data[c]["median"] for c in xs]
            ax.errorbar(
                xs,
                med,
                yerr=[low, high],
                label=mode,
                color=colors(index),
                linestyle=MODE_STYLES[index % len(MODE_STYLES)],
                marker="o",
                markersize=4,
                capsize=3,
            )
        concurrencies = sorted({c for r in cells.values() for c in spreads(r.metrics)})
        if len(concurrencies) > 1 and concurrencies[-1] / max(concurrencies[0], 1) >= 4:
            ax.set_xscale("log", base=2)
        ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.set_title(_env_label(cells, varying), fontsize=8)
        ax.set_xlabel("concurrency")
        ax.set_ylabel("output tok/s")
        ax.grid(alpha=0.3)
    handles, labels = [], []
    for ax in axes_grid.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), frameon=False)
    title = f"{stem}: output tok/s against concurrency"
    fig.suptitle(f"{title}\n(median of repeats; bars: min–max{shown})", fontsize=10)
    path = out_dir / f"{stem}-throughput.svg"
    _save(fig, path)
    return Plot(matrix=matrix, kind="throughput", title=title, path=path)


@dataclass(frozen=True)
class _HeatCell:
    value: float | None
    label: str
    status: str  # value, or a NO_SPEEDUP status


NOT_RUN = _HeatCell(None, "—", "not-run")


def _heat_cell(
    engine: Engine, pairs: list[tuple[Row | None, Row | None]], first_mode: str, second_mode: str
) -> _HeatCell:
    """A square: the median headline speedup of its environments; else why there is none, the most decisive
    reason any of them has (`NO_SPEEDUP` order), with how many of them have it when they differ."""
    found = [comparison(engine, first, second) for first, second in pairs]
    headlines = [c.headline for c in found if c is not None and c.headline is not None]
    if headlines:
        value = statistics.median(h.ratio for h in headlines)
        suffix = f"\n(n={len(headlines)})" if len(headlines) > 1 else ""
        if any(h.unjudged for h in headlines):  # a ratio, not a verdict: the mode's answers were not checked
            suffix += "\nunchecked"
        return _HeatCell(value, f"{value:.2f}×{suffix}", "value")
    statuses = [no_speedup(first, second) for first, second in pairs]
    status = min(statuses, key=list(NO_SPEEDUP).index)
    if status == "not-run":
        return NOT_RUN
    label = textwrap.fill(no_speedup_text(status, first_mode, second_mode), width=11, break_long_words=False)
    count = statuses.count(status)
    if count < len(statuses):
        label += f"\n({count} of {len(statuses)})"
    elif count > 1:
        label += f"\n(n={count})"
    return _HeatCell(None, label, status)


def speedup_heatmaps(matrix: str, rows: Sequence[Row], out_dir: Path, stem: str | None = None) -> list[Plot]:
    """For each mode beyond the first, its headline speedup over the first (the table's) over (engine version)
    × (second axis), one panel per GPU.

    A square holding several environments (other axes vary) shows their median and n. Squares with no
    speedup say why, each reason in its own style (`SQUARE_STYLES`): the mode failed, both did, the first
    did, a CPU-only prediction, unresolvable, a harness error, a run stopped before it decided, no GPU on the host, the mode not in the
    version, or not run. A map with no measured square says so in its title."""
    engine = load_engine(rows[0].engine)
    modes = [m for m in engine.modes if any(r.mode == m for r in rows)]
    if len(modes) < 2 or len(engine.axes) < 2:
        return []
    plots = []
    with plt.rc_context(STYLE):
        for index, mode in enumerate(modes[1:]):
            # The first map keeps the name it had when there was only one (links to it stay valid).
            stem = stem or matrix_slug(matrix)
            name = f"{stem}-speedup.svg" if index == 0 else f"{stem}-{mode}-speedup.svg"
            plot = _speedup_heatmap(engine, matrix, rows, out_dir / name, modes[0], mode, stem)
            if plot is not None:
                plots.append(plot)
    return plots


def _speedup_heatmap(
    engine: Engine, matrix: str, rows: Sequence[Row], path: Path, first_mode: str, second_mode: str, stem: str
) -> Plot | None:
    x_axis = engine.version_axis
    y_axis = engine.heatmap_axis or engine.axes[1]
    envs: dict[str, dict[str, Row]] = {}
    for row in rows:
        envs.setdefault(row.env_id, {})[row.mode] = row
    gpus = sorted({str(r.axes.get("gpu")) for r in rows})
    xs = sorted({str(r.axes[x_axis]) for r in rows}, key=version_key)
    ys = sorted({str(r.axes[y_axis]) for r in rows}, key=version_key)
    grid: dict[tuple[str, str, str], list[tuple[Row | None, Row | None]]] = {}
    for cells in envs.values():
        axes = next(iter(cells.values())).axes
        key = (str(axes.get("gpu")), str(axes[x_axis]), str(axes[y_axis]))
        grid.setdefault(key, []).append((cells.get(first_mode), cells.get(second_mode)))
    heat = {key: _heat_cell(engine, pairs, first_mode, second_mode) for key, pairs in grid.items()}
    values = [c.value for c in heat.values() if c.value is not None]
    low, high = min([*values, 0.9]), max([*values, 1.1])
    norm = TwoSlopeNorm(vmin=min(low, 0.99), vcenter=1.0, vmax=max(high, 1.01))
    cmap = plt.get_cmap("RdYlGn")
    width = max(4.0, 0.9 * len(xs) + 2.2) * len(gpus)
    fig, axes_row = plt.subplots(
        1, len(gpus), figsize=(width, max(2.4, 0.55 * len(ys) + 1.6)), squeeze=False, layout="constrained"
    )
    image = None
    for ax, gpu in zip(axes_row.flat, gpus, strict=True):
        data = [[heat.get((gpu, x, y), NOT_RUN) for x in xs] for y in ys]
        numbers = [[c.value if c.value is not None else float("nan") for c in line] for line in data]
        image = ax.imshow(numbers, cmap=cmap, norm=norm, aspect="auto")
        for yi, line in enumerate(data):
            for xi, cell in enumerate(line):
                if cell.status != "value":
                    face, hatch, edge = SQUARE_STYLES[cell.status]
                    ax.add_patch(
                        plt.Rectangle(
                            (xi - 0.5, yi - 0.5), 1, 1, facecolor=face, edgecolor=edge, hatch=hatch, linewidth=0.5
                        )
                    )
                dark = cell.value is not None and not 0.2 < norm(cell.value) < 0.8
                size = 8 if cell.value is not None else 7
                ax.text(xi, yi, cell.label, ha="center", va="center", fontsize=size, color="white" if dark else "black")
        ax.set_xticks(range(len(xs)), xs, rotation=45 if len(xs) > 6 else 0, ha="right" if len(xs) > 6 else "center")
        ax.set_yticks(range(len(ys)), ys)
        ax.set_xlabel(x_axis)
        ax.set_ylabel(y_axis)
        ax.set_title(f"gpu {gpu}", fontsize=9)
        for spine in ax.spines.values():
            spine.set_visible(False)
    if image is not None and values:
        fig.colorbar(image, ax=list(axes_row.flat), label=f"{second_mode} / {first_mode}", shrink=0.8)
    title = f"{stem}: {second_mode} / {first_mode} speedup"
    envs_of = [{first_mode: first, second_mode: second} for pairs in grid.values() for first, second in pairs]
    measured = headline_heading(engine, second_mode, envs_of, first_mode)
    why = "" if values else "; no square holds a measured speedup (each says why)"
    fig.suptitle(f"{title}\n({measured}{why})", fontsize=10)
    _save(fig, path)
    return Plot(matrix=matrix, kind="speedup", title=title, path=path)


def _save(fig: plt.Figure, path: Path) -> None:
    svg = io.BytesIO()
    fig.savefig(svg, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    atomic_write(path, svg.getvalue())
