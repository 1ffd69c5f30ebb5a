"""The existing-environment backend: builds nothing, runs the server with a given interpreter.

For GPU nodes that reach no package index, a user's own install, and a harness that itself runs inside a
prebuilt image (`srun --container-image`); to serve from an engine's published image, see `--backend image`
(backends/image.py). Provenance is what is installed (backends/inventory.py), read by that interpreter. The
differences from the cell's lock are recorded as evidence, and a cell whose axis versions (sglang, torch, ...)
disagree with what is installed is refused before anything runs: it would otherwise be published under a false
label.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Mapping
from functools import cached_property
from pathlib import Path

from servematrix.backends import BuildInput, Built, HostProcesses, LaunchSpec
from servematrix.backends.inventory import (
    INVENTORY_SCRIPT,
    Installed,
    lock_differences,
    not_held,
    parse_inventory,
    shown,
)
from servematrix.errors import InputError
from servematrix.formats.lockfile import parse_pins
from servematrix.util import run_captured


class ExistingBackend(HostProcesses):
    name = "existing"
    bind_host = "127.0.0.1"

    def __init__(self, python: str | None = None) -> None:
        self.interpreter = python or sys.executable

    @cached_property
    def installed(self) -> Installed:
        done = run_captured([self.interpreter, "-c", INVENTORY_SCRIPT], timeout_s=120)
        if done.problem is not None:
            raise InputError(f"--python {self.interpreter}: cannot run it: {done.problem}")
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise InputError(f"--python {self.interpreter}: cannot list its packages: {last}")
        return parse_inventory(done.stdout)

    def refuse_mislabelled(self, wanted: Iterable[tuple[str, str, str]]) -> None:
        """wanted: (cell or environment label, package, version). The first disagreement is one line, exit 2."""
        for label, package, version in wanted:
            for _, _, have in not_held([(package, version)], self.installed.versions):
                found = f"has {package} {have}" if have else f"has no {package}"
                raise InputError(
                    f"{label} wants {package} {version}, but {self.interpreter} {found}: "
                    "refusing to run it under that label (--select the cells this environment holds)"
                )

    def build(self, request: BuildInput, log_path: Path) -> Built:
        started = time.monotonic()
        installed = self.installed
        differences: list[str] = []
        if request.lockfile is not None and request.lockfile.is_file():
            differences = lock_differences(parse_pins(request.lockfile.read_text(encoding="utf-8")), installed.versions)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(
            f"existing environment: {self.interpreter} (Python {installed.python}), "
            f"{len(installed.versions)} distributions, installed set {installed.digest}\n"
            + "".join(f"differs from the lock: {line}\n" for line in differences),
            encoding="utf-8",
        )
        return Built(
            ok=True,
            env_id=request.env_id,
            lock_hash=installed.digest,
            installed=dict(installed.versions),
            seconds=time.monotonic() - started,
            notes=(
                f"existing environment {self.interpreter}: installed set {installed.digest}, "
                f"{len(differences)} difference(s) from the lock",
                *(f"differs from the lock: {line}" for line in shown(differences)),
            ),
        )

    def model_location(self, model_dir: Path) -> str:
        return str(model_dir)

    def launch(
        self, built: Built, argv: tuple[str, ...], env: Mapping[str, str], port: int, *, model_dir: Path | None
    ) -> LaunchSpec:
        # `python` is the given interpreter; a console script (`transformers serve`) is the one installed
        # beside it, as in a venv's bin/.
        bin_dir = Path(self.interpreter).parent
        if argv and argv[0] in ("python", "python3"):
            program = (self.interpreter, *argv[1:])
        elif argv and (bin_dir / argv[0]).is_file():
            program = (str(bin_dir / argv[0]), *argv[1:])
        else:
            program = tuple(argv)
        path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
        return LaunchSpec(argv=program, env={**os.environ, **env, "PATH": path}, owns_listener=True)

    def python(self, built: Built, *, visible: tuple[Path, ...] = ()) -> tuple[str, ...]:
        return (self.interpreter,)
