"""A project's files on the index, read from its simple API as PEP 691 JSON: each file's version, wheel tags,
upload time (PEP 700) and yanked state, the API uv and pip install from, so a mirror or a proxy answers it too
(trust_env: the same CA bundle, proxy and .netrc settings they read). A release's METADATA is read from the
index's PEP 714 `.metadata` file where it serves one, else from the wheel by HTTP ranges
(`formats/remotewheel.py`), and cached beside the resolve stage's (`release-pins/`).

An index that does not answer is `IndexUnavailable` (a fault: the command says so in one line and exits 1); a
project the index does not have, or an answer that is not PEP 691 JSON, is the user's `InputError`.
"""

from __future__ import annotations

import email.parser
import email.policy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit, urlunsplit

import httpx
from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from servematrix.errors import InputError
from servematrix.formats.lockfile import marker_environment
from servematrix.formats.remotewheel import wheel_metadata
from servematrix.util import atomic_write

ACCEPT = "application/vnd.pypi.simple.v1+json"
TIMEOUT_S = 60.0


class IndexUnavailable(Exception):
    """The index did not answer (down, unreachable, a server error): nothing was decided, run it again."""


@dataclass(frozen=True, kw_only=True)
class IndexFile:
    filename: str
    url: str
    version: Version
    tags: frozenset[Tag] | None  # None: an sdist
    uploaded: datetime | None
    yanked: bool
    yank_reason: str
    size: int | None
    core_metadata: bool  # the index serves `url + ".metadata"` (PEP 658/714)


@dataclass(frozen=True, kw_only=True)
class Release:
    """One version of a project on the index, with its files."""

    version: Version
    files: tuple[IndexFile, ...]

    @property
    def yanked(self) -> bool:
        """Yanked when every file is (an installer then skips it unless pinned exactly)."""
        return all(f.yanked for f in self.files)

    @property
    def yank_reason(self) -> str:
        return next((f.yank_reason for f in self.files if f.yank_reason), "")

    @property
    def uploaded(self) -> datetime | None:
        """When the release appeared on the index: its first file's upload time (None: the index does not say)."""
        times = [f.uploaded for f in self.files if f.uploaded is not None]
        return min(times) if times else None

    def wheel(self, tags: Sequence[Tag]) -> IndexFile | None:
        """The wheel an installer would pick for these tags (best first), if the release has one."""
        rank = {tag: index for index, tag in enumerate(tags)}
        best: tuple[int, IndexFile] | None = None
        for file in self.files:
            if file.tags is None or file.yanked:
                continue
            ranks = [rank[t] for t in file.tags if t in rank]
            if ranks and (best is None or min(ranks) < best[0]):
                best = (min(ranks), file)
        return best[1] if best else None


def shown_url(url: str) -> str:
    """An index URL as messages show it: without its credentials."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    netloc = f"***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def read_project(package: str, index_url: str, *, timeout_s: float = TIMEOUT_S) -> list[Release]:
    """Every release of `package` on the index that has a file, oldest first."""
    name = canonicalize_name(package)
    page = f"{index_url.rstrip('/')}/{name}/"
    shown = shown_url(page)
    try:
        with httpx.Client(timeout=timeout_s, follow_redirects=True, trust_env=True) as client:
            response = client.get(page, headers={"Accept": ACCEPT})
    except httpx.HTTPError as exc:
        raise IndexUnavailable(f"the index does not answer ({shown}): {type(exc).__name__}: {exc}") from None
    if response.status_code == 404:
        raise InputError(f"{name}: no such project on the index {shown}")
    if response.status_code != 200:
        raise IndexUnavailable(f"the index answered HTTP {response.status_code} for {shown}")
    if "json" not in response.headers.get("content-type", ""):
        raise InputError(
            f"{shown}: the index does not serve PEP 691 JSON (no upload dates); point --index-url at one that does"
        )
    try:
        files = list(_files(name, page, response.json()["files"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{shown}: not a PEP 691 project page ({type(exc).__name__}: {exc})") from None
    by_version: dict[Version, list[IndexFile]] = {}
    for file in files:
        by_version.setdefault(file.version, []).append(file)
    return [Release(version=v, files=tuple(by_version[v])) for v in sorted(by_version)]


def _files(name: str, page: str, entries: Iterable[Any]) -> Iterable[IndexFile]:
    for entry in entries:
        filename = str(entry["filename"])
        parsed = _parse_filename(name, filename)
        if parsed is None:
            continue  # an egg, an exe, another project's file: nothing an installer would pick
        version, tags = parsed
        yanked = entry.get("yanked", False)
        uploaded = entry.get("upload-time")
        metadata = entry.get("core-metadata", entry.get("data-dist-info-metadata", False))
        yield IndexFile(
            filename=filename,
            url=urljoin(page, str(entry["url"])),
            version=version,
            tags=tags,
            uploaded=datetime.fromisoformat(str(uploaded).replace("Z", "+00:00")) if uploaded else None,
            yanked=bool(yanked),
            yank_reason=yanked if isinstance(yanked, str) else "",
            size=int(entry["size"]) if isinstance(entry.get("size"), int) else None,
            core_metadata=bool(metadata),
        )


def _parse_filename(name: str, filename: str) -> tuple[Version, frozenset[Tag] | None] | None:
    try:
        if filename.endswith(".whl"):
            project, version, _, tags = parse_wheel_filename(filename)
            return (version, frozenset(tags)) if canonicalize_name(project) == name else None
        project, version = parse_sdist_filename(filename)
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None
    return (version, None) if canonicalize_name(project) == name else None


def release_metadata(file: IndexFile, package: str, *, cache_dir: Path, timeout_s: float = TIMEOUT_S) -> str:
    """The METADATA of a release's wheel, cached on disk (the resolve stage's cache of release METADATA).
    Raises RemoteWheelError when it cannot be read."""
    name = canonicalize_name(package)
    cached = cache_dir / f"{name}-{file.version}.METADATA"
    if cached.is_file():
        return cached.read_text(encoding="utf-8")
    text: str | None = None
    if file.core_metadata:
        try:
            with httpx.Client(timeout=timeout_s, follow_redirects=True, trust_env=True) as client:
                response = client.get(f"{file.url}.metadata")
            if response.status_code == 200:
                text = response.text
        except httpx.HTTPError:
            text = None  # the wheel itself still says
    if text is None:
        text = wheel_metadata(file.url, name, size=file.size, timeout_s=timeout_s)
    atomic_write(cached, text)
    return text


def requires(metadata: str, *, python_version: str, platform: str) -> dict[str, str]:
    """A METADATA file's Requires-Dist on the target, without extras: {package: specifier and marker-free
    text}. Two releases whose requirements are equal here install the same way."""
    env = marker_environment(python_version, platform)
    found: dict[str, str] = {}
    headers = email.parser.HeaderParser(policy=email.policy.compat32).parsestr(metadata)
    for value in headers.get_all("Requires-Dist") or ():
        try:
            req = Requirement(" ".join(value.split()))
        except InvalidRequirement:
            continue
        if req.marker is not None:
            try:
                if not req.marker.evaluate(env):
                    continue
            except (InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
                continue
        name = canonicalize_name(req.name)
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        found[name] = f"{extras}{req.specifier}" if (extras or req.specifier) else "*"
    return dict(sorted(found.items()))
