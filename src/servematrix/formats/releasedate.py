"""When a release was published: the newest upload time of its files on the index (PEP 691 JSON with PEP 700's
`upload-time`), the moment a lock "as released" is resolved at (uv's `--exclude-newer`).

Read from the index the lock is made from, so a mirror answers it too; trust_env gives the same CA bundle, proxy
and .netrc settings that uv and pip read. An index without upload times (a plain PEP 503 page) cannot say:
`ReleaseDateError`, never a guess.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from servematrix.formats.indexpage import PageError, get_page
from servematrix.formats.lockfile import PYPI_INDEX_URL

ACCEPT = "application/vnd.pypi.simple.v1+json"


class ReleaseDateError(RuntimeError):
    """The index did not say when the release was published."""


def _version_of(name: str, filename: str) -> Version | None:
    try:
        if filename.endswith(".whl"):
            return parse_wheel_filename(filename)[1]
        if filename.endswith((".tar.gz", ".zip")):
            project, version = parse_sdist_filename(filename)
            return version if canonicalize_name(project) == name else None
    except (ValueError, InvalidVersion):
        return None
    return None


# An upload time this far ahead of this host's clock is not a past publication (clocks drift by seconds, not days).
FUTURE_SLACK = timedelta(days=1)


def _moment(value: object, name: str, version: str, filename: str) -> datetime:
    """One file's `upload-time` as an aware UTC moment; ReleaseDateError for anything PEP 700 does not allow
    (not a string, not a date, no UTC offset, later than now)."""
    where = f"the index's upload time of {name} {version} ({filename})"
    if not isinstance(value, str):
        raise ReleaseDateError(f"{where} is not a date string: {value!r:.80}")
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ReleaseDateError(f"{where} is not a date: {value!r:.80} ({exc})") from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ReleaseDateError(f"{where} has no UTC offset: {value!r:.80} (PEP 700 gives UTC times)")
    moment = moment.astimezone(UTC)
    if moment > datetime.now(UTC) + FUTURE_SLACK:
        raise ReleaseDateError(f"{where} is in the future: {value!r:.80}, so it cannot say when it was published")
    return moment


def upload_time(files: list[dict], name: str, version: str) -> str:
    """The newest `upload-time` of `version`'s files in a PEP 691 file list, as uv's --exclude-newer takes it
    (RFC 3339, UTC, whatever offset each file's time is given in). Raises ReleaseDateError when the release
    has no file, no file says when, or a file's time is not a past moment with an offset."""
    wanted = Version(version)
    times = [
        _moment(f["upload-time"], name, version, str(f.get("filename", "")))
        for f in files
        if isinstance(f, dict) and f.get("upload-time") and _version_of(name, str(f.get("filename", ""))) == wanted
    ]
    if not times:
        raise ReleaseDateError(f"the index gives no upload time for {name} {version}")
    # One second past the last file: uv excludes what is newer than the moment, and the release must be in.
    newest = max(times).replace(microsecond=0) + timedelta(seconds=1)
    return newest.strftime("%Y-%m-%dT%H:%M:%SZ")


def release_date(package: str, version: str, index_url: str | None = None, *, timeout_s: float = 60) -> str:
    """When `package` `version` was published on the index (the default one when None)."""
    name = canonicalize_name(package)
    url = f"{(index_url or PYPI_INDEX_URL).rstrip('/')}/{name}/"
    try:
        with httpx.Client(timeout=timeout_s, follow_redirects=True, trust_env=True) as client:
            response = get_page(client, url, headers={"Accept": ACCEPT})
        if response.status_code != 200:
            raise ReleaseDateError(f"cannot read when {name} {version} was published: HTTP {response.status_code}")
        if "json" not in response.headers.get("content-type", ""):
            raise ReleaseDateError(f"the index answers {name} without upload times (no PEP 691 JSON)")
        files = response.json()["files"]
    except (httpx.HTTPError, PageError, ValueError, KeyError, TypeError) as exc:
        raise ReleaseDateError(
            f"cannot read when {name} {version} was published: {type(exc).__name__}: {exc}"
        ) from None
    return upload_time(files, name, version)
