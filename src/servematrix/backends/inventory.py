"""What an interpreter has installed, and how that differs from a lock or from a cell's axes.

The backends that build nothing (`existing`: an interpreter given with --python; `image`: an engine's published
image) serve whatever is installed there. Their provenance is that installed set: every distribution's
name==version and a hash of its RECORD, listed by the interpreter itself with `INVENTORY_SCRIPT` (stdlib
only, so it runs in any Python). Its differences from the cell's lock are evidence; an axis version it does
not hold (the matrix asks torch 2.9.1, the image has 2.11.0) means the cell cannot be served there under its
label.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

# Run by the target interpreter: stdlib only. One line of JSON: {name: [version, sha256 of RECORD]}.
INVENTORY_SCRIPT = r"""
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
MAX_DIFFERENCES = 20  # shown beside a verdict; all of them go to the build log


@dataclass(frozen=True, kw_only=True)
class Installed:
    python: str  # the interpreter's version
    versions: Mapping[str, str]  # canonical name -> version
    hashes: Mapping[str, str]  # canonical name -> sha256 of its RECORD

    @property
    def digest(self) -> str:
        """One hash of the whole installed set."""
        return hashlib.sha256(self.listing().encode()).hexdigest()[:16]

    def listing(self) -> str:
        """The installed set, one `name==version sha256-of-RECORD` line per distribution, sorted."""
        return "".join(f"{n}=={self.versions[n]} {self.hashes[n]}\n" for n in sorted(self.versions))


def parse_inventory(stdout: str) -> Installed:
    """What `INVENTORY_SCRIPT` printed (its last line: an image's entry point may print a banner first).
    ValueError when there is no such line."""
    lines = [line for line in stdout.strip().splitlines() if line.startswith("{")]
    if not lines:
        raise ValueError("no inventory line in the interpreter's output")
    data = json.loads(lines[-1])
    rows = data["distributions"]
    return Installed(
        python=data["python"],
        versions={canonicalize_name(n): v for n, v, _ in rows},
        hashes={canonicalize_name(n): h for n, _, h in rows},
    )


def same_version(wanted: str, installed: str) -> bool:
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
        elif not same_version(version, have):
            out.append(f"{name}: {have} installed (lock {version})")
    return out


def shown(differences: list[str]) -> list[str]:
    """The differences a verdict shows: the first `MAX_DIFFERENCES`, and how many more the build log has."""
    out = differences[:MAX_DIFFERENCES]
    if len(differences) > len(out):
        out.append(f"... and {len(differences) - len(out)} more (build log)")
    return out


def not_held(wanted: Iterable[tuple[str, str]], installed: Mapping[str, str]) -> list[tuple[str, str, str | None]]:
    """(package, wanted version, installed version or None) for each wanted (package, version) the installed
    set does not hold."""
    out = []
    for package, version in wanted:
        have = installed.get(canonicalize_name(package))
        if have is None or not same_version(version, have):
            out.append((package, version, have))
    return out
