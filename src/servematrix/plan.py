"""The plan: the selected, sharded cells of a matrix, and its three printed forms.

`github` is a strategy.matrix for GitHub Actions. A workflow run takes at most 256 jobs, so
environments are grouped into jobs per GPU kind (runner labels differ), each job selecting its share
with `--select gpu=KIND --shard I/N`. Both modes of an environment always share a job and a build.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from servematrix.cells import Cell, expand
from servematrix.redact import redact_cells
from servematrix.select import parse_select, parse_shard, shard
from servematrix.spec import Spec, load_spec

GITHUB_MAX_JOBS = 256


@dataclass(frozen=True, kw_only=True)
class Plan:
    spec: Spec
    cells: tuple[Cell, ...]

    @property
    def environments(self) -> list[str]:
        return list(dict.fromkeys(c.env_id for c in self.cells))


def make_plan(matrix: Path | str, select: Sequence[str] = (), shard_text: str | None = None) -> Plan:
    spec = load_spec(matrix)
    return plan_spec(spec, select, shard_text)


def plan_spec(spec: Spec, select: Sequence[str] = (), shard_text: str | None = None) -> Plan:
    which = parse_shard(shard_text)
    selection = parse_select(select, (*spec.axis_names, "mode", "engine", "env", "id"))
    cells = redact_cells((c for c in expand(spec) if selection(c, spec.engine.pins)), spec)
    return Plan(spec=spec, cells=tuple(shard(cells, which)))


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


def print_table(plan: Plan, console: Console | None = None) -> None:
    console = console or Console()
    spec = plan.spec
    table = Table(title=f"{spec.path}  ({len(plan.cells)} cells, {len(plan.environments)} environments)")
    table.add_column("id", style="dim", no_wrap=True, min_width=12)
    table.add_column("env", style="dim", no_wrap=True, min_width=12)
    for axis in spec.axis_names:
        table.add_column(axis)
    table.add_column("mode")
    table.add_column("command / reason", overflow="fold")
    for cell in plan.cells:
        axes = [_shown(cell, axis, spec) for axis in spec.axis_names]
        what = (
            " ".join(cell.command[len(spec.engine.launch_argv(cell.env.version)) :])
            if cell.applicable
            else (f"[yellow]not applicable: {cell.reason}[/]")
        )
        table.add_row(cell.id, cell.env_id, *axes, cell.mode, what)
    console.print(table)


def _shown(cell: Cell, axis: str, spec: Spec) -> str:
    value = cell.env.axes[axis]
    pin = cell.env.effective(axis, spec.engine.pins)
    return f"pinned ({pin})" if value == "pinned" and pin else value
