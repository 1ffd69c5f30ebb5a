"""The plan: the selected, sharded cells of a matrix, and its three printed forms.

`github` is a strategy.matrix for GitHub Actions. A workflow run takes at most 256 jobs, so
environments are grouped into jobs per GPU kind (runner labels differ), each job selecting its share
with `--select gpu=KIND --shard I/N`. Both modes of an environment always share a job and a build.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from servematrix.config.spec import PINNED, RESOLUTION, TODAY, Spec, load_spec
from servematrix.engines.plugins import hooks_of
from servematrix.planning.cells import DEFAULT_MAX_CELLS, expand
from servematrix.planning.selection import parse_select, parse_shard, select_keys, shard
from servematrix.records.cell import Cell
from servematrix.store.redact import redacted_command, spec_secret_flags

GITHUB_MAX_JOBS = 256
PIN_MARK = "*"


@dataclass(frozen=True, kw_only=True)
class Plan:
    spec: Spec
    cells: tuple[Cell, ...]

    @property
    def environments(self) -> list[str]:
        return list(dict.fromkeys(c.env_id for c in self.cells))


def make_plan(
    matrix: Path | str,
    select: Sequence[str] = (),
    shard_text: str | None = None,
    *,
    max_cells: int = DEFAULT_MAX_CELLS,
) -> Plan:
    spec = load_spec(matrix)
    return plan_spec(spec, select, shard_text, max_cells=max_cells)


def plan_spec(
    spec: Spec, select: Sequence[str] = (), shard_text: str | None = None, *, max_cells: int = DEFAULT_MAX_CELLS
) -> Plan:
    """Validate the engine's hooks against its data, --select and --shard; expand (within max_cells), select
    and shard."""
    hooks_of(spec.engine)
    which = parse_shard(shard_text)
    selection = parse_select(select, select_keys(spec))
    cells = redact_cells(selection.apply(expand(spec, max_cells=max_cells), spec.engine.pins), spec)
    return Plan(spec=spec, cells=tuple(shard(cells, which)))


def with_starts(plan: Plan, starts: int) -> Plan:
    """`plan` with `starts` server starts per mode (`run --starts`) in place of its matrix's `[bench] starts`.
    The workload is part of each cell's inputs (`run/runplan.inputs_hash`), so finished cells run again."""
    file = plan.spec.file
    bench = file.bench.model_copy(update={"starts": starts})
    spec = plan.spec.model_copy(update={"file": file.model_copy(update={"bench": bench})})
    return replace(plan, spec=spec)


def plan_json(plan: Plan) -> str:
    return json.dumps([c.to_contract() for c in plan.cells], indent=2)


def github_matrix(plan: Plan, max_jobs: int = GITHUB_MAX_JOBS) -> dict[str, Any]:
    """`{"include": [...]}` with one entry per job, at most max_jobs entries."""
    by_gpu: dict[str, list[str]] = {}
    for cell in plan.cells:
        envs = by_gpu.setdefault(cell.env.axes["gpu"], [])
        if cell.env_id not in envs:
            envs.append(cell.env_id)
    if not by_gpu:
        return {"include": []}
    if max_jobs < len(by_gpu):
        raise ValueError(f"--max-jobs {max_jobs} is fewer than the {len(by_gpu)} GPU kinds in the plan")
    total_envs = sum(len(v) for v in by_gpu.values())
    budget = {gpu: max(1, math.floor(max_jobs * len(envs) / total_envs)) for gpu, envs in by_gpu.items()}
    while sum(budget.values()) > max_jobs:
        largest = max(budget, key=lambda g: budget[g])
        budget[largest] -= 1
    cells_per_env: dict[str, int] = {}
    for cell in plan.cells:
        cells_per_env[cell.env_id] = cells_per_env.get(cell.env_id, 0) + 1
    include = []
    for gpu, envs in by_gpu.items():
        kind = plan.spec.file.gpu[gpu]
        jobs = min(budget[gpu], len(envs))
        for index in range(1, jobs + 1):
            # The same round-robin deal as select.shard, so `--select gpu=G --shard I/N` reproduces it.
            mine = envs[index - 1 :: jobs]
            include.append(
                {
                    "name": f"{gpu} {index}/{jobs}",
                    "gpu": gpu,
                    "runs-on": list(kind.runner_labels) or ["self-hosted"],
                    "select": f"gpu={gpu}",
                    "shard": f"{index}/{jobs}",
                    "cells": sum(cells_per_env[e] for e in mine),
                    "environments": len(mine),
                    "timeout-minutes": kind.timeout_minutes,
                }
            )
    return {"include": include}


