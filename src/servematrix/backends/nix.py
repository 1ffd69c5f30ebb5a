"""The nix backend: an environment's image built by Nix, loaded into podman or docker, run like any other.

`nix build FLAKE#image-<env_id>` (flake.nix) gives a script that streams the image
(dockerTools.streamLayeredImage); its output goes straight into `podman load` / `docker load`, so the
image never sits in the Nix store as a tarball. From then on the image is one the container backend can
run: same layout (/opt/servematrix/env, user 10001), same `run --rm --init` argv, same GPU options from the
matrix, same teardown. This class builds; a ContainerBackend it owns runs.

The flake reads nix/envs.json (`python -m servematrix.scaleout.nixexport`), made from the locks. A build first
checks that the entry for the environment was exported from exactly the lock the resolve stage gave (its
sha256): an image of other versions than the ones the store will record would be a silent lie.

Wheels are fixed-output downloads from URLs whose hosts are not committed: pass `wheel_bases` (or set
SERVEMATRIX_WHEEL_BASES), and the build runs `--impure` so that the flake can read them (docs/nix.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from servematrix.backends import BuildInput, Built, LaunchSpec
from servematrix.backends.container import (
    EXCERPT_LINES,
    TOOLS,
    ContainerBackend,
    EnvTarget,
    Tool,
    image_id,
    lock_required,
    targets_from_plan,
)
from servematrix.backends.resources import is_packaged, resource
from servematrix.backends.tools import probe_tool
from servematrix.formats.lockfile import parse_pins
from servematrix.util import atomic_write, log_tail

IMAGE_REPOSITORY = "localhost/servematrix-nix"  # nix/lib.nix: imageRepository
ENVS_JSON = Path("nix/envs.json")
WHEEL_BASES_ENV = "SERVEMATRIX_WHEEL_BASES"
MARKER = "nix-images.json"
# Nix 2.8 (Debian's) has flakes behind a feature flag; newer versions accept the flag as well.
NIX_FEATURES = ("--extra-experimental-features", "nix-command flakes")
_LOADED = re.compile(r"^Loaded image(?:\(s\))?:\s*(\S+)", re.MULTILINE)


def default_flake() -> Path:
    """The directory holding flake.nix and nix/envs.json: the installed package's copy, or the checkout's."""
    return resource("flake")


def flake_ref(flake: Path) -> str:
    """A checkout is read as git reads it (tracked files only); the wheel's copy may sit inside some other
    repository's ignored folder (a .nox venv in a checkout), so it is named as a plain path."""
    return f"path:{flake}" if is_packaged(flake) else str(flake)


