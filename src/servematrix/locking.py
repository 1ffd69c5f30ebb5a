"""`servematrix lock`: the resolve stage for every environment of a plan, without running anything."""

from __future__ import annotations

from pathlib import Path

from servematrix.plan import Plan
from servematrix.stages import build
from servematrix.stages.resolve import ResolveOutcome, ResolveRequest, resolve


def resolve_request(plan: Plan, env_id: str) -> ResolveRequest:
    spec = plan.spec
    env = next(c.env for c in plan.cells if c.env_id == env_id)
    reqs, overrides = build.requirements(env, spec.engine)
    cuda = spec.file.cuda.get(env.axes.get("cuda", ""))
    return ResolveRequest(
        env_id=env.env_id,
        requirements=reqs,
        overrides=overrides,
        python_version=env.python,
        platform=env.gpu.platform,
        index_url=cuda.index_url if cuda else None,
        extra_index_urls=tuple(cuda.extra_index_urls) if cuda else (),
        axes=dict(env.axes),
    )


def default_lock_dir(plan: Plan) -> Path:
    return plan.spec.path.parent / "locks"


def lock_plan(plan: Plan, out_dir: Path | None = None) -> list[ResolveOutcome]:
    target = out_dir or default_lock_dir(plan)
    return [resolve(resolve_request(plan, env_id), out_dir=target) for env_id in plan.environments]
