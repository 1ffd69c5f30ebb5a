"""An advisory record: the OSV schema's fields servematrix reads, and `Advisory`, the checked record.

The file is OSV JSON (what pip-audit and osv-scanner read): `id`, `summary`, `details`, `references`,
`affected` (PyPI packages with ECOSYSTEM ranges of `introduced`/`fixed`/`last_affected` events, or exact
`versions`). One reading differs from OSV's: a stack failure needs the whole stack, so a cell is touched only
when *every* `affected` package is installed in an affected version (OSV lists alternatives). What OSV has no
field for is in `database_specific` (`Specific` below): the failure class, GPU archs, flags, environment,
modes, model architectures, packages whose versions must differ (`mismatch`), the certainty and its
condition, what fixed it and what a user does instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ID_PATTERN = r"^SMX-\d{4}-\d{4}$"
CLASS_PATTERN = r"^[a-z0-9]+(-[a-z0-9]+)*$"
ARCH_PATTERN = r"^sm_\d{2,3}[a-z]?$"
Certainty = Literal["confirmed", "conditional"]


def parse_version(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise ValueError(f"{text!r} is not a version (PEP 440)") from None


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Package(_Record):
    ecosystem: Literal["PyPI"]
    name: str = Field(min_length=1)
    purl: str | None = None


class Event(_Record):
    introduced: str | None = None
    fixed: str | None = None
    last_affected: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Event:
        given = [k for k in ("introduced", "fixed", "last_affected") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("an event has exactly one of introduced, fixed, last_affected")
        value = getattr(self, given[0])
        if not (given[0] == "introduced" and value == "0"):
            parse_version(value)
        return self


class Range(_Record):
    type: Literal["ECOSYSTEM"]
    events: tuple[Event, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _starts_introduced(self) -> Range:
        if self.events[0].introduced is None:
            raise ValueError('a range\'s first event is `introduced` ("0": every version before the others)')
        return self


class Affected(_Record):
    package: Package
    ranges: tuple[Range, ...] = ()
    versions: tuple[str, ...] = ()
    database_specific: dict[str, Any] | None = None

    @field_validator("versions")
    @classmethod
    def _versions(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            parse_version(value)
        return values

    @model_validator(mode="after")
    def _some_range(self) -> Affected:
        if not self.ranges and not self.versions:
            raise ValueError("an affected package needs `ranges` or `versions`")
        return self


class Reference(_Record):
    type: Literal[
        "ADVISORY", "ARTICLE", "DETECTION", "DISCUSSION", "REPORT", "FIX", "INTRODUCED", "PACKAGE", "EVIDENCE", "WEB"
    ]
    url: str = Field(pattern=r"^https://")


class Specific(_Record):
    """`database_specific`: the conditions and advice OSV has no field for. Empty lists mean "any"."""

    # The failure class (a signature id of data/signatures/, where one fits): the cell's `predicted-fail:<class>`.
    class_: str = Field(alias="class", pattern=CLASS_PATTERN)
    gpu_arch: tuple[str, ...] = ()
    # Each entry must hold for the cell's argv: "--flag" (present), "--flag value" (present with that value),
    # "!" before either (absent); " | " separates alternatives (a flag renamed between releases).
    flags: tuple[str, ...] = ()
    # Likewise for the server's environment: "NAME", "NAME=value", "!NAME", "!NAME=value".
    env: tuple[str, ...] = ()
    modes: tuple[str, ...] = ()
    architectures: tuple[str, ...] = ()
    # Pairs of packages that must both be installed, at different versions (a package and its prebuilt part).
    mismatch: tuple[tuple[str, str], ...] = ()
    # "confirmed": a cell meeting every condition fails. "conditional": the report's failure depends on
    # something the cell's facts cannot show (`condition` says what): a match is at-risk, never a verdict.
    certainty: Certainty
    condition: str = ""
    fixed: str = Field(min_length=1)
    workaround: str = Field(min_length=1)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("gpu_arch")
    @classmethod
    def _archs(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            if not re.match(ARCH_PATTERN, value):
                raise ValueError(f"{value!r} is not a GPU arch like sm_100")
        return values

    @field_validator("flags")
    @classmethod
    def _flags(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            for alternative in value.removeprefix("!").split(" | "):
                words = alternative.split()
                if not 1 <= len(words) <= 2 or not words[0].startswith("--"):
                    raise ValueError(f"{value!r}: each alternative is '--flag' or '--flag value'")
        return values

    @field_validator("env")
    @classmethod
    def _env(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            if not re.match(r"^!?[A-Za-z_][A-Za-z0-9_]*(=.*)?$", value):
                raise ValueError(f"{value!r} is not NAME, NAME=value, !NAME or !NAME=value")
        return values

    @model_validator(mode="after")
    def _condition_said(self) -> Specific:
        if self.certainty == "conditional" and not self.condition.strip():
            raise ValueError("a conditional advisory says its `condition`: what may not hold for a cell")
        return self


class OsvRecord(_Record):
    schema_version: str | None = None
    id: str = Field(pattern=ID_PATTERN)
    modified: str
    published: str | None = None
    aliases: tuple[str, ...] = ()
    related: tuple[str, ...] = ()
    summary: str = Field(min_length=1, max_length=200)
    details: str = Field(min_length=1)
    affected: tuple[Affected, ...] = Field(min_length=1)
    references: tuple[Reference, ...] = Field(min_length=1)
    database_specific: Specific


# ------------------------------------------------------------------------------------------- the checked record


@dataclass(frozen=True, kw_only=True)
class VersionRange:
    """One OSV ECOSYSTEM range: its events in order, read as OSV reads them."""

    events: tuple[tuple[str, str], ...]  # (kind, version): introduced | fixed | last_affected

    def contains(self, version: Version) -> bool:
        inside = False
        for kind, text in self.events:
            if kind == "introduced":
                if text == "0" or version >= Version(text):
                    inside = True
            elif kind == "fixed":
                if version >= Version(text):
                    inside = False
            elif version > Version(text):  # last_affected
                inside = False
        return inside

    def __str__(self) -> str:
        words = {"introduced": ">=", "fixed": "<", "last_affected": "<="}
        parts = [f"{words[kind]}{text}" for kind, text in self.events if not (kind == "introduced" and text == "0")]
        return ",".join(parts) or "any version"


@dataclass(frozen=True, kw_only=True)
class AffectedPackage:
    name: str  # canonical (PEP 503)
    ranges: tuple[VersionRange, ...]
    versions: tuple[str, ...]

    def contains(self, version: str) -> bool:
        try:
            parsed = Version(version)
        except InvalidVersion:
            return False
        return any(parsed == Version(v) for v in self.versions) or any(r.contains(parsed) for r in self.ranges)

    def describe(self) -> str:
        said = [str(r) for r in self.ranges] + [f"=={v}" for v in self.versions]
        return f"{self.name} {' or '.join(said)}"


@dataclass(frozen=True, kw_only=True)
class Advisory:
    id: str
    summary: str
    details: str
    references: tuple[str, ...]
    affected: tuple[AffectedPackage, ...]
    cls: str
    gpu_arch: tuple[str, ...]
    flags: tuple[str, ...]
    env: tuple[str, ...]
    modes: tuple[str, ...]
    architectures: tuple[str, ...]
    mismatch: tuple[tuple[str, str], ...]
    certainty: Certainty
    condition: str
    fixed: str
    workaround: str
    file: str  # the file it was read from (for messages)

    @property
    def source(self) -> str:
        """The first reference: the public report the advisory rests on."""
        return self.references[0]

    @property
    def verdict(self) -> str:
        """What a cell it affects is predicted to end with."""
        return f"predicted-fail:{self.cls}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "summary": self.summary,
            "class": self.cls,
            "source": self.source,
            "references": list(self.references),
            "affected": [p.describe() for p in self.affected],
            "gpu_arch": list(self.gpu_arch),
            "flags": list(self.flags),
            "env": list(self.env),
            "modes": list(self.modes),
            "architectures": list(self.architectures),
            "mismatch": [list(pair) for pair in self.mismatch],
            "certainty": self.certainty,
            "condition": self.condition,
            "fixed": self.fixed,
            "workaround": self.workaround,
        }

    @classmethod
    def of(cls, record: OsvRecord, file: str) -> Advisory:
        specific = record.database_specific
        affected = tuple(
            AffectedPackage(
                name=canonicalize_name(a.package.name),
                ranges=tuple(VersionRange(events=tuple(_event(e) for e in r.events)) for r in a.ranges),
                versions=a.versions,
            )
            for a in record.affected
        )
        return cls(
            id=record.id,
            summary=record.summary,
            details=record.details,
            references=tuple(r.url for r in record.references),
            affected=affected,
            cls=specific.class_,
            gpu_arch=specific.gpu_arch,
            flags=specific.flags,
            env=specific.env,
            modes=specific.modes,
            architectures=specific.architectures,
            mismatch=tuple((canonicalize_name(a), canonicalize_name(b)) for a, b in specific.mismatch),
            certainty=specific.certainty,
            condition=specific.condition,
            fixed=specific.fixed,
            workaround=specific.workaround,
            file=file,
        )


def _event(event: Event) -> tuple[str, str]:
    for kind in ("introduced", "fixed", "last_affected"):
        value = getattr(event, kind)
        if value is not None:
            return kind, value
    raise AssertionError("validated: one kind per event")
