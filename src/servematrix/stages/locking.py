"""`servematrix lock`: the resolve stage for every environment of a plan, without running anything."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from rich.console import Console
from rich.table import Table

from servematrix.config.spec import RESOLUTION, TODAY, Spec
from servematrix.planning import cells
from servematrix.planning.plan import Plan
from servematrix.stages.resolve import ResolveOutcome, ResolveRequest, resolve_many


def resolve_request(plan: Plan, env_id: str) -> ResolveRequest:
    spec = plan.spec
    env = next(c.env for c in plan.cells if c.env_id == env_id)
    reqs, overrides = cells.requirements(env, spec.engine, spec.file.packages)
    cuda = spec.file.cuda.get(env.axes.get("cuda", ""))
    return ResolveRequest(
        env_id=env.env_id,
        requirements=reqs,
        overrides=overrides,
        python_version=env.python,
        platform=env.gpu.platform,
        index_url=cuda.index_url if cuda else None,
        extra_index_urls=tuple(cuda.extra_index_urls) if cuda else (),
        axes=resolution_axes(spec, env.axes),
    )


def resolution_axes(spec: Spec, axes: Mapping[str, str]) -> dict[str, str]:
    """The axes that decide what is installed: not a flag axis (a server argument), nor `resolution = today`
    (what a lock without the axis is), so that adding either axis leaves every existing lock as it was."""
    return {k: v for k, v in axes.items() if k not in spec.file.flag_axes and not (k == RESOLUTION and v == TODAY)}


def default_lock_dir(plan: Plan) -> Path:
    return plan.spec.path.parent / "locks"


def print_lock_table(plan: Plan, outcomes: list[ResolveOutcome], console: Console | None = None) -> None:
    table = Table(title=f"locks for {plan.spec.path}")
    for column in ("env", *plan.spec.axis_names, "status", "pins / why"):
        table.add_column(column, overflow="fold")
    main = {plan.spec.engine.axis_package(axis) for axis in plan.spec.engine.axes}  # the version axes' packages
    for outcome in outcomes:
        axes = [str(outcome.axes.get(a, "")) for a in plan.spec.axis_names]
        if outcome.status == "resolved":
            detail = ", ".join(f"{k} {v}" for k, v in sorted(outcome.pins.items()) if k in main)
            detail += "".join(f"  [yellow]crosses {k} pin {v['release_pin']}[/]" for k, v in outcome.crossed.items())
        else:
            detail = _first_cause(outcome.reason)
        colour = {"resolved": "green", "unresolvable": "red"}.get(outcome.status, "yellow")
        table.add_row(outcome.env_id, *axes, f"[{colour}]{outcome.status}[/]", detail)
    (console or Console()).print(table)


def _first_cause(reason: str) -> str:
    """The resolver's first 'Because ...' line says which packages collide; the rest is the chain."""
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    return next((line for line in lines if line.startswith("Because")), lines[-1] if lines else "")


def lock_plan(plan: Plan, out_dir: Path | None = None) -> list[ResolveOutcome]:
    target = out_dir or default_lock_dir(plan)
    return resolve_many([resolve_request(plan, env_id) for env_id in plan.environments], out_dir=target)
