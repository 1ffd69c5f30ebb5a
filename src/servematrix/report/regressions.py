"""The published results as JSON, and regressions of a new run against them.

`export_results` turns store rows into the published record (`docs/results/latest.json`): every field the
report shows, nothing local to the machine that ran it (pids, log paths), argv paths made relative to the
project. The report can be rendered again from that file alone (`published_rows`), so the docs build
needs no store.

`detect_regressions` compares a run with that record, cell by cell (cell ids are stable across runs and
machines). Two things count:

- a verdict that flips from `pass` to a failure (`fail:*`, `unresolvable`, `predicted-fail:*`);
- a drop of output tok/s at a concurrency both runs measured, beyond the noise the repeats measured: the new
  best repeat is below the old worst one by more than `margin`, or the median fell by more than the larger
  of the relative spread (max - min) / median of either run and `min_drop`.

A cell whose verdict says nothing about the stack (error, interrupted, skipped) is not compared. The
comparison is kept in the export (`previous`), so rendering the same results twice flags the same cells:
when the record already holds this very run of a cell, the cell is compared with what that run was
compared with.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servematrix.formats.verdict import observed, unserved
from servematrix.records.published import SCHEMA, Previous, PublishedCell, cell_problem
from servematrix.stages import bench
from servematrix.store.redact import bounded_evidence, bounded_excerpt
from servematrix.store.rowschema import COLUMNS, Row, row_problem
from servematrix.util import DEFAULT_WORKDIR, atomic_write

MIN_DROP = 0.10
MARGIN = 0.10
FAILED_KINDS = frozenset({"fail", "unresolvable", "predicted-fail"})
# The row fields the published record keeps, named once by its model (records/published.py): pids, log paths
# and the run's status stay in the store; metrics is exported trimmed; `prediction` is kept when a row has one.
EXPORTED = tuple(c for c in COLUMNS if c in PublishedCell.model_fields and c != "metrics")
LEVEL_FIELDS = (
    "concurrency",
    "output_tok_s",
    "request_s",
    "completion_tokens",
    "error_count",
    "input_tok_s",
    "ttft_mean_s",
)
# What a published repeat keeps: the figures a mode is compared on (bench.compare), and its server start.
RUN_FIELDS = ("repeat", "start", "output_tok_s", "input_tok_s", "ttft", "wall_s", "prompt_tokens")
METRIC_FIELDS = ("model", "duration_s", "completion_tokens", "error_count", "client", "starts")
# Each graph capture's seconds from the server log (run/serving.py), pooled and per server start: the start-up
# cost a mode adds, published beside its figures.
CAPTURE_FIELDS = ("capture_s", "capture_s_by_start")


@dataclass(frozen=True, kw_only=True)
class Regression:
    cell_id: str
    matrix: str
    mode: str
    axes: Mapping[str, str]
    kind: str  # verdict | throughput | ttft
    before: str
    after: str
    concurrency: int | None = None
    drop: float | None = None  # relative drop of the median (throughput only)
    threshold: float | None = None  # the noise-derived threshold it exceeded
    reason: str = ""

    def __str__(self) -> str:
        where = " ".join(f"{k}={v}" for k, v in self.axes.items())
        return f"regression {self.cell_id} ({where} mode={self.mode}): {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "cell_id": self.cell_id,
            "matrix": self.matrix,
            "mode": self.mode,
            "axes": dict(self.axes),
            "kind": self.kind,
            "before": self.before,
            "after": self.after,
            "concurrency": self.concurrency,
            "drop": self.drop,
            "threshold": self.threshold,
            "reason": self.reason,
        }


# ------------------------------------------------------------------------------------------------ export


def export_results(
    rows: Sequence[Row], *, previous: Mapping[str, Any] | None = None, root: Path | None = None
) -> dict[str, Any]:
    """The published record of `rows`. `previous` is the record these rows were compared with, so that the
    comparison survives a re-render; `root` is the directory argv paths are made relative to (default: cwd)."""
    base = Path(os.path.abspath(root or Path.cwd()))
    cells: dict[str, Any] = {}
    for row in sorted(rows, key=lambda r: (r.matrix, r.env_id, r.mode)):
        entry = {key: row.get(key) for key in EXPORTED if key != "prediction" or row.get(key) is not None}
        entry["argv"] = portable_argv(row.argv or [], base)
        if row.lock_file:  # an absolute --lock-dir elsewhere would name the host's folders
            entry["lock_file"] = scrub_host_paths(portable_argv([row.lock_file], base)[0])
        entry["metrics"] = _trim_metrics(row.metrics, base)
        entry["excerpt"] = bounded_excerpt(scrub_host_paths(str(row.excerpt or ""))) or row.excerpt
        entry["evidence"] = [scrub_host_paths(str(e)) for e in bounded_evidence(row.evidence or [])]
        reference = _reference(row, previous)
        entry["previous"] = reference.model_dump(exclude_unset=True) if reference is not None else None
        cells[row.cell_id] = entry
    return {"schema": SCHEMA, "cells": cells}


# An absolute path of a host (a traceback frame, an interpreter): what follows site-packages, or else its last
# three parts, is what a reader needs; the rest names the machine that ran it.
_HOST_PATH = re.compile(r"(?<![\w.~/-])(/(?:[\w.+@-]+/)+)([\w.+@-]+)")


def scrub_host_paths(text: str) -> str:
    """`text` with absolute host paths shortened: `.../site-packages/kernels/layer/layer.py`, `.../py-kernels`."""

    def short(match: re.Match[str]) -> str:
        parts = [*match.group(1).strip("/").split("/"), match.group(2)]
        for marker in ("site-packages", "dist-packages"):
            if marker in parts:
                return ".../" + "/".join(parts[parts.index(marker) :])
        return ".../" + "/".join(parts[-3:] if len(parts) > 3 else parts[-1:])

    return _HOST_PATH.sub(short, text)


def write_export(export: Mapping[str, Any], path: Path) -> Path:
    text = json.dumps(export, indent=1, sort_keys=True, ensure_ascii=False, allow_nan=False)
    return atomic_write(path, text + "\n")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def load_export(path: Path) -> dict[str, Any] | None:
    """The published record at `path`, or None when there is none yet. A malformed file is an error."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constant)
    except RecursionError:  # a record nested thousands deep: no record servematrix writes nests past a few
        raise ValueError(f"{path}: nested too deeply to be a servematrix results export") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("cells"), dict):
        raise ValueError(f"{path}: not a servematrix results export (schema {SCHEMA})")
    for cell, entry in data["cells"].items():  # what a crafted record names reaches pages and file names
        problem = row_problem(entry) if isinstance(entry, dict) else "not a table"
        problem = problem or cell_problem(entry)  # the record's shape, as its model names it
        if problem is None and entry.get("cell_id") != cell:
            problem = f"its cell_id {str(entry.get('cell_id'))[:80]!r} is not its key"
        if problem is not None:
            raise ValueError(f"cell {cell[:80]!r}: {problem}")
    return data


