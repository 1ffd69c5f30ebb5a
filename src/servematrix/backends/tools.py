"""Container engines as the host has them: does `podman|docker info` answer, can a base image be had.

A docker CLI without a reachable daemon, podman without its runtime, or an engine on a host that reaches no
registry is not a usable backend: a build there would fail and blame the stack for a fault of the host.
"""

from __future__ import annotations

import shutil

from servematrix.util import run_captured

INFO_TIMEOUT_S = 30.0
# A base image is pulled before the first build needs it; a CUDA devel image is several GB.
PULL_TIMEOUT_S = 1800.0


def probe_tool(tool: str) -> str | None:
    """None when `<tool> info` works; otherwise why not, in one line."""
    if shutil.which(tool) is None:
        return f"{tool} is not installed (not on PATH)"
    done = run_captured([tool, "info"], timeout_s=INFO_TIMEOUT_S)
    if done.timed_out:
        return f"`{tool} info` did not answer within {INFO_TIMEOUT_S:.0f} s"
    if done.returncode == 0:
        return None
    lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
    why = next(
        (line for line in lines if "error" in line.lower() or "cannot" in line.lower()), lines[-1] if lines else ""
    )
    return f"`{tool} info` failed (exit {done.returncode}): {why}"


def base_image_problem(tool: str, image: str) -> str | None:
    """None when `image` is in the engine's store, or could be pulled now; otherwise why not, in one line."""
    if run_captured([tool, "image", "inspect", image], timeout_s=INFO_TIMEOUT_S).returncode == 0:
        return None
    pulled = run_captured([tool, "pull", "--quiet", image], timeout_s=PULL_TIMEOUT_S)
    if pulled.timed_out:
        return f"pulling {image} took more than {PULL_TIMEOUT_S:.0f} s"
    if pulled.returncode == 0:
        return None
    lines = [line.strip() for line in pulled.stderr.splitlines() if line.strip()]
    return f"cannot pull {image}: {lines[-1] if lines else f'exit {pulled.returncode}'}"
