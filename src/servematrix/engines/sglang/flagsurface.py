"""The command-line flags an sglang release accepts, read statically from its wheel, and the flag check.

A wrong flag is an argparse crash after an image pull and a model load; read from the wheel it is a
verdict in 0 GPU-seconds. One job per module: `wheels.py` fetches the wheel, `flagreader.py` reads the
flags from its sources with `ast` (nothing from it is imported or executed), `argvcheck.py` checks an argv
against them. This module joins them: the `FlagSurface` of a release (cached per version) and `flag_check`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from servematrix.engines.sglang.argvcheck import FlagCheck, canonical_flag, invalid_choices, unknown_flags
from servematrix.engines.sglang.flagreader import SERVER_ARGS, SourceReader, UnreadableSource
from servematrix.engines.sglang.wheels import (
    IndexUnreachable,
    WheelUnavailable,
    download_target,
    download_wheel,
)
from servematrix.formats.lockfile import DEFAULT_PLATFORM, DEFAULT_PYTHON_VERSION
from servematrix.util import atomic_write

__all__ = [
    "FlagCheck",
    "FlagSurface",
    "FlagSurfaceError",
    "IndexUnreachable",
    "accepted_choices",
    "accepted_flags",
    "canonical_flag",
    "download_target",
    "download_wheel",
    "flag_check",
    "flag_surface",
    "invalid_choices",
    "surface_from_sources",
    "surface_from_wheel",
    "unknown_flags",
]

# Bump when the extraction changes, so cached flag sets are re-read from the cached wheels.
SCHEMA = 1

ALWAYS_ACCEPTED = frozenset({"-h", "--help"})


class FlagSurfaceError(RuntimeError):
    """The wheel could not be fetched or does not look like an sglang server."""


@dataclass(frozen=True, kw_only=True)
class FlagSurface:
    version: str
    flags: frozenset[str]
    deprecated: frozenset[str] = frozenset()
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    multi_value: frozenset[str] = frozenset()  # flags that take several values (nargs +/*/N)
    # Flags whose choices come from a list that plugins may extend at run time (`add_*_choices`):
    # complete for a stock install, but not closed.
    extendable: frozenset[str] = frozenset()
    wheel: str = ""

    def closed_choices(self) -> dict[str, tuple[str, ...]]:
        return {flag: values for flag, values in self.choices.items() if flag not in self.extendable}

    sha256: str = ""

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "version": self.version,
            "wheel": self.wheel,
            "sha256": self.sha256,
            "flags": sorted(self.flags),
            "deprecated": sorted(self.deprecated),
            "choices": {flag: list(values) for flag, values in sorted(self.choices.items())},
            "multi_value": sorted(self.multi_value),
            "extendable": sorted(self.extendable),
        }

    @classmethod
    def from_json(cls, data: Mapping) -> FlagSurface:
        return cls(
            version=data["version"],
            flags=frozenset(data["flags"]),
            deprecated=frozenset(data.get("deprecated", ())),
            choices={flag: tuple(values) for flag, values in data.get("choices", {}).items()},
            multi_value=frozenset(data.get("multi_value", ())),
            extendable=frozenset(data.get("extendable", ())),
            wheel=data.get("wheel", ""),
            sha256=data.get("sha256", ""),
        )


def accepted_flags(sglang_version: str, *, cache_dir: Path) -> frozenset[str]:
    """Every `--flag` (aliases and `--no-` forms included) that this sglang's server parser accepts."""
    return flag_surface(sglang_version, cache_dir=cache_dir).flags


def accepted_choices(
    sglang_version: str, *, cache_dir: Path, include_extendable: bool = False
) -> dict[str, tuple[str, ...]]:
    """`{flag: allowed values}` for the flags whose `choices=` is statically known.

    By default only closed lists; `include_extendable` adds the lists that plugins may extend at run
    time (attention, MoE runner, quantization backends...), which are complete for a stock install.
    """
    surface = flag_surface(sglang_version, cache_dir=cache_dir)
    return dict(surface.choices) if include_extendable else surface.closed_choices()


