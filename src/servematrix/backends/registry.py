"""`--backend auto|podman|docker|venv|nix|image|existing`: which backend builds and runs this invocation's
environments.

`auto` takes the first container engine that answers `info` (podman, then docker) and can get the base
image of every environment this run will build (present locally, or pulled now), else a venv. A docker CLI
without a reachable daemon, podman without its runtime, or an engine on a host that reaches no registry is
not a usable backend: a build there would fail and blame the stack for a fault of the host. `image` serves
from the engine's published images (`--image REF`: one image for all) through the first container engine that
answers; it is never chosen by `auto`, which builds.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from servematrix.backends import Backend
from servematrix.backends.container import (
    BASE_IMAGE_ENV,
    EXTRA_CA_ENV,
    TOOLS,
    ContainerBackend,
    targets_from_plan,
)
from servematrix.backends.existing import ExistingBackend
from servematrix.backends.image import ImageBackend
from servematrix.backends.nix import nix_backend
from servematrix.backends.tools import base_image_problem, probe_tool
from servematrix.backends.venv import VenvBackend
from servematrix.errors import InputError
from servematrix.planning.cells import axis_packages

CHOICES = ("auto", "podman", "docker", "venv", "nix", "image", "existing")


def select_backend(
    name: str,
    *,
    workdir: Path,
    plan: Any = None,
    builds: Sequence[str] = (),
    extra_ca_bundle: Path | None = None,
    base_image: str | None = None,
    probe: Callable[[str], str | None] = probe_tool,
    base_check: Callable[[str, str], str | None] = base_image_problem,
    notice: Callable[[str], None] = lambda line: None,
    python: str | None = None,
    image: str | None = None,
) -> Backend:
    """The backend for `--backend NAME`. An explicitly named backend that does not work is an InputError.

    plan: the run's Plan, so a container backend knows each environment's axes, base image and GPU kind.
    builds: the env_ids this run will build (their base images must be obtainable); none for a run
    that builds nothing, such as `--stages resolve` or a GPU matrix on a host without its GPUs.
    extra_ca_bundle / base_image: for image builds; default from SERVEMATRIX_EXTRA_CA_BUNDLE /
    SERVEMATRIX_BASE_IMAGE, else none (the base then comes from the matrix's CUDA kind or the default).
    notice: where auto says, in one line, why it passed over a container engine.
    python: the interpreter of `--backend existing` (default: this one).
    image: `--backend image`'s one image for every environment (default: each one's from the engine data).
    """
    if name not in CHOICES:
        raise InputError(f"--backend {name!r}: unknown backend (choices: {', '.join(CHOICES)})")
    if name == "venv":
        return VenvBackend(workdir / "envs")
    if name == "existing":
        return existing_backend(plan, builds, python)
    if name == "nix":
        return nix_backend(workdir, plan=plan, probe=probe)
    if name == "image":
        return image_backend(workdir, plan, image, probe)
    ca = extra_ca_bundle or _path_from_env(EXTRA_CA_ENV)
    if ca is not None and not ca.is_file():
        raise InputError(f"extra CA bundle {ca} is not a file (from --extra-ca-bundle or {EXTRA_CA_ENV})")
    candidates = TOOLS if name == "auto" else tuple(t for t in TOOLS if t == name)
    for tool in candidates:
        why = probe(tool)
        if why is None:
            backend = ContainerBackend(
                tool,
                workdir / "images",
                targets=targets_from_plan(plan) if plan is not None else None,
                base_image=base_image or os.environ.get(BASE_IMAGE_ENV) or None,
                extra_ca_bundle=ca,
            )
            bases = sorted({backend.base_for(env_id) for env_id in builds})
            why = next((problem for base in bases if (problem := base_check(tool, base)) is not None), None)
            if why is None:
                return backend
            why = f"{why}; set {BASE_IMAGE_ENV} to an image {tool} has (docs/containers.md)"
            if name == "auto":
                notice(f"--backend auto: {tool} works but {why}")
                continue
        if name != "auto":
            raise InputError(f"--backend {name}: {name} is not usable here: {why}")
    return VenvBackend(workdir / "envs")


def existing_backend(plan: Any, builds: Sequence[str], python: str | None) -> ExistingBackend:
    """`--backend existing`: refuse, before anything runs, a cell whose axis versions are not what is installed."""
    backend = ExistingBackend(python)
    if plan is not None:
        envs = {c.env_id: c.env for c in plan.cells}
        backend.refuse_mislabelled(
            (f"environment {env_id} ({' '.join(f'{k}={v}' for k, v in envs[env_id].axes.items())})", package, version)
            for env_id in builds
            for package, version in axis_packages(envs[env_id], plan.spec.engine, plan.spec.file.packages)
        )
    return backend


def image_backend(workdir: Path, plan: Any, image: str | None, probe: Callable[[str], str | None]) -> ImageBackend:
    """`--backend image` through the first container engine that answers `info`; none is bad input."""
    if plan is None:
        raise InputError("--backend image needs a plan: which engine, which releases")
    problems = []
    for tool in TOOLS:
        why = probe(tool)
        if why is None:
            envs = {c.env_id: c.env for c in plan.cells}
            return ImageBackend(
                tool,
                workdir / "images",
                engine=plan.spec.engine,
                targets=targets_from_plan(plan),
                wanted={
                    env_id: axis_packages(env, plan.spec.engine, plan.spec.file.packages)
                    for env_id, env in envs.items()
                },
                image=image,
            )
        problems.append(why)
    raise InputError(f"--backend image needs podman or docker: {'; '.join(problems)}")


def _path_from_env(variable: str) -> Path | None:
    value = os.environ.get(variable, "").strip()
    return Path(value) if value else None
