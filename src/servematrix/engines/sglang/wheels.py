"""Fetching an sglang wheel for a cell's target, without its dependencies and without installing it.

pip downloads it (pip of this interpreter, else pip run by uv); a host that reaches no index finds that out
once per process (`IndexUnreachable`), so a GPU node pays one attempt, not one per cell.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path

from servematrix.formats import verdict
from servematrix.formats.lockfile import DEFAULT_PLATFORM, DEFAULT_PYTHON_VERSION, platform_parts
from servematrix.util import run_captured


class WheelUnavailable(RuntimeError):
    """The wheel could not be fetched."""


class IndexUnreachable(WheelUnavailable):
    """No package index answered pip: found once per process (a run), and every later download is refused
    at once with the same message, so a host without an index (a GPU node) pays one attempt, not one per
    cell."""


# pip's defaults (5 retries with backoff; a configured timeout may be minutes) cost ~11 s per download on a
# host whose index refuses connections; one retry still tells a dead index from a dropped packet.
PIP_NETWORK = ("--retries", "1", "--timeout", "15")
# The reason no index answered, per pip command and PIP_* configuration, for the rest of this process.
_unreachable: dict[tuple[str, ...], str] = {}


def download_target(python_version: str = DEFAULT_PYTHON_VERSION, platform: str = DEFAULT_PLATFORM) -> tuple[str, ...]:
    """pip's wheel-selection arguments for the cell's target: from 0.5.11 the sglang wheels are cp3xx and
    tagged manylinux_2_34 only; earlier ones are py3-none-any."""
    arch, major, minor = platform_parts(platform)
    return (
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--platform",
        f"manylinux_{major}_{minor}_{arch}",
        "--implementation",
        "cp",
    )


def download_wheel(sglang_version: str, *, dest: Path, target: Sequence[str] | None = None) -> Path:
    """The sglang wheel for this version, without dependencies and without installing it."""
    dest = Path(dest)
    existing = _find_wheel(dest, sglang_version)
    if existing:
        return existing
    pip = _pip_command()
    index = (*pip, *sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("PIP_")))
    if index in _unreachable:
        raise IndexUnreachable(_unreachable[index])
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".download-") as tmp:
        cmd = [
            *pip,
            "download",
            *PIP_NETWORK,
            "--no-deps",
            "--disable-pip-version-check",
            *(target or download_target()),
            f"sglang=={sglang_version}",
            "-d",
            tmp,
        ]
        proc = run_captured(cmd, timeout_s=900)
        found = _find_wheel(Path(tmp), sglang_version)
        if proc.returncode != 0 or not found:
            output = proc.stderr or proc.stdout
            network = _network_failure(output)
            if network is not None and not found:
                _unreachable[index] = (
                    f"no package index is reachable from this host (pip download: {network}); "
                    "no wheel is read for the rest of this run"
                )
                raise IndexUnreachable(_unreachable[index])
            tail = "\n".join(output.strip().splitlines()[-5:])
            raise WheelUnavailable(f"could not download sglang=={sglang_version}: {tail}")
        final = dest / found.name
        os.replace(found, final)
    return final


def _find_wheel(folder: Path, version: str) -> Path | None:
    if not folder.is_dir():
        return None
    for path in sorted(folder.glob(f"sglang-{version}-*.whl")):
        return path
    return None


def _network_failure(output: str) -> str | None:
    """The network failure pip's output names (harness_faults.toml's build patterns), else None."""
    for pattern in verdict.harness_faults().build.network_patterns:
        found = pattern.search(output)
        if found:
            return found.group(0)
    return None


def _pip_command() -> list[str]:
    """pip from this interpreter when it has one; otherwise pip run by uv (uv has no `download`)."""
    if find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    uv = shutil.which("uv")
    if uv:
        return [uv, "tool", "run", "--from", "pip", "pip"]
    raise WheelUnavailable("neither pip nor uv is available to download the sglang wheel")
