"""The existing-environment backend: builds nothing, runs the server with a given interpreter.

For prebuilt images (an upstream sglang image), GPU nodes that reach no package index, and a user's own
install. Provenance is what is installed: every distribution's name==version and a hash of its RECORD, read
by that interpreter. The differences from the cell's lock are recorded as evidence, and a cell whose axis
versions (sglang, torch, ...) disagree with what is installed is refused before anything runs: it would
otherwise be published under a false label.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from servematrix.backends import BuildInput, Built, HostProcesses, LaunchSpec
from servematrix.errors import InputError
from servematrix.lockfile import parse_pins
from servematrix.util import run_captured

# Run by the target interpreter: stdlib only. One line of JSON: {name: [version, sha256 of RECORD]}.
_INVENTORY = r"""
import hashlib, json, sys
from importlib import metadata
seen = {}
for dist in metadata.distributions():
    name = (dist.metadata["Name"] or "").strip()
    if not name or name.lower() in seen:
        continue  # the first on sys.path wins, as import does
    record = dist.read_text("RECORD") or dist.read_text("METADATA") or ""
    seen[name.lower()] = [name, dist.version, hashlib.sha256(record.encode()).hexdigest()]
print(json.dumps({"python": sys.version.split()[0], "distributions": sorted(seen.values())}))
"""
MAX_DIFFERENCES = 20


@dataclass(frozen=True, kw_only=True)
class Installed:
    python: str  # the interpreter's version
    versions: Mapping[str, str]  # canonical name -> version
    hashes: Mapping[str, str]  # canonical name -> sha256 of its RECORD

    @property
    def digest(self) -> str:
        """One hash of the whole installed set."""
        lines = "".join(f"{n}=={self.versions[n]} {self.hashes[n]}\n" for n in sorted(self.versions))
        return hashlib.sha256(lines.encode()).hexdigest()[:16]


def _same_version(wanted: str, installed: str) -> bool:
    """2.11.0 and 2.11.0+cu130 are the same release; anything else compares as PEP 440 versions."""
    try:
        return (
            Version(wanted).public == Version(installed).public
            if "+" not in wanted
            else Version(wanted) == Version(installed)
        )
    except InvalidVersion:
        return wanted == installed


def lock_differences(lock: Mapping[str, str], installed: Mapping[str, str]) -> list[str]:
    """What the interpreter has that the lock does not say, package by package."""
    out = []
    for name, version in sorted(lock.items()):
        have = installed.get(name)
        if have is None:
            out.append(f"{name}: missing (lock {version})")
        elif not _same_version(version, have):
            out.append(f"{name}: {have} installed (lock {version})")
    return out


class ExistingBackend(HostProcesses):
    name = "existing"
    bind_host = "127.0.0.1"

    def __init__(self, python: str | None = None) -> None:
        self.interpreter = python or sys.executable

    @cached_property
    def installed(self) -> Installed:
        done = run_captured([self.interpreter, "-c", _INVENTORY], timeout_s=120)
        if done.problem is not None:
            raise InputError(f"--python {self.interpreter}: cannot run it: {done.problem}")
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise InputError(f"--python {self.interpreter}: cannot list its packages: {last}")
        data = json.loads(done.stdout.strip().splitlines()[-1])
        rows = data["distributions"]
        return Installed(
            python=data["python"],
            versions={canonicalize_name(n): v for n, v, _ in rows},
            hashes={canonicalize_name(n): h for n, _, h in rows},
        )

    def refuse_mislabelled(self, wanted: Iterable[tuple[str, str, str]]) -> None:
        """wanted: (cell or environment label, package, version). The first disagreement is one line, exit 2."""
        for label, package, version in wanted:
            have = self.installed.versions.get(canonicalize_name(package))
            if have is None or not _same_version(version, have):
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
        shown = differences[:MAX_DIFFERENCES]
        if len(differences) > len(shown):
            shown.append(f"... and {len(differences) - len(shown)} more (build log)")
        return Built(
            ok=True,
            env_id=request.env_id,
            lock_hash=installed.digest,
            installed=dict(installed.versions),
            seconds=time.monotonic() - started,
            notes=(
                f"existing environment {self.interpreter}: installed set {installed.digest}, "
                f"{len(differences)} difference(s) from the lock",
                *(f"differs from the lock: {line}" for line in shown),
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