class NixBackend:
    name = "nix"
    bind_host = ContainerBackend.bind_host

    def __init__(
        self,
        tool: Tool,
        root: Path,
        *,
        flake: Path | None = None,
        targets: Mapping[str, EnvTarget] | None = None,
        wheel_bases: Mapping[str, str] | None = None,
        nix: str = "nix",
        nix_args: Sequence[str] = (),
        executable: str | None = None,
        runner: ContainerBackend | None = None,
    ) -> None:
        """
        tool: the container engine the image is loaded into and run by ("podman" or "docker").
        root: a directory for the backend's own state (which image each environment's build gave).
        flake: the directory holding flake.nix (default: the source tree's root). A git checkout is read as
            git does: nix sees tracked files only, so nix/envs.json must be committed or at least `git add`ed.
        wheel_bases: {base name: URL} for the wheels (see docs/nix.md); default: SERVEMATRIX_WHEEL_BASES, else
            the flake's nix/wheel-bases.json.
        nix_args: extra arguments for `nix build` (e.g. ("--override-input", "nixpkgs", "path:...")).
        """
        if tool not in TOOLS:
            raise ValueError(f"tool must be one of {TOOLS}, not {tool!r}")
        self.tool: Tool = tool
        self.root = root
        self.flake = (flake or default_flake()).resolve()
        self.wheel_bases = dict(wheel_bases) if wheel_bases else None
        self.nix = nix
        self.nix_args = tuple(nix_args)
        self.runner = runner or ContainerBackend(tool, root, targets=targets, executable=executable)

    # -- what the flake says ------------------------------------------------------------------------
    def environments(self) -> dict[str, Any]:
        path = self.flake / ENVS_JSON
        try:
            return json.loads(path.read_text(encoding="utf-8")).get("environments", {})
        except FileNotFoundError:
            return {}

    def build_argv(self, env_id: str) -> list[str]:
        argv = [self.nix, *NIX_FEATURES, "build", "--no-link", "--json", "--print-build-logs"]
        if self._bases_json() is not None:
            argv.append("--impure")  # the flake reads SERVEMATRIX_WHEEL_BASES only when impure
        return [*argv, *self.nix_args, f"{flake_ref(self.flake)}#image-{env_id}"]

    def _bases_json(self) -> str | None:
        if self.wheel_bases is not None:
            return json.dumps(self.wheel_bases, sort_keys=True)
        return os.environ.get(WHEEL_BASES_ENV) or None

    def _nix_env(self) -> dict[str, str]:
        environ = dict(os.environ)
        bases = self._bases_json()
        if bases is not None:
            environ[WHEEL_BASES_ENV] = bases
        return environ

    # -- build -------------------------------------------------------------------------------------
    def build(self, request: BuildInput, log_path: Path) -> Built:
        started = time.monotonic()

        def failed(excerpt: str) -> Built:
            return Built(ok=False, env_id=request.env_id, excerpt=excerpt, seconds=time.monotonic() - started)

        if request.lockfile is None:
            return failed(lock_required(self.name))
        entry = self.environments().get(request.env_id)
        lock_bytes = request.lockfile.read_bytes()
        if entry is None:
            return failed(
                f"environment {request.env_id} is not in {self.flake / ENVS_JSON}: export it with "
                "`python -m servematrix.scaleout.nixexport` (and `git add nix/envs.json`)"
            )
        if entry.get("lock_sha256") != hashlib.sha256(lock_bytes).hexdigest():
            return failed(
                f"{ENVS_JSON} was exported from another version of {request.lockfile.name}: run "
                "`python -m servematrix.scaleout.nixexport` again"
            )
        installed = parse_pins(lock_bytes.decode("utf-8"))
        lock_hash = request.lock_hash or str(entry.get("inputs_hash", ""))

        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("w", encoding="utf-8") as log:
            stream = self._nix_build(request.env_id, log)
            if stream is None:
                return failed(log_tail(log_path, EXCERPT_LINES))
            known = self._marker().get(request.env_id, {})
            if known.get("stream") == stream and known.get("image_id"):
                info = self.runner.inspect(known["image_id"])
                if info is not None:
                    return Built(
                        ok=True,
                        env_id=request.env_id,
                        image_digest=image_id(info),
                        lock_hash=lock_hash,
                        installed=installed,
                        cached=True,
                        seconds=time.monotonic() - started,
                    )
            reference = self._load(stream, log)
        if reference is None:
            return failed(log_tail(log_path, EXCERPT_LINES))
        info = self.runner.inspect(reference)
        if info is None:
            return failed(f"{self.tool} load succeeded but {reference} cannot be inspected")
        digest = image_id(info)
        self._remember(request.env_id, {"stream": stream, "image_id": digest, "reference": reference})
        return Built(
            ok=True,
            env_id=request.env_id,
            image_digest=digest,
            lock_hash=lock_hash,
            installed=installed,
            seconds=time.monotonic() - started,
        )

    def _nix_build(self, env_id: str, log) -> str | None:  # type: ignore[no-untyped-def]
        """The built stream script's store path, or None (the reason is in the log)."""
        argv = self.build_argv(env_id)
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()
        try:
            done = subprocess.run(
                argv,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                text=True,
                env=self._nix_env(),
                check=False,
            )
        except FileNotFoundError:
            log.write(f"{self.nix}: not found; install Nix (docs/nix.md)\n")
            return None
        if done.returncode != 0:
            log.write(f"nix build failed (exit {done.returncode})\n")
            return None
        try:
            return str(json.loads(done.stdout)[0]["outputs"]["out"])
        except (ValueError, LookupError, TypeError):
            log.write(f"nix build printed no output path: {done.stdout[:500]!r}\n")
            return None

    def _load(self, stream: str, log) -> str | None:  # type: ignore[no-untyped-def]
        """`STREAM | <tool> load`; the loaded image's reference, or None (the reason is in the log)."""
        load_argv = [self.runner.executable, "load"]
        log.write(f"$ {stream} | {' '.join(load_argv)}\n")
        log.flush()
        producer = subprocess.Popen([stream], stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
        try:
            done = subprocess.run(load_argv, stdin=producer.stdout, capture_output=True, text=True, check=False)
        finally:
            assert producer.stdout is not None
            producer.stdout.close()
            streamed = producer.wait()
        log.write(done.stdout + done.stderr)
        if streamed != 0 or done.returncode != 0:
            log.write(f"image stream exit {streamed}, {self.tool} load exit {done.returncode}\n")
            return None
        loaded = _LOADED.findall(done.stdout + done.stderr)
        return loaded[-1] if loaded else None

    def _marker(self) -> dict[str, dict[str, str]]:
        try:
            return json.loads((self.root / MARKER).read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return {}

    def _remember(self, env_id: str, entry: dict[str, str]) -> None:
        marker = {**self._marker(), env_id: entry}
        atomic_write(self.root / MARKER, json.dumps(marker, indent=1, sort_keys=True))

    # -- run: exactly as the container backend -----------------------------------------------------
    def model_location(self, model_dir: Path) -> str:
        return self.runner.model_location(model_dir)

    def launch(
        self, built: Built, argv: tuple[str, ...], env: Mapping[str, str], port: int, *, model_dir: Path | None
    ) -> LaunchSpec:
        return self.runner.launch(built, argv, env, port, model_dir=model_dir)

    def python(self, built: Built, *, visible: tuple[Path, ...] = ()) -> tuple[str, ...]:
        return self.runner.python(built, visible=visible)

    def stop(self, launch: LaunchSpec, *, grace_s: float | None = None) -> bool:
        return self.runner.stop(launch, grace_s=grace_s)

    def reap_orphans(self) -> list[str]:
        return self.runner.reap_orphans()


def nix_backend(
    workdir: Path,
    *,
    plan: Any = None,
    tool: str = "auto",
    flake: Path | None = None,
    probe: Any = None,
) -> NixBackend:
    """The backend for `--backend nix`: images from the flake, run by podman (else docker).

    tool: "podman", "docker" or "auto" (the first whose `info` works). Raises InputError when nix or a
    container engine is missing.
    """
    from servematrix.errors import InputError

    check = probe or probe_tool
    if shutil.which("nix") is None:
        raise InputError("--backend nix: nix is not installed (not on PATH); see docs/nix.md")
    if tool == "auto":
        chosen = next((t for t in TOOLS if check(t) is None), None)
        if chosen is None:
            raise InputError("--backend nix: neither podman nor docker is usable here to load and run the image")
    elif tool in TOOLS:
        why = check(tool)
        if why is not None:
            raise InputError(f"--backend nix: {tool} is not usable here: {why}")
        chosen = tool
    else:
        raise InputError(f"--backend nix: unknown container engine {tool!r} (choices: auto, {', '.join(TOOLS)})")
    return NixBackend(
        chosen,  # type: ignore[arg-type]
        workdir / "nix",
        flake=flake,
        targets=targets_from_plan(plan) if plan is not None else None,
    )