def published_rows(export: Mapping[str, Any]) -> list[Row]:
    """Rows to render the report from when there is no store: the published record itself."""
    rows = []
    for entry in export["cells"].values():
        values = {k: v for k, v in entry.items() if k != "previous"}
        values.setdefault("status", "finished")
        rows.append(Row.of(values))
    return sorted(rows, key=lambda r: (r.env_id, r.mode))


def portable_argv(argv: Iterable[str], root: Path) -> list[str]:
    """argv with absolute paths under `root` made relative, so a published command names no host path; a path
    inside a project's default workdir (a built model) from there, though the run's project was another folder
    than this one (a worktree). Any other absolute path (a container's `/models/glm5`) is kept."""
    out = []
    for arg in argv:
        text = str(arg)
        if os.path.isabs(text):
            # Not resolved: a symlinked model directory is named as the run named it.
            path = Path(os.path.normpath(text))
            if path.is_relative_to(root):
                text = path.relative_to(root).as_posix()
            elif DEFAULT_WORKDIR.name in path.parts[:-1]:
                text = Path(*path.parts[path.parts.index(DEFAULT_WORKDIR.name) :]).as_posix()
        out.append(text)
    return out


def _trim_metrics(metrics: Mapping[str, Any] | None, root: Path) -> dict[str, Any] | None:
    if not metrics:
        return None
    trimmed: dict[str, Any] = {k: metrics[k] for k in METRIC_FIELDS if k in metrics}
    if isinstance(trimmed.get("model"), str):  # the request's model field: a local path for transformers serve
        trimmed["model"] = portable_argv([trimmed["model"]], root)[0]
    trimmed["workload"] = metrics.get("workload")
    trimmed["levels"] = [
        {
            **{k: level.get(k) for k in LEVEL_FIELDS},
            "runs": [{k: run.get(k) for k in RUN_FIELDS if k in run} for run in level.get("runs", [])],
        }
        for level in metrics.get("levels", [])
    ]
    for profile in bench.NESTED_PROFILES:  # the decode profile is the record itself
        nested = metrics.get(profile)
        if isinstance(nested, Mapping):
            trimmed[profile] = _trim_metrics(nested, root)
    checked = metrics.get("correctness")
    if isinstance(checked, Mapping):  # its verdict is published; the answers themselves stay in the store
        trimmed["correctness"] = {k: v for k, v in checked.items() if k != "answers"}
    for key in CAPTURE_FIELDS:
        if key in metrics:
            trimmed[key] = metrics[key]
    return trimmed


