"""The container backends: podman and docker, one class, since both speak the same CLI.

One image per environment, built from containers/Dockerfile and the environment's hashed lock, tagged
`localhost/servematrix-env:<env_id>-<lock hash>` and reused by every mode and every later run while its
recipe (Dockerfile, base image, Python) is unchanged. The image ID (`sha256:…`, the same for podman and
docker) is the provenance recorded in the store, and containers are started from that ID, never from the
tag, so a result always names the exact image that produced it.

Servers run as `<tool> run --rm --init …`: `--init` forwards SIGTERM to the server and reaps its workers (a
continuous-batching server never exits on SIGTERM without it), and the port is published on the host's
loopback only. The serve stage kills the client's process tree; the client proxies that SIGTERM into the
container, and `stop()` makes sure the container is gone even when the server ignores it.

What an image or a container needs beyond the Backend protocol's arguments (the axes for labels, the CUDA
base image, the GPU kind's runtime options) comes from the plan: see `targets_from_plan`.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psutil

from servematrix.backends import BuildInput, Built, LaunchSpec
from servematrix.backends.resources import resource
from servematrix.config.spec import GpuKind
from servematrix.formats.lockfile import lock_layers, parse_pins, read_lock_header

Tool = Literal["podman", "docker"]
TOOLS: tuple[Tool, ...] = ("podman", "docker")

IMAGE_REPOSITORY = "localhost/servematrix-env"
LABEL = "org.servematrix"
ENV_PREFIX = "/opt/servematrix/env"  # where the Dockerfile puts the venv
MODELS_MOUNT = "/models"
# The default base for an environment with a CUDA axis and no [cuda."X"].base_image: NVIDIA's devel image
# (nvcc is needed by JIT kernels such as FlashInfer's). Pin it by digest in the matrix for reproducibility.
DEFAULT_CUDA_BASE = "nvidia/cuda:{cuda}.0-devel-ubuntu24.04"
DEFAULT_BASE = "debian:bookworm-slim"  # environments without a CUDA axis (the CPU engine)
# When a GPU kind asks for GPUs and names no device option, give the container all of them.
DEFAULT_PODMAN_DEVICES = ("nvidia.com/gpu=all",)
DEFAULT_DOCKER_GPUS = "all"
# The lock is installed in stages of the Dockerfile, the largest first: cuDNN and cuBLAS (1.8 GB of the
# cpu-smoke image's 7.1 GB venv), torch's other CUDA libraries (2.5 GB), torch and triton (2.3 GB), then the
# whole lock. While a step is committed its files are on disk several times over, so a build needs free disk
# in proportion to its largest step: each stage but the last is built on its own first (`--target`), and the
# cpu-smoke image took 14.4 GB of free disk at its peak so, and 30.0 GB as one step (docs/containers.md).
# Environments with the same torch pins share the first three stages' layers through the build cache.
# (stage, the context file its entries are written to, name patterns): containers/Dockerfile copies them.
INSTALL_LAYERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # CUDA 12 wheels are named nvidia-cublas-cu12, CUDA 13 ones nvidia-cublas (cuDNN: nvidia-cudnn-cu13)
    ("cudnn-cublas", "layer-cudnn-cublas.txt", ("nvidia-cudnn-cu*", "nvidia-cublas", "nvidia-cublas-cu*")),
    ("cuda-libs", "layer-cuda-libs.txt", ("nvidia-*",)),
    ("torch", "layer-torch.txt", ("torch", "triton")),
)
EXTRA_CA_ENV = "SERVEMATRIX_EXTRA_CA_BUNDLE"
BASE_IMAGE_ENV = "SERVEMATRIX_BASE_IMAGE"

# A build step's header: podman's (with its stage, `[2/4] `, in a multi-stage build), docker's, BuildKit's.
_STEP = re.compile(r"^((\[\d+/\d+\] )?STEP \d+/\d+: |Step \d+/\d+ : |#\d+ \[[^\]]*\d+/\d+\] )")
EXCERPT_LINES = 40  # of a failed build's log, in a verdict
_EXCERPT_WIDTH = 400


@dataclass(frozen=True, kw_only=True)
class EnvTarget:
    """What the backend needs to know about an environment besides its BuildInput."""

    axes: Mapping[str, str] = field(default_factory=dict)
    gpu: GpuKind | None = None
    base_image: str | None = None  # the matrix's [cuda."X"].base_image
    cuda: str | None = None  # the cuda axis, for the default base image


def _given_gpus() -> list[str] | None:
    """The GPU indices in CUDA_VISIBLE_DEVICES, or None when it is unset or names GPUs otherwise (UUIDs)."""
    given = [part.strip() for part in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()]
    return given if given and all(part.isdigit() for part in given) else None


def cpuset_options() -> list[str]:
    """`--cpuset-cpus` with this harness's CPUs when it may use only some of the host's (a packed run's job):
    a container's processes are not the harness's children, so they do not inherit its affinity."""
    mine = os.sched_getaffinity(0)
    if len(mine) >= (os.cpu_count() or 0):
        return []
    return ["--cpuset-cpus", ",".join(str(cpu) for cpu in sorted(mine))]


def targets_from_plan(plan: Any) -> dict[str, EnvTarget]:
    """env_id -> EnvTarget for every environment of a plan (servematrix.planning.plan.Plan)."""
    targets: dict[str, EnvTarget] = {}
    for cell in plan.cells:
        env = cell.env
        if env.env_id in targets:
            continue
        cuda = env.axes.get("cuda")
        kind = plan.spec.file.cuda.get(cuda) if cuda else None
        targets[env.env_id] = EnvTarget(
            axes=dict(env.axes), gpu=env.gpu, base_image=kind.base_image if kind else None, cuda=cuda
        )
    return targets


class ContainerBackend:
    bind_host = "0.0.0.0"  # inside the container; published on the host's 127.0.0.1 only
    interpreter = f"{ENV_PREFIX}/bin/python"  # the environment's Python, which runs helper scripts (`python`)

    def __init__(
        self,
        tool: Tool,
        root: Path,
        *,
        targets: Mapping[str, EnvTarget] | None = None,
        base_image: str | None = None,
        extra_ca_bundle: Path | None = None,
        dockerfile: Path | None = None,
        executable: str | None = None,
        stop_grace_s: float = 10.0,
    ) -> None:
        """
        tool: "podman" or "docker" (the CLI dialect); executable: its path, if not `tool` on PATH.
        root: a directory for build contexts.
        targets: per environment, from `targets_from_plan(plan)`: labels, base image, GPU runtime options.
        base_image: overrides every environment's base (e.g. a local `localhost/bookworm-base`).
        extra_ca_bundle: PEM certificates the build must trust (a TLS-intercepting proxy); default none.
        """
        if tool not in TOOLS:
            raise ValueError(f"tool must be one of {TOOLS}, not {tool!r}")
        self.tool: Tool = tool
        self.name: str = tool
        self.root = root
        self.targets = dict(targets or {})
        self.base_image = base_image
        self.extra_ca_bundle = extra_ca_bundle
        self.dockerfile = dockerfile or default_dockerfile()
        self.executable = executable or tool
        self.stop_grace_s = stop_grace_s

    # -- naming ----------------------------------------------------------------------------------
    def target(self, env_id: str) -> EnvTarget:
        return self.targets.get(env_id, EnvTarget())

    def image_tag(self, request: BuildInput) -> str:
        return f"{IMAGE_REPOSITORY}:{request.env_id}-{(request.lock_hash or 'unlocked')[:12]}"

    def base_for(self, env_id: str) -> str:
        target = self.target(env_id)
        if self.base_image:
            return self.base_image
        if target.base_image:
            return target.base_image
        if target.cuda:
            return DEFAULT_CUDA_BASE.format(cuda=target.cuda)
        return DEFAULT_BASE

    def recipe(self, request: BuildInput) -> str:
        """What the image is made from: a cached image with another recipe is rebuilt. The lock's own bytes
        count, not only the inputs hash that names it: the same inputs resolved on another day may pin other
        versions, and an image must hold exactly its lock."""
        payload = {
            "dockerfile": hashlib.sha256(self.dockerfile.read_bytes()).hexdigest(),
            "base": self.base_for(request.env_id),
            "python": request.python,
            "lock": hashlib.sha256(request.lockfile.read_bytes()).hexdigest() if request.lockfile else None,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]

    # -- build -----------------------------------------------------------------------------------
    def build_argv(self, request: BuildInput, context: Path, *, stage: str | None = None) -> list[str]:
        """The build of the whole image, tagged, or of one of its install stages alone (`stage`), untagged: its
        layers stay in the build cache for the next build."""
        target = self.target(request.env_id)
        header = read_lock_header(request.lockfile) if request.lockfile else None
        args = {
            "BASE_IMAGE": self.base_for(request.env_id),
            "PYTHON_VERSION": request.python,
            "ENV_ID": request.env_id,
            "LOCK_HASH": request.lock_hash or "",
            "AXES": ",".join(f"{k}={v}" for k, v in target.axes.items()),
            "RECIPE": self.recipe(request),
            "INDEX_URL": (header.index_url or "") if header else "",
            "EXTRA_INDEX_URLS": " ".join(header.extra_index_urls) if header else "",
        }
        argv = [self.executable, "build", "--force-rm", "--file", str(self.dockerfile)]
        argv += ["--target", stage] if stage is not None else ["--tag", self.image_tag(request)]
        for key, value in args.items():
            argv += ["--build-arg", f"{key}={value}"]
        return [*argv, str(context)]

    def build(self, request: BuildInput, log_path: Path) -> Built:
        started = time.monotonic()

        def failed(excerpt: str) -> Built:
            return Built(ok=False, env_id=request.env_id, excerpt=excerpt, seconds=time.monotonic() - started)

        if request.lockfile is None:
            return failed(lock_required(self.tool))
        tag = self.image_tag(request)
        lock_text = request.lockfile.read_text(encoding="utf-8")
        installed = parse_pins(lock_text)
        recipe = self.recipe(request)

        def image(inspected: Mapping[str, Any], *, cached: bool = False) -> Built:
            return Built(
                ok=True,
                env_id=request.env_id,
                image_digest=image_id(inspected),
                lock_hash=request.lock_hash or "",
                installed=installed,
                cached=cached,
                seconds=time.monotonic() - started,
            )

        existing = self.inspect(tag)
        if existing is not None and _labels(existing).get(f"{LABEL}.recipe") == recipe:
            return image(existing, cached=True)
        context = self._context(request, lock_text)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with log_path.open("w", encoding="utf-8") as log:
                for stage in [*(stage for stage, _, _ in INSTALL_LAYERS), None]:
                    argv = self.build_argv(request, context, stage=stage)
                    log.write(f"$ {' '.join(argv)}\n")
                    log.flush()
                    done = subprocess.run(
                        argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False
                    )
                    if done.returncode != 0:
                        break
        finally:
            shutil.rmtree(context, ignore_errors=True)
        if done.returncode != 0:
            return failed(build_excerpt(log_path.read_text(encoding="utf-8", errors="replace")))
        built = self.inspect(tag)
        if built is None:
            return failed(f"{self.tool} build succeeded but {tag} cannot be inspected")
        return image(built)

    def _context(self, request: BuildInput, lock_text: str) -> Path:
        """A build context of exactly the files the Dockerfile copies (the lock, its install layers, the extra
        CA bundle): nothing else reaches the daemon."""
        self.root.mkdir(parents=True, exist_ok=True)
        context = self.root / f"context-{request.env_id}-{uuid.uuid4().hex[:8]}"
        context.mkdir()
        (context / "lock.txt").write_text(lock_text, encoding="utf-8")
        layers = lock_layers(lock_text, [patterns for _, _, patterns in INSTALL_LAYERS])
        for (_, name, _), layer in zip(INSTALL_LAYERS, layers, strict=True):
            (context / name).write_text(layer, encoding="utf-8")
        ca = context / "extra-ca.crt"
        if self.extra_ca_bundle is not None:
            shutil.copyfile(self.extra_ca_bundle, ca)
        else:
            ca.write_bytes(b"")
        return context

    def inspect(self, image: str) -> dict[str, Any] | None:
        done = subprocess.run([self.executable, "image", "inspect", image], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return None
        found = json.loads(done.stdout or "[]")
        return found[0] if found else None

    # -- run -------------------------------------------------------------------------------------
    def model_location(self, model_dir: Path) -> str:
        return f"{MODELS_MOUNT}/{model_dir.name}"

    def gpu_options(self, env_id: str) -> list[str]:
        """The GPU kind's runtime options, as data from the matrix ([gpu.X.container]). The GPUs this harness
        was given (CUDA_VISIBLE_DEVICES: a packed run's job, or the runner's own) replace its GPU devices: the
        container gets those GPUs alone, and sees them as 0..k-1."""
        kind = self.target(env_id).gpu
        if kind is None:
            return []
        options = kind.container
        wants_gpus = kind.arch != "cpu" and kind.count > 0
        given = _given_gpus() if wants_gpus else None
        argv: list[str] = []
        if self.tool == "podman":
            devices = options.podman_devices or (list(DEFAULT_PODMAN_DEVICES) if wants_gpus else [])
            if given is not None:
                devices = [f"nvidia.com/gpu={index}" for index in given]
            for device in devices:
                argv += ["--device", device]
        else:
            gpus = options.docker_gpus or (DEFAULT_DOCKER_GPUS if wants_gpus else None)
            if given is not None:
                gpus = f'"device={",".join(given)}"'  # the quotes are docker's: a list inside its CSV syntax
            if gpus:
                argv += ["--gpus", gpus]
        if options.shm_size:
            argv += ["--shm-size", options.shm_size]
        for ulimit in options.ulimits:
            argv += ["--ulimit", ulimit]
        for mount in options.mounts:
            argv += ["--volume", mount if mount.count(":") >= 2 else f"{mount}:ro"]
        return argv

    def launch(
        self, built: Built, argv: tuple[str, ...], env: Mapping[str, str], port: int, *, model_dir: Path | None
    ) -> LaunchSpec:
        assert built.image_digest, "launch needs a built image"
        name = f"servematrix-{built.env_id}-{uuid.uuid4().hex[:8]}"
        command = [
            self.executable, "run", "--rm", "--init", "--name", name,
            "--label", f"{LABEL}.env-id={built.env_id}",
            "--label", f"{LABEL}.harness-pid={os.getpid()}",
            "--publish", f"127.0.0.1:{port}:{port}",
        ]  # fmt: skip
        if model_dir is not None:
            command += ["--volume", f"{model_dir}:{self.model_location(model_dir)}:ro"]
        command += self.gpu_options(built.env_id)
        command += cpuset_options()
        command += _env_directory_mounts(env, taken=_mount_destinations(command))
        # `--env NAME` without a value: the client passes its own value through, so no secret of the
        # server's environment appears in an argv, a process list or the store.
        for key in sorted(env):
            command += ["--env", key]
        command += [built.image_digest, *argv]
        return LaunchSpec(argv=tuple(command), env={**os.environ, **env}, owns_listener=False)

    def python(self, built: Built, *, visible: tuple[Path, ...] = ()) -> tuple[str, ...]:
        assert built.image_digest, "python needs a built image"
        command = [
            self.executable, "run", "--rm", "--network", "none",
            "--label", f"{LABEL}.env-id={built.env_id}",
            "--label", f"{LABEL}.harness-pid={os.getpid()}",
            *self._host_user(), "--env", "HOME=/tmp", "--workdir", "/tmp",
        ]  # fmt: skip
        for directory in dict.fromkeys(str(Path(d).resolve()) for d in visible):
            command += ["--volume", f"{directory}:{directory}"]
        return (*command, built.image_digest, self.interpreter)

    def _host_user(self) -> list[str]:
        """Files the helper writes into host directories must belong to the host user, not the image's."""
        uid, gid = os.getuid(), os.getgid()
        if self.tool == "podman" and uid != 0:
            return ["--userns", "keep-id", "--user", f"{uid}:{gid}"]  # rootless: uid 0 is not the host user
        return ["--user", f"{uid}:{gid}"]

    # -- teardown --------------------------------------------------------------------------------
    def stop(self, launch: LaunchSpec, *, grace_s: float | None = None) -> bool:
        """Make sure a launched container is gone (after the serve stage killed its client). True if gone.

        Killing the `run` client only proxies SIGTERM into the container: a server that ignores it (a hung
        SGLang scheduler) would keep running, holding its GPUs, without this.
        """
        name = container_name(launch.argv)
        if name is None:
            return True
        return self.remove(name, grace_s=self.stop_grace_s if grace_s is None else grace_s)

    def remove(self, name: str, *, grace_s: float = 0.0) -> bool:
        if self.exists(name):
            subprocess.run(
                [self.executable, "stop", "--time", str(round(grace_s)), name],
                capture_output=True, check=False, timeout=grace_s + 60,
            )  # fmt: skip
            subprocess.run([self.executable, "rm", "--force", name], capture_output=True, check=False, timeout=60)
        return not self.exists(name)

    def exists(self, name: str) -> bool:
        done = subprocess.run(
            [self.executable, "container", "inspect", "--format", "{{.Id}}", name],
            capture_output=True, check=False,
        )  # fmt: skip
        return done.returncode == 0

    def reap_orphans(self) -> list[str]:
        """Remove containers started by a harness process that no longer exists. Returns their names."""
        listed = subprocess.run(
            [self.executable, "ps", "--all", "--filter", f"label={LABEL}.harness-pid", "--format", "{{.Names}}"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        reaped = []
        for name in listed.stdout.split():
            done = subprocess.run(
                [self.executable, "container", "inspect", "--format",
                 f'{{{{index .Config.Labels "{LABEL}.harness-pid"}}}}', name],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            owner = done.stdout.strip()
            if owner.isdigit() and int(owner) != os.getpid() and psutil.pid_exists(int(owner)):
                continue
            if done.returncode == 0 and self.remove(name):
                reaped.append(name)
        return reaped


def default_dockerfile() -> Path:
    """containers/Dockerfile: the installed package's copy, or the checkout's (an editable install)."""
    return resource("dockerfile")


def lock_required(backend: str) -> str:
    """Why an image backend refuses an environment without a lock."""
    return (
        f"the {backend} backend builds images from a hashed lock only: run the resolve stage "
        "(--stages resolve,build,...) or use --backend venv"
    )


def container_name(argv: Sequence[str]) -> str | None:
    for flag, value in itertools.pairwise(argv):
        if flag == "--name":
            return value
    return None


def build_excerpt(log: str) -> str:
    """The failing step's lines: from the last `STEP n/m` header to the end, its middle elided if long."""
    lines = log.splitlines()
    start = max((i for i, line in enumerate(lines) if _STEP.match(line)), default=0)
    step = [line if len(line) <= _EXCERPT_WIDTH else line[:_EXCERPT_WIDTH] + " …" for line in lines[start:]]
    if len(step) > EXCERPT_LINES:
        step = [step[0], f"… ({len(step) - EXCERPT_LINES + 1} lines elided)", *step[-(EXCERPT_LINES - 2) :]]
    return "\n".join(step)


def _env_directory_mounts(env: Mapping[str, str], *, taken: set[str]) -> list[str]:
    """Host directories the server's environment names (HF_HOME={workdir}/hf-home) appear at the same path.

    A value that is already a mount's destination (HF_HOME=/hf-cache with a model-cache mount there) names
    a path inside the container, not a host directory.
    """
    argv: list[str] = []
    for value in dict.fromkeys(env.values()):
        if value.startswith("/") and value.rstrip("/") not in taken and Path(value).is_dir():
            argv += ["--volume", f"{value}:{value}"]
    return argv


def _mount_destinations(argv: Sequence[str]) -> set[str]:
    return {
        value.split(":")[1].rstrip("/")
        for flag, value in itertools.pairwise(argv)
        if flag == "--volume" and value.count(":") >= 1
    }


def _labels(inspected: Mapping[str, Any]) -> dict[str, str]:
    config = inspected.get("Config") or {}
    return dict(config.get("Labels") or inspected.get("Labels") or {})


def image_id(inspected: Mapping[str, Any]) -> str:
    """podman reports the bare hex ID, docker `sha256:<hex>`: record and run both as `sha256:<hex>`."""
    ident = str(inspected["Id"])
    return ident if ident.startswith("sha256:") else f"sha256:{ident}"


def image_size(inspected: Mapping[str, Any]) -> int:
    with contextlib.suppress(KeyError, TypeError, ValueError):
        return int(inspected["Size"])
    return 0
