"""The podman backend for real: an image built from a real cpu-smoke lock, a cell served from it end to end
with measured throughput, the image reused by the next run, and a broken lock failing its build while the
matrix goes on.

The image is large (torch's CUDA wheels: ~7 GB, ~4 min to build), so it is built once per session and shared;
podman keeps it between local sessions, where it is reused. CI prepares podman with ci/services/podman.sh
(runc, ulimits, the debootstrap base image `localhost/bookworm-base`); the session's image is built by the
`smoke_image` fixture (tests/integration/conftest.py), which test_image_backend.py shares."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from servematrix.backends import Backend, Built
from servematrix.backends.container import ContainerBackend, image_size
from servematrix.engines.transformers.tinymodel import is_built
from servematrix.planning.plan import Plan, make_plan
from servematrix.report.rows import tok_s
from servematrix.run.models import builder_script
from servematrix.run.pipeline import run_plan
from servematrix.run.runplan import RunOptions
from servematrix.stages.locking import lock_plan
from servematrix.store.store import Store
from tests.integration.images import BASE_IMAGE, GOOD, SmokeImage, extra_ca

# The first test also waits for the session's image build: ~4 min on an idle 2-core machine, ~10 min loaded.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1800)]

BROKEN = "transformers=5.5.4"


class Recording:
    """A backend that remembers what its build stage returned."""

    def __init__(self, inner: ContainerBackend) -> None:
        self.inner = inner
        self.name = inner.name
        self.bind_host = inner.bind_host
        self.builds: list[Built] = []

    def build(self, request, log_path):  # type: ignore[no-untyped-def]
        built = self.inner.build(request, log_path)
        self.builds.append(built)
        return built

    def __getattr__(self, attribute: str):  # type: ignore[no-untyped-def]
        return getattr(self.inner, attribute)


def _ensure_tiny_model(image: SmokeImage, project: Path) -> None:
    """Build the tiny model with the image's own Python (the backend's `python` prefix), host dirs mounted."""
    plan = make_plan(project / "matrix" / "cpu-smoke.toml", [GOOD])
    target = Path(plan.spec.file.model.path).resolve()
    if is_built(target):
        return
    script = builder_script(plan.spec.engine, plan.spec.file.model.build or "tiny-llama")
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = image.backend.python(image.built, visible=(script.parent, target.parent))
    done = subprocess.run([*prefix, str(script), str(target)], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and is_built(target), done.stderr[-3000:]


def _containers(podman: str, env_id: str) -> list[str]:
    listed = subprocess.run(
        [podman, "ps", "--all", "--filter", f"label=org.servematrix.env-id={env_id}", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return listed.stdout.split()


def _run(plan: Plan, backend: Backend, project: Path, lock_dir: Path, **options) -> list[dict]:
    store = project / "results.sqlite"
    run_plan(plan, backend, RunOptions(store=store, workdir=project / "work", lock_dir=lock_dir, **options))
    with Store(store) as opened:
        return opened.all_rows()


def test_image_is_built_from_the_lock_labelled_and_run_by_a_non_root_user(smoke_image):
    image, built = smoke_image, smoke_image.built
    inspected = image.backend.inspect(built.image_digest or "")
    assert inspected is not None
    labels = inspected["Config"]["Labels"]
    assert labels["org.servematrix.env-id"] == built.env_id
    assert labels["org.servematrix.lock-hash"] == image.lock_hash == built.lock_hash
    assert "transformers=5.24.0" in labels["org.servematrix.axes"].split(",")
    assert built.image_digest == "sha256:" + inspected["Id"]
    print(
        f"\nimage {built.image_digest[:19]}: {image_size(inspected) / 1e9:.2f} GB, "
        f"build {image.build_seconds:.0f} s (cached={built.cached})"
    )
    shown = subprocess.run(
        [image.podman, "run", "--rm", built.image_digest, "sh", "-c",
         "id -u; cat /opt/servematrix/freeze.txt; echo ---; cat \"$SSL_CERT_FILE\""],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    uid, rest = shown.split("\n", 1)
    freeze, bundle = rest.split("---\n", 1)
    assert uid.strip() != "0"
    frozen = dict(line.split("==", 1) for line in freeze.splitlines() if "==" in line)
    frozen = {canonicalize_name(name): version for name, version in frozen.items()}
    assert {k: frozen.get(k) for k in image.lock_pins} == image.lock_pins  # exactly the lock, by hash
    assert built.installed == image.lock_pins
    ca = extra_ca()
    if ca is not None:  # the extra CA bundle's certificates are trusted inside the image
        blocks = [b for b in ca.read_text().split("-----END CERTIFICATE-----") if "BEGIN CERTIFICATE" in b]
        assert all(block.strip().splitlines()[-1] in bundle for block in blocks)


def test_cell_serves_from_the_container_and_the_next_run_reuses_the_image(smoke_image, smoke_project):
    """The session fixture built the image (run one); this run of the real pipeline builds nothing."""
    _ensure_tiny_model(smoke_image, smoke_project)
    plan = make_plan("matrix/cpu-smoke.toml", [f"{GOOD},mode=static"])
    backend = Recording(smoke_image.backend)
    started = time.monotonic()
    rows = _run(plan, backend, smoke_project, smoke_image.lock_dir)
    seconds = time.monotonic() - started
    [row] = rows
    assert row["verdict"] == "pass", row["excerpt"]
    assert row["image_digest"] == smoke_image.built.image_digest
    assert row["lock_hash"] == smoke_image.lock_hash
    [build] = backend.builds
    assert build.cached and build.image_digest == smoke_image.built.image_digest
    assert row["stages"]["build"] < 30  # an inspect, not a build
    throughput = tok_s(row)
    assert throughput[1] > 0 and throughput[16] > 0, row["metrics"]
    print(
        f"\ncell in container: ready {row['stages']['serve']:.1f} s, tok/s {throughput}, "
        f"reuse {row['stages']['build']:.2f} s, whole run {seconds:.0f} s"
    )
    # The server's container is gone with its cell.
    assert _containers(smoke_image.podman, build.env_id) == []


def test_broken_lock_fails_the_build_with_its_lines_and_the_matrix_goes_on(smoke_image, smoke_project, tmp_path):
    """5.5.4's lock is tampered with (a package's hashes changed): pip refuses it; the 5.24.0 cell after it still runs."""
    _ensure_tiny_model(smoke_image, smoke_project)
    plan = make_plan("matrix/cpu-smoke.toml", ["mode=static"])
    lock_dir = tmp_path / "locks"
    shutil.copytree(smoke_image.lock_dir, lock_dir)
    outcomes = {o.env_id: o for o in lock_plan(plan, lock_dir)}
    broken_env = next(c.env_id for c in plan.cells if c.env.axes["transformers"] == "5.5.4")
    good_env = next(c.env_id for c in plan.cells if c.env.axes["transformers"] == "5.24.0")
    assert [c.env_id for c in plan.cells] == [broken_env, good_env]  # the broken one comes first
    lockfile = outcomes[broken_env].lockfile
    assert lockfile is not None
    _tamper_hashes(lockfile, package="idna")

    rows = {r["env_id"]: r for r in _run(plan, smoke_image.backend, smoke_project, lock_dir, stages=_NO_BENCH)}
    broken, good = rows[broken_env], rows[good_env]
    assert broken["verdict"] == "fail:build", broken["excerpt"]
    # the failing step's header first: podman names the stage of a multi-stage build, "[4/4] STEP 7/17: RUN …"
    assert re.match(r"(\[\d+/\d+\] )?STEP ", broken["excerpt"]) and "pip install" in broken["excerpt"].splitlines()[0]
    assert "DO NOT MATCH THE HASHES" in broken["excerpt"] and "idna" in broken["excerpt"]
    assert broken["image_digest"] is None
    assert good["verdict"] == "pass", good["excerpt"]
    assert good["image_digest"] == smoke_image.built.image_digest
    print(f"\nbroken lock: fail:build in {broken['stages'].get('build', 0):.0f} s; excerpt:\n{broken['excerpt']}")
    assert _containers(smoke_image.podman, good_env) == []


_NO_BENCH = ("resolve", "build", "probe", "serve")


def _tamper_hashes(lockfile: Path, *, package: str) -> None:
    """Change every hash of one package: pip accepts a file matching any of them."""
    lines = lockfile.read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{package}=="))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")), len(lines))
    for i in range(start, end):
        lines[i] = re.sub(r"--hash=sha256:[0-9a-f]{64}", "--hash=sha256:" + "0" * 64, lines[i])
    lockfile.write_text("".join(lines))


def test_stop_removes_a_container_whose_server_ignores_sigterm(podman, tmp_path):
    """The serve stage's teardown only reaches the `run` client, which proxies SIGTERM into the container:
    a server that ignores it outlives the client. `stop` removes it; `reap_orphans` finds those of dead
    harnesses."""
    from servematrix.stages.serve import free_port, kill_tree

    backend = ContainerBackend("podman", tmp_path)
    built = Built(ok=True, env_id="hung-server", image_digest=BASE_IMAGE)
    launch = backend.launch(
        built, ("sh", "-c", "trap '' TERM; while :; do sleep 0.2; done"), {}, free_port(), model_dir=None
    )
    client = subprocess.Popen(launch.argv, env=dict(launch.env), start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not _containers(podman, "hung-server") and time.monotonic() < deadline:
            time.sleep(0.2)
        kill_tree(client.pid, client.pid, grace_s=2.0)  # what the serve stage does on a fatal log line
        time.sleep(1)
        assert _containers(podman, "hung-server"), "the container should outlive its killed client"
        assert backend.stop(launch, grace_s=1)
        assert _containers(podman, "hung-server") == []
    finally:
        subprocess.run([podman, "rm", "--force", "--ignore", *_containers(podman, "hung-server")], check=False)
        client.wait(timeout=30)

    # A container labelled with a harness pid that no longer exists is an orphan.
    name = f"servematrix-orphan-{os.getpid()}"
    subprocess.run(
        [podman, "run", "--detach", "--name", name, "--label", "org.servematrix.env-id=hung-server",
         "--label", "org.servematrix.harness-pid=999999999", BASE_IMAGE, "sleep", "600"],
        capture_output=True, check=True,
    )  # fmt: skip
    assert name in backend.reap_orphans()
    assert _containers(podman, "hung-server") == []