def _summary(entry: Mapping[str, Any]) -> Previous:
    """What a comparison needs of a published cell: its run, verdict and figure spreads. A summary carried over
    from an earlier render is kept as it was written (unvalidated: it was read with the record)."""
    if "tok_s" in entry:  # already a summary
        return Previous.model_construct(**entry)
    cell = PublishedCell.model_construct(**entry)
    return Previous.model_construct(
        run_id=cell.run_id,
        finished_at=cell.finished_at,
        verdict=cell.verdict,
        tok_s={str(c): s for c, s in spreads(cell.metrics).items()},
        ttft_s={str(c): s for c, s in ttft_spreads(cell.metrics).items()},
        workload=workload_of(cell.metrics),
    )


def workload_of(result: Row | Previous | Mapping[str, Any] | None) -> Any:
    """The benchmark workload a row, a comparison summary or a bench report was measured with, or None where it
    is not recorded (an older record)."""
    if isinstance(result, Previous):
        return result.workload
    metrics = result.metrics if isinstance(result, Row) else result
    return metrics.get("workload") if isinstance(metrics, Mapping) else None


def same_workload(a: Row | Previous, b: Row | Previous) -> bool:
    """Whether two results were measured alike: two matrices that differ only in their workload share cell
    ids, and one's figures are never the other's regression. Unknown on either side counts as alike."""
    first, second = workload_of(a), workload_of(b)
    return first is None or second is None or first == second


# ------------------------------------------------------------------------------------------- comparison


def spreads(metrics: Mapping[str, Any] | None) -> dict[int, dict[str, float]]:
    """Output tok/s {min, median, max} over the repeats, per concurrency level that produced tokens."""
    out: dict[int, dict[str, float]] = {}
    for level in (metrics or {}).get("levels", []):
        spread = level.get("output_tok_s") or {}
        if level.get("completion_tokens") and all(
            isinstance(spread.get(k), int | float) for k in ("min", "median", "max")
        ):
            out[int(level["concurrency"])] = {k: float(spread[k]) for k in ("min", "median", "max")}
    return out


def ttft_spreads(metrics: Mapping[str, Any] | None) -> dict[int, dict[str, float]]:
    """The prefill profile's TTFT {min, median, max} (s) over the repeats' means, per level."""
    prefill = (metrics or {}).get("prefill")
    out: dict[int, dict[str, float]] = {}
    for level in prefill.get("levels", []) if isinstance(prefill, Mapping) else []:
        spread = level.get("ttft_mean_s") or {}
        if all(isinstance(spread.get(k), int | float) for k in ("min", "median", "max")):
            out[int(level["concurrency"])] = {k: float(spread[k]) for k in ("min", "median", "max")}
    return out


def _reference(row: Row, previous: Mapping[str, Any] | None) -> Previous | None:
    """What this row is compared with, summarised: the published cell, or, when the record already holds this
    very run, what that run was compared with."""
    if not previous:
        return None
    entry = previous.get("cells", {}).get(row.cell_id)
    if entry is None:
        return None
    if PublishedCell.model_construct(**entry).run_id == row.run_id:
        carried = PublishedCell.model_construct(**entry).previous
        return _summary(carried) if isinstance(carried, Mapping) and carried else None
    return _summary(entry)


