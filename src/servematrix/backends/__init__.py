"""Backends: where an environment is built and where its server runs.

Each backend turns an environment (and its lock, when the resolve stage made one) into something that
can launch the engine's argv: a venv (uv), an image (podman/docker, or built by Nix), the engine's own
published image, or an installed interpreter. The serve stage does not care which: it gets an argv, an
environment and a working directory.
`Backend` is the whole interface; `registry` maps `--backend` names to backends; `resources` finds the files
they read from the top of the repository (or the wheel's copies).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True, kw_only=True)
class BuildInput:
    env_id: str
    python: str
    requirements: tuple[str, ...]  # used when there is no lock
    lockfile: Path | None = None  # a hashed lock from the resolve stage
    lock_hash: str | None = None


@dataclass(frozen=True, kw_only=True)
class Built:
    ok: bool
    env_id: str
    prefix: Path | None = None  # venv directory
    image_digest: str | None = None
    lock_hash: str = ""  # hash of the exact installed set
    installed: Mapping[str, str] = field(default_factory=dict)
    cached: bool = False
    seconds: float = 0.0
    excerpt: str = ""  # the failing step's lines
    # Why the environment could not be had, when that says nothing about the stack, as its verdict:
    # `error:<fault>` (an image pull failed: retried) or `skipped:<reason>` (an image that does not hold the
    # cell). Empty for a build that failed on the stack's account (`fail:build`).
    unavailable: str = ""
    notes: tuple[str, ...] = ()  # provenance worth showing beside every verdict (e.g. differences from the lock)


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    argv: tuple[str, ...]
    env: Mapping[str, str]
    owns_listener: bool  # the launched process tree itself listens on the port (false behind a proxy)


class Backend(Protocol):
    name: str
    # The address the server binds inside its environment: loopback for a venv, all interfaces inside a
    # container (the port is published on the host's loopback only).
    bind_host: str

    def build(self, request: BuildInput, log_path: Path) -> Built: ...

    def model_location(self, model_dir: Path) -> str:
        """Where the server sees a local model directory (mounted read-only in a container)."""
        ...

    def launch(
        self, built: Built, argv: tuple[str, ...], env: Mapping[str, str], port: int, *, model_dir: Path | None
    ) -> LaunchSpec: ...

    def python(self, built: Built, *, visible: tuple[Path, ...] = ()) -> tuple[str, ...]:
        """How to run a Python script inside the environment (e.g. the tiny-model builder); `visible` host
        directories must be readable and writable at the same paths."""
        ...

    def stop(self, launch: LaunchSpec, *, grace_s: float | None = None) -> bool:
        """Make sure what `launch` started is gone, after the serve stage killed its process tree (a container
        outlives its client). True if gone."""
        ...

    def reap_orphans(self) -> list[str]:
        """Remove what a harness that no longer exists left running (containers); names of what went."""
        ...


class HostProcesses:
    """`stop` and `reap_orphans` of a backend whose server is a process tree on this host: the serve stage's
    teardown and the store's orphan reaper already cover it, so there is nothing more to do."""

    def stop(self, launch: LaunchSpec, *, grace_s: float | None = None) -> bool:
        return True

    def reap_orphans(self) -> list[str]:
        return []
