"""Which advisories touch a cell, from the cell's facts.

`CellFacts` is what a cell is made of, as an advisory reads it: its lock's pins, GPU arch, mode, server argv
and environment, and the model's architectures. `facts_for` reads them from a plan's cell, its lock file and
the matrix's model config; `match` holds them against each advisory's conditions:

- every condition holds and the advisory is `confirmed`: **affected**, the cell is predicted to fail with the
  advisory's class, citing it;
- every condition holds but the advisory is `conditional` (its failure depends on something the facts cannot
  show: another checkpoint, a runtime condition), or the model's architectures are unknown while the rest
  hold: **at-risk**, a visible mark, never a verdict;
- any condition fails, or names a package the cell's lock lacks (not installed) or whose version is unknown
  (a cell with no lock yet): no match.
"""

from __future__ import annotations

import functools
import json
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

from packaging.utils import canonicalize_name

from servematrix.advisories.model import Advisory
from servematrix.config.spec import PINNED, model_config_dir
from servematrix.formats.lockfile import parse_pins
from servematrix.records.cell import Cell

if TYPE_CHECKING:  # a type only: planning.plan imports the engines' hooks, which report/ must not reach
    from servematrix.planning.plan import Plan

Status = Literal["affected", "at-risk"]


@dataclass(frozen=True)
class CellFacts:
    sglang: str
    packages: Mapping[str, str]  # the lock's pins, canonical name -> version
    gpu_arch: str
    mode: str
    argv: Sequence[str]
    architectures: Sequence[str]  # the model's (config.json `architectures`); empty when unknown
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # the server's environment
    # Whether `packages` is a whole lock or only the version axes' known pins (a cell with no lock yet). Either
    # way an advisory naming a package it lacks does not match: not installed, or not known to be.
    locked: bool = True


@dataclass(frozen=True)
class AdvisoryMatch:
    advisory: Advisory
    status: Status
    why: str

    def to_dict(self) -> dict[str, str]:
        return {"id": self.advisory.id, "status": self.status, "why": self.why, "source": self.advisory.source}


def match(advisories: Iterable[Advisory], facts: CellFacts) -> tuple[AdvisoryMatch, ...]:
    """The advisories that touch a cell with these facts, in the order given."""
    found = []
    for advisory in advisories:
        result = _match_one(advisory, facts)
        if result is not None:
            found.append(result)
    return tuple(found)


class _NoMatch(Exception):
    pass


def _match_one(advisory: Advisory, facts: CellFacts) -> AdvisoryMatch | None:
    held: list[str] = []  # the conditions that hold, said for `why`
    unknown: list[str] = []  # conditions the facts cannot decide
    try:
        _packages(advisory, facts, held)
        _mismatch(advisory, facts, held)
        if advisory.gpu_arch:
            _require(facts.gpu_arch in advisory.gpu_arch)
            held.append(facts.gpu_arch)
        if advisory.modes:
            _require(facts.mode in advisory.modes)
            held.append(f"mode {facts.mode}")
        if advisory.architectures:
            if not facts.architectures:
                unknown.append("the model's architectures are unknown")
            else:
                archs = [a for a in facts.architectures if a in advisory.architectures]
                _require(bool(archs))
                held.append(archs[0])
        for condition in advisory.flags:
            _require(flag_holds(condition, facts.argv))
            held.append(condition.replace(" | ", " or "))
        for condition in advisory.env:
            _require(env_holds(condition, facts.env))
            held.append(f"env {condition}")
    except _NoMatch:
        return None
    if unknown:
        return AdvisoryMatch(advisory, "at-risk", "; ".join([*held, *(f"unknown: {u}" for u in unknown)]))
    if advisory.certainty == "conditional":
        return AdvisoryMatch(advisory, "at-risk", "; ".join([*held, f"if: {advisory.condition}"]))
    return AdvisoryMatch(advisory, "affected", "; ".join(held))


def _require(condition: bool) -> None:
    if not condition:
        raise _NoMatch


def _installed(name: str, facts: CellFacts) -> str | None:
    if name == "sglang" and facts.sglang:
        return facts.packages.get("sglang", facts.sglang)
    return facts.packages.get(name)


