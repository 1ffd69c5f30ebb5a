"""Which of the index's releases a matrix lacks, axis by axis, and which of them `--add` writes.

- The engine's own axis (sglang): every release from the matrix's oldest value (or `--since`) to the index's
  newest, each a new row of the table.
- A pinnable axis (flashinfer, torch) and a package axis: every missing release from the axis's oldest
  version on is listed, but `--add` writes only the index's newest: each value crosses every release of the
  engine axis, so one value is a whole column of new cells. A release that a matrix release pins (engine data
  `[pins]`) is covered by the `pinned` cells already. An axis of `pinned` (or `locked`) alone follows each
  release's own pin and is not watched.

Left out, with a note: pre-releases (unless asked), a yanked release, a release without a wheel for every
platform and Python the matrix targets (its GPU kinds' `platform`, its `python`), and a post release whose
Requires-Dist on the target is the same as its base release's (it would install and decide the same way).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.tags import Tag
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from servematrix.config.spec import LOCKED, PINNED, Spec
from servematrix.errors import InputError
from servematrix.formats.lockfile import target_tags
from servematrix.formats.remotewheel import RemoteWheelError
from servematrix.releases.index import Release, read_project, release_metadata, requires

EVERY = "every"  # the engine's own axis: each missing release is added
NEWEST = "newest"  # a companion axis: the index's newest is added


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """A release the matrix lacks: `add` when `--add` writes it; `note` says why not, or what differs."""

    version: str
    uploaded: str | None  # YYYY-MM-DD, as the index says
    add: bool
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class LeftOut:
    version: str
    uploaded: str | None
    reason: str


@dataclass(frozen=True, kw_only=True)
class AxisReport:
    axis: str
    package: str
    policy: str  # EVERY, NEWEST, or "" when the axis is not watched
    present: tuple[str, ...]
    low: str | None = None  # the range's lower end
    low_from: str = ""  # what set it: the matrix's oldest value, or --since
    newest: str | None = None  # the index's newest release that would be considered
    missing: tuple[Candidate, ...] = ()
    left_out: tuple[LeftOut, ...] = ()
    note: str = ""

    @property
    def to_add(self) -> tuple[str, ...]:
        return tuple(c.version for c in self.missing if c.add)

    def to_json(self) -> dict[str, Any]:
        return {
            "axis": self.axis,
            "package": self.package,
            "policy": self.policy or None,
            "present": list(self.present),
            "range": {"from": self.low, "from_reason": self.low_from, "to": self.newest},
            "missing": [vars(c) for c in self.missing],
            "left_out": [vars(s) for s in self.left_out],
            "note": self.note,
        }


@dataclass(frozen=True, kw_only=True)
class WatchOptions:
    index_url: str
    cache_dir: Path
    since: Mapping[str, str] = field(default_factory=dict)  # axis -> the lowest version to consider
    only: Mapping[str, frozenset[str]] = field(default_factory=dict)  # axis -> the releases to keep alone
    pre: bool = False


def watched_axes(spec: Spec) -> list[tuple[str, str]]:
    """(axis, package) for each version axis of the matrix: the engine's axes with a requirement, then the
    matrix's package axes."""
    out: list[tuple[str, str]] = []
    for axis in spec.engine.axes:
        template = spec.engine.requirements.for_axis(axis)
        if template is not None:
            out.append((axis, str(canonicalize_name(Requirement(template.format(version="0")).name))))
    out += [(axis, axis) for axis in spec.file.packages]
    return out


def check_axis_versions(spec: Spec, flag: str, wanted: Mapping[str, Sequence[str]]) -> None:
    """`--since`/`--only` name a watched axis and a version."""
    axes = dict(watched_axes(spec))
    for axis, versions in wanted.items():
        if axis not in axes:
            raise InputError(f"{flag} {axis}=...: not a version axis of {spec.path} (axes: {', '.join(axes)})")
        for version in versions:
            try:
                Version(version)
            except InvalidVersion:
                raise InputError(f"{flag} {axis}={version}: not a version") from None


