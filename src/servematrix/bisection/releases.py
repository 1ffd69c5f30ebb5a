"""The releases a bisection searches: a package's versions on the index, between the two ends.

Read from the index's simple API (PEP 691 JSON, with the PEP 503 HTML page as the fallback), the API uv and
pip install from, so a mirror or a proxy answers it too. HTTPS trusts the system's CA bundle where
`SSL_CERT_FILE` names one (a TLS-intercepting proxy re-signs certificates), as uv and pip do.

A release is yanked when every file of it is. Pre-releases (including dev releases) and yanked releases
are left out unless asked for; the two ends are always kept: the user named them.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from servematrix.errors import InputError
from servematrix.formats.indexpage import PageError, get_page
from servematrix.formats.lockfile import PYPI_INDEX_URL

# The variables that change uv's and pip's default index for them (the first one set wins).
INDEX_VARIABLES = ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL")
ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
TIMEOUT_S = 60.0


@dataclass(frozen=True, kw_only=True)
class Release:
    version: str  # as the index spells it
    yanked: bool

    @property
    def parsed(self) -> Version:
        return Version(self.version)


def default_index(matrix_index: str | None = None) -> str:
    """The index a version list comes from: the matrix's CUDA kind's, else the one uv would use."""
    if matrix_index:
        return matrix_index
    return next((os.environ[v] for v in INDEX_VARIABLES if os.environ.get(v, "").strip()), PYPI_INDEX_URL)


def fetch_releases(package: str, index_url: str, *, client: httpx.Client | None = None) -> list[Release]:
    """Every release of `package` on the index that has a file, in version order."""
    name = canonicalize_name(package)
    url = f"{index_url.rstrip('/')}/{name}/"
    shown = _redact_url(url)
    try:
        if client is None:
            with httpx.Client(verify=_tls(), timeout=TIMEOUT_S, follow_redirects=True) as own:
                response = get_page(own, url, headers={"Accept": ACCEPT})
        else:
            response = get_page(client, url, headers={"Accept": ACCEPT})
    except httpx.HTTPError as exc:
        raise InputError(f"cannot read the releases of {name} from {shown}: {type(exc).__name__}: {exc}") from None
    except PageError as exc:  # a page past the bound once inflated (a gzip bomb), or in an unknown encoding
        raise InputError(f"cannot read the releases of {name} from {shown}: {exc}") from None
    if response.status_code == 404:
        raise InputError(f"{name}: no such project on the index {shown}")
    if response.status_code != 200:
        raise InputError(f"cannot read the releases of {name} from {shown}: HTTP {response.status_code}")
    kind = response.headers.get("content-type", "")
    try:
        files = _json_files(response.json()) if "json" in kind else _html_files(response.text)
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{shown}: not a package index page ({type(exc).__name__}: {exc})") from None
    return releases_from_files(name, files)


def releases_from_files(name: str, files: Iterable[tuple[str, bool]]) -> list[Release]:
    """Releases from (filename, yanked) pairs: a version is yanked when all of its files are."""
    all_yanked: dict[Version, bool] = {}
    spelled: dict[Version, str] = {}
    for filename, yanked in files:
        version = _file_version(name, filename)
        if version is None:
            continue
        all_yanked[version] = all_yanked.get(version, True) and yanked
        spelled.setdefault(version, str(version))
    return [Release(version=spelled[v], yanked=all_yanked[v]) for v in sorted(all_yanked)]


def check_ends(good: str, bad: str) -> tuple[Version, Version]:
    """The two ends as versions: both valid, and not the same release."""
    ends = []
    for flag, text in (("--good", good), ("--bad", bad)):
        try:
            ends.append(Version(text))
        except InvalidVersion:
            raise InputError(f"{flag} {text!r} is not a version") from None
    if ends[0] == ends[1]:
        raise InputError(f"--good and --bad are the same version ({good}): give two releases to search between")
    return ends[0], ends[1]


def between(
    releases: Sequence[Release], good: str, bad: str, *, pre: bool = False, yanked: bool = False, package: str = ""
) -> list[str]:
    """The versions from the older end to the newer one, both included, oldest first."""
    ends = check_ends(good, bad)
    known = {r.parsed: r for r in releases}
    for flag, text, version in (("--good", good, ends[0]), ("--bad", bad, ends[1])):
        if version not in known:
            raise InputError(
                f"{flag} {text}: {package or 'the package'} has no such release on the index{_near(releases, version)}"
            )
    low, high = sorted(ends)
    kept = []
    for release in releases:
        version = release.parsed
        if not low <= version <= high:
            continue
        if version in (low, high) or ((pre or not version.is_prerelease) and (yanked or not release.yanked)):
            kept.append(release.version)
    return kept


def _near(releases: Sequence[Release], version: Version) -> str:
    older = [r.version for r in releases if r.parsed < version][-1:]
    newer = [r.version for r in releases if r.parsed > version][:1]
    around = [*older, *newer]
    return f" (nearest: {', '.join(around)})" if around else ""


def _file_version(name: str, filename: str) -> Version | None:
    try:
        if filename.endswith(".whl"):
            project, version, _, _ = parse_wheel_filename(filename)
        else:
            project, version = parse_sdist_filename(filename)
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None  # an egg, an exe, a file named unlike its project: nothing an installer would pick
    return version if canonicalize_name(project) == name else None


def _json_files(data: Mapping[str, Any]) -> list[tuple[str, bool]]:
    return [(str(f["filename"]), bool(f.get("yanked"))) for f in data["files"]]


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.files: list[tuple[str, bool]] = []
        self._open: bool | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._open = "data-yanked" in dict(attrs)

    def handle_data(self, data: str) -> None:
        if self._open is not None and data.strip():
            self.files.append((data.strip(), self._open))

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._open = None


def _html_files(text: str) -> list[tuple[str, bool]]:
    parser = _Anchors()
    parser.feed(text)
    return parser.files


def _redact_url(url: str) -> str:
    """An index URL as shown in messages: without its credentials."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"***@{host}:{parts.port}" if parts.port is not None else f"***@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _tls() -> ssl.SSLContext | bool:
    """The system CA bundle when SSL_CERT_FILE names one, else httpx's default."""
    bundle = os.environ.get("SSL_CERT_FILE", "")
    return ssl.create_default_context(cafile=bundle) if bundle and os.path.isfile(bundle) else True
