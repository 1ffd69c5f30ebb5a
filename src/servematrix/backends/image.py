"""`--backend image`: each environment's server runs in the engine's own published image of its release.

GPU runners often serve from an engine's published images rather than building their own. Which image holds a
release for a CUDA version is engine data (`[[images]]` in `data/engines/<name>.toml`, by version range, with
where the tag scheme was read); `--image REF` names one image for every environment instead. Nothing is built:
the image is pulled when the container engine does not have it, then its interpreter lists what it has
installed (backends/inventory.py). Containers run exactly as the podman/docker backend runs its own images
(this class is that backend with another `build`): the GPU kind's container options, labels, teardown.

What an image cannot do is never blamed on the stack:
- a pull that fails is `error:image-pull`, retried on the next run and never published as a verdict (and an
  image whose interpreter cannot list its packages `error:image-inventory`);
- a release (or CUDA version) the data names no image for is `skipped:no-image`;
- an axis version the image does not hold (the matrix asks torch 2.9.1, the image has 2.11.0) is
  `skipped:not-in-image`, decided before anything runs for that cell. A skip, not bad input: the matrix is
  right, and another backend can serve the cell; this image cannot answer for it under its label.
Both skips never replace a verdict observed by serving the cell (verdict.UNSERVED). Provenance: the image's ID
(`image_digest`, the container runs from it), its repo digest (for a pulled image, the registry's manifest
digest: `docker pull REPO@sha256:...` fetches it again), and the installed set's hash (`lock_hash`) with its
differences from the cell's lock as evidence; the whole set is in the build log.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from servematrix.backends import BuildInput, Built
from servematrix.backends.container import LABEL, ContainerBackend, EnvTarget, Tool, image_id
from servematrix.backends.inventory import (
    INVENTORY_SCRIPT,
    Installed,
    lock_differences,
    not_held,
    parse_inventory,
    shown,
)
from servematrix.backends.tools import INFO_TIMEOUT_S, PULL_TIMEOUT_S
from servematrix.engines import Engine
from servematrix.formats.lockfile import parse_pins
from servematrix.util import run_captured

PULL_FAULT = "image-pull"
INVENTORY_FAULT = "image-inventory"  # the image's interpreter could not list what it has
NO_IMAGE = "no-image"
NOT_IN_IMAGE = "not-in-image"
_TAIL_LINES = 20  # of a failed pull's output, in its verdict


class NoImage(LookupError):
    """The engine data names no published image for an environment (the message says why)."""


def image_reference(engine: Engine, axes: Mapping[str, str]) -> str:
    """The engine's published image of an environment's release and CUDA version (engine data `images`)."""
    version = axes[engine.version_axis]
    row = engine.image_row(version)
    if row is None:
        raise NoImage(f"{engine.name}'s data names no published image of {version} (pass --image REF to use one)")
    template = row.reference
    if row.cuda:
        cuda = axes.get("cuda")
        template = row.cuda.get(cuda or "", "")
        if not template:
            published = ", ".join(row.cuda)
            asked = f"CUDA {cuda}" if cuda else "an environment without a cuda axis"
            raise NoImage(
                f"{engine.name} {version} is published for CUDA {published}, not for {asked} "
                f"({row.source.split(';')[0]}); pass --image REF to use another image"
            )
    return template.format_map({**axes, "version": version})


class ImageBackend(ContainerBackend):
    """The podman/docker backend, serving from published images instead of images it builds."""

    interpreter = "python"  # the image's own, on its PATH: the engine's launch argv runs it too

    def __init__(
        self,
        tool: Tool,
        root: Path,
        *,
        engine: Engine,
        targets: Mapping[str, EnvTarget],
        wanted: Mapping[str, Sequence[tuple[str, str]]],
        image: str | None = None,
        executable: str | None = None,
        pull_timeout_s: float = PULL_TIMEOUT_S,
    ) -> None:
        """
        engine: whose `images` name each environment's image; image: one reference for every environment.
        targets: per environment (`container.targets_from_plan`): its axes and the GPU kind's container options.
        wanted: per environment, the (package, version) its axes name (`cells.axis_packages`): the image must
        hold each.
        """
        super().__init__(tool, root, targets=targets, executable=executable)
        self.name = "image"
        self.engine = engine
        self.image = image
        self.wanted = dict(wanted)
        self.pull_timeout_s = pull_timeout_s
        self._inventories: dict[str, Installed] = {}  # image ID -> what it has installed

    def reference(self, env_id: str) -> str:
        """The image an environment is served from. NoImage when the engine data names none."""
        return self.image or image_reference(self.engine, self.target(env_id).axes)

    def build(self, request: BuildInput, log_path: Path) -> Built:
        started = time.monotonic()
        log_path.parent.mkdir(parents=True, exist_ok=True)

        def unavailable(verdict: str, excerpt: str, **known: Any) -> Built:
            seconds = time.monotonic() - started
            return Built(
                ok=False, env_id=request.env_id, unavailable=verdict, excerpt=excerpt, seconds=seconds, **known
            )

        try:
            reference = self.reference(request.env_id)
        except NoImage as exc:
            log_path.write_text(f"{exc}\n", encoding="utf-8")
            return unavailable(f"skipped:{NO_IMAGE}", str(exc))
        with log_path.open("w", encoding="utf-8") as log:
            inspected = self.inspect(reference)
            pulled = inspected is None
            if inspected is None:
                why = self._pull(reference, log)
                inspected = self.inspect(reference) if why is None else None
                if inspected is None:
                    return unavailable(
                        f"error:{PULL_FAULT}", why or f"{self.tool} pulled {reference} but cannot inspect it"
                    )
            try:
                installed = self._inventory(image_id(inspected))
            except RuntimeError as exc:
                log.write(f"{exc}\n")
                return unavailable(f"error:{INVENTORY_FAULT}", str(exc), image_digest=image_id(inspected))
            differences = None
            if request.lockfile is not None and request.lockfile.is_file():
                lock = parse_pins(request.lockfile.read_text(encoding="utf-8"))
                differences = lock_differences(lock, installed.versions)
            log.write(f"image {reference}: {describe(inspected, reference)}\n{installed.listing()}")
            log.writelines(f"differs from the lock: {line}\n" for line in differences or ())
        built = served_from(
            request.env_id,
            reference=reference,
            inspected=inspected,
            installed=installed,
            wanted=self.wanted.get(request.env_id, ()),
            differences=differences,
        )
        return replace(built, cached=not pulled, seconds=time.monotonic() - started)

    def _pull(self, reference: str, log: Any) -> str | None:
        """Pull `reference` into the container engine's store: None when done, else why not (its output's tail)."""
        argv = [self.executable, "pull", reference]
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()
        done = run_captured(argv, timeout_s=self.pull_timeout_s)
        log.write(done.stdout + done.stderr)
        if done.returncode == 0:
            return None
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()][-_TAIL_LINES:]
        return f"{self.tool} pull {reference} failed ({done.problem or f'exit {done.returncode}'}):\n" + "\n".join(
            lines
        )

    def _inventory(self, ident: str) -> Installed:
        """What the image's interpreter has installed, listed once per image and run. RuntimeError, with why,
        when it cannot be listed."""
        if ident not in self._inventories:
            argv = [
                self.executable, "run", "--rm", "--network", "none",
                "--label", f"{LABEL}.harness-pid={os.getpid()}",
                ident, self.interpreter, "-c", INVENTORY_SCRIPT,
            ]  # fmt: skip
            done = run_captured(argv, timeout_s=INFO_TIMEOUT_S + 60)
            try:
                if done.returncode != 0:
                    raise ValueError(done.problem or f"exit {done.returncode}: {done.stderr.strip()[-500:]}")
                self._inventories[ident] = parse_inventory(done.stdout)
            except ValueError as exc:
                raise RuntimeError(f"cannot list what {ident[:19]} has installed ({self.interpreter}): {exc}") from None
        return self._inventories[ident]


def served_from(
    env_id: str,
    *,
    reference: str,
    inspected: Mapping[str, Any],
    installed: Installed,
    wanted: Sequence[tuple[str, str]],
    differences: list[str] | None,
) -> Built:
    """What an environment is, served from the image `reference` (as `inspected`) holding `installed`: its
    provenance, and `skipped:not-in-image` when the image does not hold a version the cell's axes name.
    wanted: the cell's (package, version) pairs; differences: from the cell's lock, None without one."""
    held = ", ".join(f"{package} {installed.versions.get(canonicalize_name(package), 'none')}" for package, _ in wanted)
    compared = "no lock to compare" if differences is None else f"{len(differences)} difference(s) from the lock"
    count = len(installed.versions)
    notes = (
        f"image {reference}: {describe(inspected, reference)}; installed set {installed.digest} ({count} "
        f"distributions, Python {installed.python}{f'; {held}' if held else ''}), {compared}",
        *(f"differs from the lock: {line}" for line in shown(differences or [])),
    )
    built = Built(
        ok=True,
        env_id=env_id,
        image_digest=image_id(inspected),
        lock_hash=installed.digest,
        installed=dict(installed.versions),
        notes=notes,
    )
    if missing := not_held(wanted, installed.versions):
        lacks = "; ".join(
            f"the cell asks {pkg} {version}, the image has {have or 'none'}" for pkg, version, have in missing
        )
        return replace(
            built, ok=False, unavailable=f"skipped:{NOT_IN_IMAGE}", excerpt=f"{reference} cannot serve it: {lacks}"
        )
    return built


def describe(inspected: Mapping[str, Any], reference: str) -> str:
    """An image's identity: its ID, and the manifest digest of `reference`'s repository (what a pull by digest
    fetches again) when the container engine knows one."""
    repository = reference.split("@")[0]
    if ":" in repository.rsplit("/", 1)[-1]:
        repository = repository.rsplit(":", 1)[0]
    digests = [str(d) for d in inspected.get("RepoDigests") or [] if "@sha256:" in str(d)]
    digest = next((d for d in digests if d.split("@")[0] == repository), digests[0] if digests else None)
    return f"id {image_id(inspected)}, " + (f"repo digest {digest}" if digest else "no repo digest")