def watch(
    spec: Spec, options: WatchOptions, *, read: Callable[[str, str], list[Release]] = read_project
) -> list[AxisReport]:
    """What each watched axis lacks. Reads the index once per package (`read`: package, index URL)."""
    check_axis_versions(spec, "--since", {a: [v] for a, v in options.since.items()})
    check_axis_versions(spec, "--only", {a: sorted(v) for a, v in options.only.items()})
    reports = []
    for axis, package in watched_axes(spec):
        if options.only and axis not in options.only:
            continue
        reports.append(_axis(spec, axis, package, options, read))
    for axis, versions in options.only.items():
        report = next(r for r in reports if r.axis == axis)
        unknown = sorted(versions - {c.version for c in report.missing}, key=Version)
        if unknown:
            lacks = ", ".join(c.version for c in report.missing) or "none"
            raise InputError(
                f"--only {axis}={unknown[0]}: not a release this matrix lacks and could add (it lacks: {lacks})"
            )
    return reports


def _axis(
    spec: Spec, axis: str, package: str, options: WatchOptions, read: Callable[[str, str], list[Release]]
) -> AxisReport:
    values = spec.file.axes.get(axis, [])
    present = tuple(values)
    explicit = sorted(Version(v) for v in values if v not in (PINNED, LOCKED))
    if axis in options.since:
        low, low_from = Version(options.since[axis]), "--since"
    elif explicit:
        low, low_from = explicit[0], "the matrix's oldest value"
    else:
        return AxisReport(
            axis=axis,
            package=package,
            policy="",
            present=present,
            note=f"only {', '.join(repr(v) for v in values)}: each release's own pin decides; not watched",
        )
    policy = EVERY if axis == spec.engine.version_axis else NEWEST
    covered = _pinned_by(spec, axis) if PINNED in values else {}
    targets = _targets(spec)
    releases = {r.version: r for r in read(package, options.index_url)}
    considered = [
        r
        for v, r in sorted(releases.items())
        if v >= low and v not in explicit and (options.pre or not v.is_prerelease)
    ]
    # The newest installable release, present ones included: a companion axis that has it needs nothing.
    stable = [
        r
        for v, r in releases.items()
        if v >= low and not (v.is_prerelease or r.yanked) and _missing_wheels(r, targets) == ""
    ]
    newest = str(max((r.version for r in releases.values() if not (r.version.is_prerelease or r.yanked)), default=low))
    found: list[Candidate] = []
    left: list[LeftOut] = []
    only = options.only.get(axis)
    for release in considered:
        version, day = str(release.version), _day(release)
        if only is not None and version not in only:
            continue
        reason = _left_out_reason(release, covered, targets)
        if reason:
            left.append(LeftOut(version=version, uploaded=day, reason=reason))
            continue
        post = _post_release_change(release, releases, package, spec, options)
        if post is not None and post.startswith("same"):
            left.append(LeftOut(version=version, uploaded=day, reason=post))
            continue
        found.append(Candidate(version=version, uploaded=day, add=False, note=post or ""))
    newest_addable = _frontier(stable, left)
    missing = tuple(_decide(c, policy, newest_addable, only, axis) for c in found)
    return AxisReport(
        axis=axis,
        package=package,
        policy=policy,
        present=present,
        low=str(low),
        low_from=low_from,
        newest=newest,
        missing=missing,
        left_out=tuple(left),
    )


def _frontier(stable: Sequence[Release], left: Sequence[LeftOut]) -> str | None:
    """The release a companion axis adds: the newest installable one, or, where that is a post release with
    its base's Requires-Dist, the base (they install the same way)."""
    if not stable:
        return None
    newest = max(r.version for r in stable)
    same = any(s.version == str(newest) and s.reason.startswith("same Requires-Dist") for s in left)
    return newest.base_version if same and newest.post is not None else str(newest)