def _packages(advisory: Advisory, facts: CellFacts, held: list[str]) -> None:
    for package in advisory.affected:
        version = _installed(package.name, facts)
        # Not installed (a whole lock lacks it), or unknown (no lock yet: an unresolved cell is not marked for
        # a package it may never install).
        if version is None or not package.contains(version):
            raise _NoMatch
        held.append(f"{package.name} {version}")


def _mismatch(advisory: Advisory, facts: CellFacts, held: list[str]) -> None:
    for first, second in advisory.mismatch:
        a, b = _installed(first, facts), _installed(second, facts)
        _require(a is not None and b is not None and a != b)
        held.append(f"{first} {a} with {second} {b}")


def flag_holds(condition: str, argv: Sequence[str]) -> bool:
    """Whether an advisory's flag condition holds for an argv: '--flag', '--flag value', a leading '!' for
    absence, ' | ' between alternatives (any one)."""
    negate = condition.startswith("!")
    present = any(_has_flag(alternative.split(), argv) for alternative in condition.removeprefix("!").split(" | "))
    return present != negate


def _has_flag(words: list[str], argv: Sequence[str]) -> bool:
    flag, value = words[0], (words[1] if len(words) > 1 else None)
    for i, arg in enumerate(argv):
        if arg == flag:
            if value is None or (i + 1 < len(argv) and argv[i + 1] == value):
                return True
        elif arg.startswith(flag + "=") and (value is None or arg.partition("=")[2] == value):
            return True
    return False


def env_holds(condition: str, env: Mapping[str, str]) -> bool:
    negate = condition.startswith("!")
    name, eq, value = condition.removeprefix("!").partition("=")
    present = name in env and (not eq or env[name] == value)
    return present != negate


# ------------------------------------------------------------------------------------------- facts of a cell


def facts_for(plan: Plan, cell: Cell, lock_dir: Path) -> CellFacts:
    """A planned cell's facts: the pins of its lock (`lock_dir/<env_id>.lock.txt`; without one, the version
    axes' known pins, `locked=False`), its GPU arch, mode, argv and server environment, and the model's
    architectures from the matrix's `[model] config_dir` (or a local model folder)."""
    spec = plan.spec
    engine = spec.engine
    pins = lock_pins(lock_dir / f"{cell.env_id}.lock.txt")
    if pins is not None:
        packages = dict(pins)
        locked = True
    else:
        packages = {}
        for axis in engine.axes:
            value = cell.env.effective(axis, engine.pins)
            if value and value != PINNED:
                packages[engine.axis_package(axis)] = value
        locked = False
    config = model_config_dir(spec)
    return CellFacts(
        sglang=cell.env.axes.get("sglang", cell.env.version),
        packages=MappingProxyType(packages),
        gpu_arch=cell.env.gpu.arch,
        mode=cell.mode,
        argv=tuple(cell.command),
        architectures=_architectures(config) if config is not None else (),
        env=MappingProxyType(dict(cell.server_env)),
        locked=locked,
    )


def lock_pins(lock: Path) -> Mapping[str, str] | None:
    """A lock file's pins, or None where there is no such file. Read once per (path, mtime, size): a report asks
    for one lock per cell, and the cells of an environment share it."""
    try:
        found = lock.stat()
    except OSError:
        return None
    if not stat.S_ISREG(found.st_mode):
        return None
    return _parsed_lock(str(lock), found.st_mtime_ns, found.st_size)


@functools.lru_cache(maxsize=512)
def _parsed_lock(path: str, mtime_ns: int, size: int) -> Mapping[str, str]:
    del mtime_ns, size  # the key: a lock rewritten in place is read again
    return MappingProxyType(parse_pins(Path(path).read_text(encoding="utf-8")))


@functools.cache
def _architectures(config_dir: Path) -> tuple[str, ...]:
    """The model's architectures from its config.json; none when it cannot be read."""
    try:
        data = json.loads((config_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ()
    archs = data.get("architectures") if isinstance(data, dict) else None
    return tuple(a for a in archs if isinstance(a, str)) if isinstance(archs, list) else ()


def canonical(packages: Mapping[str, str]) -> dict[str, str]:
    """Package names as the facts hold them (PEP 503), for callers that build `CellFacts` by hand."""
    return {canonicalize_name(name): version for name, version in packages.items()}
