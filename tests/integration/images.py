"""The podman images the integration tests share: the cpu-smoke transformers 5.24.0 environment's image, built
by the podman backend from its real lock (the `smoke_image` fixture in conftest.py builds it once a session),
and what building it needs. CI prepares podman with ci/services/podman.sh (runc, ulimits, the debootstrap base
image `localhost/bookworm-base`): no container registry is reachable, so every image is built here."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from servematrix.backends import BuildInput, Built
from servematrix.backends.container import ContainerBackend, targets_from_plan
from servematrix.planning.cells import requirements
from servematrix.planning.plan import make_plan
from servematrix.stages.locking import lock_plan
from tests.conftest import MATRIX

BASE_IMAGE = os.environ.get("SERVEMATRIX_BASE_IMAGE", "localhost/bookworm-base")
GOOD = "transformers=5.24.0"
# Images a test built FROM the smoke image (their IDs): removed with it (conftest.py).
BUILT_ON_SMOKE_IMAGE: list[str] = []


def extra_ca() -> Path | None:
    """The host's CA bundle: it trusts this machine's TLS-intercepting proxy, which the image must too."""
    given = os.environ.get("SERVEMATRIX_EXTRA_CA_BUNDLE")
    paths = ssl.get_default_verify_paths()
    for candidate in (given, paths.cafile, paths.openssl_cafile):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


@dataclass
class SmokeImage:
    podman: str
    backend: ContainerBackend
    built: Built
    lock_dir: Path
    lock_hash: str
    lock_pins: dict[str, str]
    build_log: Path
    build_seconds: float


def ready_podman() -> str:
    """podman's path, once it can run a container from the base image; skips or fails the test otherwise."""
    exe = shutil.which("podman")
    if exe is None:
        pytest.skip("podman is not installed: source ci/services/podman.sh (CI does)")
    if subprocess.run([exe, "image", "exists", BASE_IMAGE], check=False).returncode != 0:
        pytest.fail(f"base image {BASE_IMAGE} is missing: source ci/services/podman.sh")
    tried = subprocess.run([exe, "run", "--rm", BASE_IMAGE, "true"], capture_output=True, text=True, check=False)
    if tried.returncode != 0:
        pytest.fail(f"podman cannot run a container (source ci/services/podman.sh for runc): {tried.stderr}")
    return exe


def build_smoke_image(podman: str, root: Path, lock_dir: Path, log_dir: Path) -> SmokeImage:
    """The cpu-smoke transformers 5.24.0 environment's image, built from its lock resolved now into `lock_dir`."""
    plan = make_plan(MATRIX / "cpu-smoke.toml", [GOOD])
    [outcome] = lock_plan(plan, lock_dir)
    assert outcome.status == "resolved" and outcome.lockfile, outcome.reason
    env = plan.cells[0].env
    reqs, overrides = requirements(env, plan.spec.engine)
    backend = ContainerBackend(
        "podman",
        root,
        targets=targets_from_plan(make_plan(MATRIX / "cpu-smoke.toml")),
        base_image=BASE_IMAGE,
        extra_ca_bundle=extra_ca(),
    )
    request = BuildInput(
        env_id=env.env_id,
        python=env.python,
        requirements=(*reqs, *overrides),
        lockfile=outcome.lockfile,
        lock_hash=outcome.inputs_hash,
    )
    log = log_dir / f"{env.env_id}.build.log"
    started = time.monotonic()
    built = backend.build(request, log)
    assert built.ok, built.excerpt
    return SmokeImage(
        podman=podman,
        backend=backend,
        built=built,
        lock_dir=lock_dir,
        lock_hash=outcome.inputs_hash,
        lock_pins=dict(outcome.pins),
        build_log=log,
        build_seconds=time.monotonic() - started,
    )