def _reference_spreads(reference: Previous, key: str = "tok_s") -> dict[int, dict[str, float]]:
    return {int(c): dict(s) for c, s in (getattr(reference, key) or {}).items()}


def _kind(verdict: str | None) -> str:
    return (verdict or "").partition(":")[0]


def _noise(spread: Mapping[str, float]) -> float:
    return (spread["max"] - spread["min"]) / spread["median"] if spread["median"] > 0 else 0.0


def detect_regressions(
    current_rows: Sequence[Row],
    previous_export: Mapping[str, Any] | None,
    *,
    min_drop: float = MIN_DROP,
    margin: float = MARGIN,
) -> list[Regression]:
    found: list[Regression] = []
    for row in current_rows:
        reference = _reference(row, previous_export)
        if reference is None:
            continue
        before, after = str(reference.verdict or ""), str(row.verdict or "")
        common: dict[str, Any] = {
            "cell_id": row.cell_id,
            "matrix": row.matrix,
            "mode": row.mode,
            "axes": dict(row.axes),
        }
        if observed(before) and unserved(after):
            continue  # like with like: a verdict reached without serving never regresses what a GPU run observed
        if not same_workload(reference, row):
            continue  # another workload (another matrix's cell of the same id): not a comparison
        if _kind(before) == "pass" and _kind(after) in FAILED_KINDS:
            found.append(
                Regression(**common, kind="verdict", before=before, after=after, reason=f"verdict {before} -> {after}")
            )
            continue
        if _kind(before) != "pass" or _kind(after) != "pass":
            continue
        limits = {"min_drop": min_drop, "margin": margin}
        found += _drops(common, _reference_spreads(reference), spreads(row.metrics), kind="throughput", **limits)
        found += _drops(common, _reference_spreads(reference, "ttft_s"), ttft_spreads(row.metrics), kind="ttft",
                        **limits)  # fmt: skip
    return found


def _drops(
    common: Mapping[str, Any],
    old: Mapping[int, Mapping[str, float]],
    new: Mapping[int, Mapping[str, float]],
    *,
    kind: str,
    min_drop: float,
    margin: float,
) -> list[Regression]:
    """Each level whose figure got worse beyond the noise its repeats measured: its median fell by more than
    the larger of `min_drop` and either run's spread, or its best repeat fell `margin` below the old worst. A
    time (kind "ttft", the prefill profile's) is compared inverted: a 1.25x longer TTFT is a 20 % drop."""
    time = kind == "ttft"
    found = []
    for concurrency in sorted(set(old) & set(new)):
        a, b = old[concurrency], new[concurrency]
        if (b if time else a)["median"] <= 0:
            continue
        drop = 1 - (a["median"] / b["median"] if time else b["median"] / a["median"])
        threshold = max(_noise(a), _noise(b), min_drop)
        apart = b["min"] * (1 - margin) > a["max"] if time else b["max"] < a["min"] * (1 - margin)
        if not (drop > threshold or apart):
            continue
        if time:
            before, after = f"{a['median'] * 1000:.1f} ms", f"{b['median'] * 1000:.1f} ms"
            why = (
                f"TTFT @{concurrency} {a['median'] * 1000:,.1f} -> {b['median'] * 1000:,.1f} ms "
                f"(-{drop:.0%} in 1/TTFT; noise threshold {threshold:.0%})"
            )
        else:
            before, after = f"{a['median']:.1f}", f"{b['median']:.1f}"
            why = (
                f"output tok/s @{concurrency} {a['median']:,.1f} -> {b['median']:,.1f} "
                f"(-{drop:.0%}; noise threshold {threshold:.0%}"
                + (f"; new max {b['max']:,.1f} < old min {a['min']:,.1f} - {margin:.0%}" if apart else "")
                + ")"
            )
        found.append(
            Regression(
                **common,
                kind=kind,
                before=before,
                after=after,
                concurrency=concurrency,
                drop=round(drop, 4),
                threshold=round(threshold, 4),
                reason=why,
            )
        )
    return found
