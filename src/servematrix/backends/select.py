"""`--backend auto|podman|docker|venv`: which backend builds and runs this invocation's environments.

`auto` takes the first container engine that answers `info` (podman, then docker), else a venv: a docker
CLI without a reachable daemon, or podman without its runtime, is not a usable backend.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servematrix.backends import Backend
from servematrix.backends.container import (
    BASE_IMAGE_ENV,
    EXTRA_CA_ENV,
    TOOLS,
    ContainerBackend,
    Tool,
    targets_from_plan,
)
from servematrix.backends.venv import VenvBackend
from servematrix.errors import InputError

CHOICES = ("auto", "podman", "docker", "venv")
INFO_TIMEOUT_S = 30.0


def probe_tool(tool: str) -> str | None:
    """None when `<tool> info` works; otherwise why not, in one line."""
    if shutil.which(tool) is None:
        return f"{tool} is not installed (not on PATH)"
    try:
        done = subprocess.run(
            [tool, "info"],
            capture_output=True,
            text=True,
            timeout=INFO_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"`{tool} info` did not answer within {INFO_TIMEOUT_S:.0f} s"
    if done.returncode == 0:
        return None
    lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
    why = next(
        (line for line in lines if "error" in line.lower() or "cannot" in line.lower()), lines[-1] if lines else ""
    )
    return f"`{tool} info` failed (exit {done.returncode}): {why}"


def select_backend(
    name: str,
    *,
    workdir: Path,
    plan: Any = None,
    extra_ca_bundle: Path | None = None,
    base_image: str | None = None,
    probe: Callable[[str], str | None] = probe_tool,
) -> Backend:
    """The backend for `--backend NAME`. An explicitly named backend that does not work is an InputError.

    plan: the run's Plan, so a container backend knows each environment's axes, base image and GPU kind.
    extra_ca_bundle / base_image: for image builds; default from SERVEMATRIX_EXTRA_CA_BUNDLE /
    SERVEMATRIX_BASE_IMAGE, else none (the base then comes from the matrix's CUDA kind or the default).
    """
    if name not in CHOICES:
        raise InputError(f"--backend {name!r}: unknown backend (choices: {', '.join(CHOICES)})")
    if name == "venv":
        return VenvBackend(workdir / "envs")
    tool: Tool | None
    if name == "auto":
        tool = next((t for t in TOOLS if probe(t) is None), None)
    else:
        why = probe(name)
        if why is not None:
            raise InputError(f"--backend {name}: {name} is not usable here: {why}")
        tool = next(t for t in TOOLS if t == name)
    if tool is None:
        return VenvBackend(workdir / "envs")
    ca = extra_ca_bundle or _path_from_env(EXTRA_CA_ENV)
    if ca is not None and not ca.is_file():
        raise InputError(f"extra CA bundle {ca} is not a file (from --extra-ca-bundle or {EXTRA_CA_ENV})")
    return ContainerBackend(
        tool,
        workdir / "images",
        targets=targets_from_plan(plan) if plan is not None else None,
        base_image=base_image or os.environ.get(BASE_IMAGE_ENV) or None,
        extra_ca_bundle=ca,
    )


def _path_from_env(variable: str) -> Path | None:
    value = os.environ.get(variable, "").strip()
    return Path(value) if value else None