def _decide(candidate: Candidate, policy: str, newest: str | None, only: frozenset[str] | None, axis: str) -> Candidate:
    if only is not None or policy == EVERY:
        return Candidate(version=candidate.version, uploaded=candidate.uploaded, add=True, note=candidate.note)
    if candidate.version == newest:
        note = "; ".join(filter(None, ["the index's newest", candidate.note]))
        return Candidate(version=candidate.version, uploaded=candidate.uploaded, add=True, note=note)
    note = "; ".join(
        filter(None, [candidate.note, f"--add writes the newest alone (--only {axis}={candidate.version})"])
    )
    return Candidate(version=candidate.version, uploaded=candidate.uploaded, add=False, note=note)


def _pinned_by(spec: Spec, axis: str) -> dict[Version, str]:
    """The releases of `axis` that the matrix's engine releases pin (engine data), by who pins them."""
    out: dict[Version, str] = {}
    for release in spec.file.axes.get(spec.engine.version_axis, []):
        pin = spec.engine.pins.get(release, {}).get(axis)
        if pin is not None:
            out.setdefault(Version(pin), f"{spec.engine.version_axis} {release}")
    return out


def _targets(spec: Spec) -> dict[str, list[Tag]]:
    """Each platform the matrix's GPU kinds run on, with its Python: the wheel tags a release needs."""
    kinds = spec.file.axes.get("gpu", list(spec.file.gpu))
    platforms = sorted({spec.file.gpu[k].platform for k in kinds if k in spec.file.gpu})
    python = spec.file.python
    return {f"cp{python.replace('.', '')[:3]} {p}": target_tags(python, p) for p in platforms}


def _missing_wheels(release: Release, targets: Mapping[str, list[Tag]]) -> str:
    return ", ".join(name for name, tags in targets.items() if release.wheel(tags) is None)


def _left_out_reason(release: Release, covered: Mapping[Version, str], targets: Mapping[str, list[Tag]]) -> str:
    if release.yanked:
        return f"yanked ({release.yank_reason})" if release.yank_reason else "yanked"
    if release.version in covered:
        return f"pinned by {covered[release.version]}: its `pinned` cells have it"
    lacking = _missing_wheels(release, targets)
    if lacking:
        has = "an sdist only" if all(f.tags is None for f in release.files) else "other wheels only"
        return f"no wheel for {lacking} ({has})"
    return ""


def _post_release_change(
    release: Release, releases: Mapping[Version, Release], package: str, spec: Spec, options: WatchOptions
) -> str | None:
    """For a post release: "same Requires-Dist as BASE" (left out), what differs from BASE, or why it could
    not be compared. None for any other release."""
    if release.version.post is None:
        return None
    base_version = Version(release.version.base_version)
    base = releases.get(base_version)
    if base is None:
        return f"post release of {base_version}, which the index lacks"
    platform, tags = next(iter(_targets(spec).items()))
    wheels = (release.wheel(tags), base.wheel(tags))
    if wheels[0] is None or wheels[1] is None:
        return f"Requires-Dist not compared with {base_version}: no wheel of both for {platform}"
    python, target = spec.file.python, platform.split(" ", 1)[1]
    try:
        post_req, base_req = (
            requires(release_metadata(w, package, cache_dir=options.cache_dir), python_version=python, platform=target)
            for w in wheels
            if w is not None
        )
    except RemoteWheelError as exc:
        return f"Requires-Dist not compared with {base_version}: {str(exc).splitlines()[0][:160]}"
    if post_req == base_req:
        return f"same Requires-Dist as {base_version}"
    changed = [
        f"{name} {base_req.get(name, '(none)')} -> {post_req.get(name, '(none)')}"
        for name in sorted(set(post_req) | set(base_req))
        if post_req.get(name) != base_req.get(name)
    ]
    return f"Requires-Dist differs from {base_version}: {', '.join(changed)}"


def _day(release: Release) -> str | None:
    return release.uploaded.strftime("%Y-%m-%d") if release.uploaded else None