def narrow_table(title: str | None, headers: Sequence[str], *, min_widths: Mapping[str, int] | None = None) -> Table:
    """A table that stays readable in an 80-column terminal or CI log.

    No border and one space between columns. A value that does not fit folds onto a second line instead
    of being cut off with "…" (rich's default). Give id and verdict columns their full width in
    min_widths so that the other columns fold first. Add cells as `Text`, so that a `[` in a value is
    shown and not read as rich markup.
    """
    table = Table(
        title=Text(title) if title is not None else None,
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=0,
        title_justify="left",
    )
    for header in headers:
        table.add_column(Text(header), overflow="fold", min_width=(min_widths or {}).get(header))
    return table


def print_table(plan: Plan, console: Console | None = None, *, commands: bool = False) -> None:
    """One line per cell. A cell's argv is too long for a table row (hundreds of characters): with
    `commands` it is printed below the table, one cell per paragraph; `--format json` has it too."""
    console = console or Console()
    spec = plan.spec
    # Resolution and flag axes would not fit 80 columns as columns of their own: one `var` (variant) column of
    # letters, each letter a value explained below the table.
    variant_axes = tuple(a for a in spec.axis_names if a == RESOLUTION or a in spec.file.flag_axes)
    shown_axes = tuple(a for a in spec.axis_names if a not in variant_axes)
    variants: dict[str, str] = {}
    headers = ("id", *shown_axes, *(("var",) if variant_axes else ()), "mode", "runs")
    # The title goes above the table: a table's title wraps at the table's width, often narrower.
    console.print(Text(f"{spec.path}: {len(plan.cells)} cells, {len(plan.environments)} environments"))
    table = narrow_table(
        None, headers, min_widths={"id": max((len(c.id) for c in plan.cells), default=2), "runs": len("no [9]")}
    )
    reasons: dict[str, int] = {}
    pinned = False
    for cell in plan.cells:
        axes = [_shown(cell, axis, spec) for axis in shown_axes]
        pinned = pinned or any(value.endswith(PIN_MARK) for value in axes)
        runs = "yes" if cell.applicable else f"no [{reasons.setdefault(cell.reason, len(reasons) + 1)}]"
        if variant_axes:
            tags = [f"{flag} {value}" for flag, value in cell.swept_flags.items()]
            if cell.env.axes.get(RESOLUTION, TODAY) != TODAY:
                tags.append(f"resolved {cell.env.axes[RESOLUTION]}")
            axes.append(",".join(variants.setdefault(tag, chr(ord("a") + len(variants))) for tag in tags) or "-")
        table.add_row(
            *(Text(value) for value in (cell.id, *axes, cell.mode, runs)),
            style=None if cell.applicable else "yellow",
        )
    console.print(table)
    notes = [f"{PIN_MARK} pinned by the {spec.engine.version_axis} release (axis value `pinned`)"] if pinned else []
    notes += [f"var {letter}: {tag}" for tag, letter in variants.items()]
    notes += [f"[{number}] not applicable: {reason}" for reason, number in reasons.items()]
    if commands:
        notes += [f"\n{cell.id}: {shlex.join(cell.command)}" for cell in plan.cells if cell.applicable]
    else:
        notes.append("(each cell's server argv: --commands, or --format json)")
    for note in notes:
        console.print(Text(note), overflow="fold")


def _shown(cell: Cell, axis: str, spec: Spec) -> str:
    """The axis value as shown in the table: `pinned` as the version the release pins, marked."""
    value = cell.env.axes[axis]
    pin = cell.env.effective(axis, spec.engine.pins)
    return f"{pin}{PIN_MARK}" if value == PINNED and pin else value


def redact_cells(cells: Sequence[Cell], spec: Spec) -> list[Cell]:
    """The cells as the plan shows and stores them: their argv masked. The launch rebuilds the real argv."""
    flags = spec_secret_flags(spec)
    out = []
    for cell in cells:
        command = redacted_command(cell.command, flags)
        out.append(cell if command == cell.command else replace(cell, command=command))
    return out