def flag_surface(
    sglang_version: str,
    *,
    cache_dir: Path,
    python_version: str = DEFAULT_PYTHON_VERSION,
    platform: str = DEFAULT_PLATFORM,
) -> FlagSurface:
    """The flag surface of one sglang release, from the cache or from its wheel for the cell's target
    (downloaded once)."""
    cache_dir = Path(cache_dir)
    cached = cache_dir / "flagsurface" / f"sglang-{sglang_version}.json"
    if cached.is_file():
        try:
            data = json.loads(cached.read_text())
            if data.get("schema") == SCHEMA and data.get("version") == sglang_version:
                return FlagSurface.from_json(data)
        except (OSError, ValueError, KeyError):
            pass  # a torn or stale cache file is re-derived below
    try:
        wheel = download_wheel(
            sglang_version, dest=cache_dir / "wheels", target=download_target(python_version, platform)
        )
    except WheelUnavailable as exc:
        raise FlagSurfaceError(str(exc)) from exc
    surface = surface_from_wheel(wheel, version=sglang_version)
    atomic_write(cached, json.dumps(surface.to_json(), indent=1, sort_keys=True) + "\n")
    return surface


def surface_from_wheel(wheel: Path, *, version: str = "") -> FlagSurface:
    with zipfile.ZipFile(wheel) as zf:
        sources = {
            name: zf.read(name).decode("utf-8", errors="replace")
            for name in zf.namelist()
            if name.startswith("sglang/") and name.endswith(".py")
        }
    digest = hashlib.sha256(Path(wheel).read_bytes()).hexdigest()
    surface = surface_from_sources(sources, version=version)
    return dataclasses.replace(surface, wheel=Path(wheel).name, sha256=digest)


def surface_from_sources(sources: Mapping[str, str], *, version: str = "") -> FlagSurface:
    """Read the flag surface from wheel-relative paths to source text (`sglang/srt/server_args.py`, ...)."""
    if SERVER_ARGS not in sources:
        raise FlagSurfaceError(f"{SERVER_ARGS} is not in the sources")
    reader = SourceReader(sources)
    try:
        reader.collect()
    except UnreadableSource as exc:
        raise FlagSurfaceError(str(exc)) from None
    if not reader.flags:
        raise FlagSurfaceError(f"no flags found in {SERVER_ARGS}: the declaration mechanism changed")
    return FlagSurface(
        version=version,
        flags=frozenset(reader.flags) | ALWAYS_ACCEPTED,
        deprecated=frozenset(reader.deprecated),
        choices=dict(reader.choices),
        multi_value=frozenset(reader.multi_value),
        extendable=frozenset(reader.extendable),
    )


def flag_check(
    *,
    sglang_version: str,
    argv: Sequence[str],
    cache_dir: Path,
    include_extendable: bool = True,
    python_version: str = DEFAULT_PYTHON_VERSION,
    platform: str = DEFAULT_PLATFORM,
) -> FlagCheck:
    """Check a server argv against the flag surface of this sglang release (from its wheel).

    Choice lists that plugins may extend are checked too by default: a stock install has no plugins.
    """
    surface = flag_surface(sglang_version, cache_dir=cache_dir, python_version=python_version, platform=platform)
    choices = dict(surface.choices) if include_extendable else surface.closed_choices()
    used = [canonical_flag(t.split("=", 1)[0], surface.flags) for t in argv if t.startswith("--")]
    return FlagCheck(
        sglang=sglang_version,
        unknown=tuple(unknown_flags(argv, surface.flags)),
        invalid=tuple(invalid_choices(argv, choices, multi_value=surface.multi_value, accepted=surface.flags)),
        deprecated=tuple(dict.fromkeys(f for f in used if f and f in surface.deprecated)),
    )
