"""Resolve stage: one hashed, reproducible lock file per environment, made with `uv pip compile`.

A lock is keyed by the hash of its resolution inputs, which is written into the lock's own header, so an
unchanged request reuses the file without calling uv. Failures are split in two on purpose: a resolver
conflict is a property of the versions (`unresolvable`, a verdict worth publishing), while anything the
network did is a property of the day (`error`, retried next run). Mixing them up would publish a false
"these versions cannot be installed together".
"""

from __future__ import annotations

import email.parser
import email.policy
import functools
import hashlib
import json
import os
import re
import sys
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from servematrix.config.spec import AS_RELEASED, RESOLUTION
from servematrix.formats.lockfile import (
    DEFAULT_PLATFORM,
    DEFAULT_PYTHON_VERSION,
    LOCK_FORMAT,
    PYPI_INDEX_URL,
    LockHeader,
    index_args,
    marker_environment,
    parse_pins,
    read_lock_header,
    render_header,
)
from servematrix.formats.releasedate import ReleaseDateError, release_date
from servematrix.formats.remotewheel import RemoteWheelError, wheel_metadata
from servematrix.stages.uvfailure import Status, classify_failure, failure_kind, trim_reason
from servematrix.util import Captured, atomic_write, run_captured, uv_env

__all__ = [
    "ReleasePinsError",
    "ResolveOutcome",
    "ResolveRequest",
    "classify_failure",
    "default_pins_cache_dir",
    "inputs_hash",
    "lock_header",
    "parse_release_pins",
    "release_pins",
    "resolve",
    "resolve_cached",
    "resolve_many",
    "trim_reason",
]


# File names uv sees, relative to its working directory, so that uv's "# via -r requirements.in"
# annotations never carry a temporary absolute path into the lock.
_REQUIREMENTS_NAME = "requirements.in"
_OVERRIDES_NAME = "overrides.txt"

# PyPI's cache policy, said to uv in the working directory of each of its calls (a uv.toml there is merged
# with the user's configuration): an index page read in the last 10 minutes is fresh and a file never
# changes. That is what PyPI's own headers say (10 minutes for its pages, as uv's maintainers put it; a
# file is never re-uploaded), and uv honours them; a proxy that strips the headers (this development
# machine's does) makes uv fetch every page again in every process, 88 MB of pages for one sglang
# resolution here. With it, the resolutions of one run share one reading of the index through uv's cache.
# An explicit index is never resolved from: this names a policy, not an index; the indexes a request uses
# stay on the command line.
_UV_CONFIG_NAME = "uv.toml"
_UV_CONFIG = f"""\
[[index]]
name = "pypi-cache-policy"
url = "{PYPI_INDEX_URL}"
explicit = true
cache-control = {{ api = "max-age=600", files = "max-age=365000000, immutable" }}
"""

_ENV_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


# --------------------------------------------------------------------------------------------- request


@dataclass(frozen=True, kw_only=True)
class ResolveRequest:
    env_id: str
    requirements: tuple[str, ...]
    overrides: tuple[str, ...] = ()
    python_version: str = DEFAULT_PYTHON_VERSION
    platform: str = DEFAULT_PLATFORM
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    axes: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # env_id becomes a file name: refuse anything that could escape out_dir.
        if not _ENV_ID_RE.match(self.env_id):
            raise ValueError(f"env_id {self.env_id!r} must match {_ENV_ID_RE.pattern}")
        # Accept lists from callers but keep the frozen value immutable and hashable-ish.
        for name in ("requirements", "overrides", "extra_index_urls"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise TypeError(f"{name} must be a sequence of strings, not a single string")
            object.__setattr__(self, name, tuple(value))
        if not self.requirements:
            raise ValueError("requirements must not be empty")
        object.__setattr__(self, "axes", {str(k): str(v) for k, v in sorted(self.axes.items())})

    @property
    def main_package(self) -> Requirement | None:
        """The package whose release pins define a "crossing": the first exactly pinned requirement."""
        for text in self.requirements:
            req = _parse_requirement(text)
            if req is not None and _exact_version(req) is not None:
                return req
        return None


@dataclass(frozen=True, kw_only=True)
class ResolveOutcome:
    env_id: str
    status: Status
    reason: str
    pins: dict[str, str]
    lockfile: Path | None
    inputs_hash: str
    crossed: dict[str, dict[str, str]]
    cached: bool
    axes: Mapping[str, str] = field(default_factory=dict)

    def to_contract(self) -> dict:
        """The `servematrix lock --format json` element (design.md), plus the crossed pins."""
        return {
            "env_id": self.env_id,
            "axes": dict(sorted(self.axes.items())),
            "status": self.status,
            "reason": self.reason,
            "pins": dict(sorted(self.pins.items())),
            "lockfile": str(self.lockfile) if self.lockfile is not None else None,
            "crossed": {k: dict(v) for k, v in sorted(self.crossed.items())},
        }


class ReleasePinsError(RuntimeError):
    """The release's metadata could not be read; `status` says whose fault it is."""

    def __init__(self, status: Status, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


# ------------------------------------------------------------------------------------------ inputs hash


def _redact_url(url: str) -> str:
    """Drop credentials from an index URL: they must not reach a committed lock or its hash."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, f"***@{host}", parts.path, parts.query, parts.fragment))


def _canonical_inputs(req: ResolveRequest) -> dict:
    # Requirement order does not change a resolution, so it must not change the hash. The env_id is left
    # out: it names the file, the hash describes what is in it.
    return {
        "format": LOCK_FORMAT,
        "requirements": sorted(r.strip() for r in req.requirements),
        "overrides": sorted(o.strip() for o in req.overrides),
        "python_version": req.python_version,
        "platform": req.platform,
        "index_url": _redact_url(req.index_url) if req.index_url else None,
        "extra_index_urls": [_redact_url(u) for u in req.extra_index_urls],
        "axes": {str(k): str(v) for k, v in sorted(req.axes.items())},
    }


def inputs_hash(req: ResolveRequest) -> str:
    """sha256 (hex) of a canonical JSON of the resolution inputs; no paths, times or tool versions."""
    blob = json.dumps(_canonical_inputs(req), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


# ----------------------------------------------------------------------------------------------- header


def as_released(req: ResolveRequest) -> bool:
    """Whether `req` resolves as the index was when its engine release was published (`resolution`)."""
    return req.axes.get(RESOLUTION) == AS_RELEASED


def _exclude_newer(req: ResolveRequest) -> str | None:
    """uv's --exclude-newer for a request resolved as released: its main package's publication on the index."""
    if not as_released(req):
        return None
    main = req.main_package
    version = _exact_version(main) if main is not None else None
    if main is None or version is None:
        raise ReleasePinsError("error", "resolution as-released needs an exactly pinned engine release")
    try:
        return release_date(main.name, version, req.index_url)
    except ReleaseDateError as exc:
        raise ReleasePinsError("error", str(exc)) from None


def _compile_args(req: ResolveRequest, exclude_newer: str | None = None) -> list[str]:
    """The `uv pip compile` arguments shared by the real call and the header's reproduce line."""
    args = [_REQUIREMENTS_NAME]
    if req.overrides:
        args += ["--override", _OVERRIDES_NAME]
    args += [
        "--python-version",
        req.python_version,
        "--python-platform",
        req.platform,
        "--generate-hashes",
        "--no-header",
    ]
    if exclude_newer:
        args += ["--exclude-newer", exclude_newer]
    return args + index_args(req.index_url, req.extra_index_urls)


def lock_header(
    req: ResolveRequest,
    *,
    crossed: Mapping[str, Mapping[str, str]],
    resolver: str,
    exclude_newer: str | None = None,
) -> LockHeader:
    """The header of `req`'s lock: its canonical inputs (credentials redacted) and how to reproduce it."""
    canon = _canonical_inputs(req)
    command = [_redact_url(a) if "://" in a else a for a in _compile_args(req, exclude_newer)]
    return LockHeader(
        format=LOCK_FORMAT,
        inputs_hash=inputs_hash(req),
        env_id=req.env_id,
        axes=canon["axes"],
        requirements=tuple(canon["requirements"]),
        overrides=tuple(canon["overrides"]),
        python_version=req.python_version,
        platform=req.platform,
        index_url=canon["index_url"],
        extra_index_urls=tuple(canon["extra_index_urls"]),
        crossed={name: dict(pins) for name, pins in crossed.items()},
        resolver=resolver,
        command="uv pip compile " + " ".join(command),
    )


# ---------------------------------------------------------------------------------------------- running uv


def _uv_workdir(work: Path) -> Path:
    """A uv call's working directory: its configuration is the cache policy above."""
    (work / _UV_CONFIG_NAME).write_text(_UV_CONFIG, encoding="utf-8")
    return work


def _interpreter_args() -> list[str]:
    """The interpreter uv would build an sdist with, named: this one. Left to find one itself, every uv
    process searches the machine (with pyenv shims on PATH, 0.7-0.8 CPU-s: 40% of a cold resolution here).
    The target's markers and tags come from --python-version and --python-platform either way."""
    return ["--python", sys.executable] if sys.executable else []


def _run_uv(argv: list[str], *, cwd: Path, timeout_s: float) -> Captured:
    # A resolve must never download an interpreter; it only needs to reason about tags.
    run = run_captured(argv, cwd=cwd, env=uv_env(NO_COLOR="1"), timeout_s=timeout_s)
    if run.problem is not None:
        # Phrased so that classify_failure sees infrastructure, not a verdict.
        return replace(run, stderr=f"error: {run.problem}")
    return run


@functools.lru_cache(maxsize=8)
def _uv_version(uv: str) -> str:
    run = _run_uv([uv, "--version"], cwd=Path.cwd(), timeout_s=60)
    # "uv 0.13.9 (x86_64-unknown-linux-gnu)": the build triple is the machine's, not the lock's.
    words = run.stdout.split()
    return " ".join(words[:2]) if run.returncode == 0 and words else "uv (unknown version)"


def _compile(req: ResolveRequest, *, uv: str, timeout_s: float, exclude_newer: str | None = None) -> Captured:
    # Always online: an offline resolution from a partial cache succeeds with other versions than the
    # index's answer (it skips the versions whose metadata is not cached). Pages read moments ago are
    # reused online too, by the cache policy.
    with tempfile.TemporaryDirectory(prefix="servematrix-resolve-") as tmp:
        work = _uv_workdir(Path(tmp))
        (work / _REQUIREMENTS_NAME).write_text("\n".join(req.requirements) + "\n", encoding="utf-8")
        if req.overrides:
            (work / _OVERRIDES_NAME).write_text("\n".join(req.overrides) + "\n", encoding="utf-8")
        argv = [uv, "pip", "compile", *_compile_args(req, exclude_newer), *_interpreter_args(), "--color", "never"]
        return _run_uv(argv, cwd=work, timeout_s=timeout_s)


# ------------------------------------------------------------------------------------------ release pins


def default_pins_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "servematrix" / "release-pins"


def _parse_requirement(text: str) -> Requirement | None:
    try:
        return Requirement(text)
    except InvalidRequirement:
        return None


def _exact_version(req: Requirement) -> str | None:
    specs = list(req.specifier)
    if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
        return specs[0].version
    return None


def parse_release_pins(
    metadata: str, *, python_version: str = DEFAULT_PYTHON_VERSION, platform: str = DEFAULT_PLATFORM
) -> dict[str, str]:
    """Exact `==` pins among a METADATA file's unconditional Requires-Dist (extras are ignored)."""
    env = marker_environment(python_version, platform)
    pins: dict[str, str] = {}
    # METADATA is an RFC 822 message: the email parser joins a header's continuation lines.
    headers = email.parser.HeaderParser(policy=email.policy.compat32).parsestr(metadata)
    for value in headers.get_all("Requires-Dist") or ():
        req = _parse_requirement(" ".join(value.split()))
        if req is None:
            continue
        if req.marker is not None:
            try:
                if not req.marker.evaluate(env):
                    continue
            except (InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
                continue
        version = _exact_version(req)
        if version is not None:
            pins[canonicalize_name(req.name)] = version
    return dict(sorted(pins.items()))


def _fetch_metadata(
    name: str,
    version: str,
    *,
    uv: str,
    python_version: str,
    platform: str,
    index_url: str | None,
    extra_index_urls: tuple[str, ...],
    timeout_s: float,
) -> str:
    """METADATA of one release wheel: uv picks the wheel (the configured index, uv's cache), and only its
    METADATA is read, by HTTP ranges. Where that cannot be done (a file host that wants uv's credentials, a
    local index), uv installs the bare wheel and the file is read from there."""
    common = ["--python-version", python_version, "--python-platform", platform, *_interpreter_args()]
    common += ["--only-binary", ":all:", "--no-deps", "--color", "never", "--quiet"]
    common += index_args(index_url, extra_index_urls)
    with tempfile.TemporaryDirectory(prefix="servematrix-pins-") as tmp:
        work = _uv_workdir(Path(tmp))
        (work / _REQUIREMENTS_NAME).write_text(f"{name}=={version}\n", encoding="utf-8")
        which = _run_uv(
            [uv, "pip", "compile", _REQUIREMENTS_NAME, "--format", "pylock.toml", *common],
            cwd=work,
            timeout_s=timeout_s,
        )
        if which.returncode != 0:
            status, reason = classify_failure(which.stderr)
            raise ReleasePinsError(status, f"reading the pins of {name}=={version}: {reason}")
        wheel = _pylock_wheel(which.stdout, name)
        if wheel is not None and "url" in wheel:
            try:
                return wheel_metadata(wheel["url"], name, size=wheel.get("size"), timeout_s=timeout_s)
            except RemoteWheelError:
                pass
        # `uv pip install --no-deps --target` of the bare wheel hands back its dist-info, nothing resolved.
        installed = work / "installed"
        argv = [uv, "pip", "install", "--target", str(installed), *common, f"{name}=={version}"]
        run = _run_uv(argv, cwd=work, timeout_s=timeout_s)
        if run.returncode != 0:
            status, reason = classify_failure(run.stderr)
            raise ReleasePinsError(status, f"reading the pins of {name}=={version}: {reason}")
        for meta in sorted(installed.glob("*.dist-info/METADATA")):
            dist = meta.parent.name.removesuffix(".dist-info").rsplit("-", 1)[0]
            if canonicalize_name(dist) == name:
                return meta.read_text(encoding="utf-8")
        raise ReleasePinsError("error", f"no {name} dist-info in the installed wheel of {name}=={version}")


def _pylock_wheel(text: str, name: str) -> dict | None:
    """The first wheel of `name` in a pylock.toml (PEP 751: url or path, size, hashes), if it names one."""
    try:
        packages = tomllib.loads(text).get("packages", [])
    except tomllib.TOMLDecodeError:
        return None
    for package in packages:
        if canonicalize_name(str(package.get("name", ""))) == name and package.get("wheels"):
            return dict(package["wheels"][0])
    return None


def release_pins(
    package: str,
    version: str,
    *,
    cache_dir: Path,
    uv: str = "uv",
    python_version: str = DEFAULT_PYTHON_VERSION,
    platform: str = DEFAULT_PLATFORM,
    index_url: str | None = None,
    extra_index_urls: tuple[str, ...] = (),
    timeout_s: float = 600,
) -> dict[str, str]:
    """The exact `==` pins in the Requires-Dist of `package==version`'s wheel; METADATA cached on disk.

    Raises ReleasePinsError when the wheel cannot be fetched (status `error`) or does not exist
    (status `unresolvable`).
    """
    name = canonicalize_name(package)
    cached = Path(cache_dir) / f"{name}-{version}.METADATA"
    if not cached.is_file():
        metadata = _fetch_metadata(
            name,
            version,
            uv=uv,
            python_version=python_version,
            platform=platform,
            index_url=index_url,
            extra_index_urls=tuple(extra_index_urls),
            timeout_s=timeout_s,
        )
        atomic_write(cached, metadata, durable=True)
    return parse_release_pins(cached.read_text(encoding="utf-8"), python_version=python_version, platform=platform)


def _versions_equal(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def _crossings(req: ResolveRequest, *, uv: str, cache_dir: Path, timeout_s: float) -> dict[str, dict[str, str]]:
    if not req.overrides:
        return {}
    main = req.main_package
    if main is None:
        return {}
    pins = release_pins(
        main.name,
        _exact_version(main) or "",
        cache_dir=cache_dir,
        uv=uv,
        python_version=req.python_version,
        platform=req.platform,
        index_url=req.index_url,
        extra_index_urls=req.extra_index_urls,
        timeout_s=timeout_s,
    )
    crossed: dict[str, dict[str, str]] = {}
    for text in req.overrides:
        override = _parse_requirement(text)
        if override is None:
            continue
        name = canonicalize_name(override.name)
        used = _exact_version(override) or str(override.specifier)
        release_pin = pins.get(name)
        if release_pin is None:
            # The release leaves it to the resolver (kernels for sglang 0.5.12): pinning it still departs
            # from what the release would get, so it is recorded.
            crossed[name] = {"release_pin": "unpinned", "used": used}
            continue
        if not _versions_equal(used, release_pin):
            crossed[name] = {"release_pin": release_pin, "used": used}
    return dict(sorted(crossed.items()))


# ----------------------------------------------------------------------------------------------- resolve


def resolve(
    req: ResolveRequest,
    *,
    out_dir: Path,
    uv: str = "uv",
    timeout_s: float = 600,
    pins_cache_dir: Path | None = None,
) -> ResolveOutcome:
    """Lock `req` into `<out_dir>/<env_id>.lock.txt`, reusing the file when its inputs hash matches."""
    out_dir = Path(out_dir)
    lockfile = out_dir / f"{req.env_id}.lock.txt"
    digest = inputs_hash(req)

    def outcome(status: Status, reason: str = "", **kw) -> ResolveOutcome:
        kw.setdefault("pins", {})
        kw.setdefault("lockfile", None)
        kw.setdefault("crossed", {})
        kw.setdefault("cached", False)
        return ResolveOutcome(env_id=req.env_id, status=status, reason=reason, inputs_hash=digest, axes=req.axes, **kw)

    cached = resolve_cached(req, out_dir=out_dir)
    if cached is not None:
        return cached
    try:
        exclude_newer = _exclude_newer(req)
    except ReleasePinsError as exc:
        return outcome(exc.status, exc.reason)

    # The release's own pins and the resolution do not depend on each other: both wait on the index at once.
    with ThreadPoolExecutor(max_workers=1) as side:
        compiling = side.submit(_compile, req, uv=uv, timeout_s=timeout_s, exclude_newer=exclude_newer)
        try:
            crossed = _crossings(req, uv=uv, cache_dir=pins_cache_dir or default_pins_cache_dir(), timeout_s=timeout_s)
        except ReleasePinsError as exc:
            compiling.result()  # no uv is left running behind the outcome
            return outcome(exc.status, exc.reason)
        run = compiling.result()
    if run.returncode != 0:
        status, reason = classify_failure(run.stderr)
        if failure_kind(run.stderr) == "network":
            reason = f"{_no_usable_lock(lockfile)}\n{reason}"
        return outcome(status, reason, crossed=crossed)

    body = run.stdout if run.stdout.endswith("\n") else run.stdout + "\n"
    header = lock_header(req, crossed=crossed, resolver=_uv_version(uv), exclude_newer=exclude_newer)
    text = render_header(header) + body
    atomic_write(lockfile, text, durable=True)
    return outcome("resolved", pins=parse_pins(body), lockfile=lockfile, crossed=crossed)


def _no_usable_lock(lockfile: Path) -> str:
    """What a host that reached no index lacked: a lock made from these inputs. GPU nodes often reach no index,
    and a matrix that gains an axis value (a GPU kind is part of an environment) has environments without one."""
    made = (
        f"{lockfile} was made from other inputs"
        if lockfile.exists()
        else f"no lock for this environment ({lockfile.name} in {lockfile.parent})"
    )
    return (
        f"{made}, and uv could not reach the index to lock it: run `servematrix lock MATRIX` where an index is "
        "reachable and bring the lock along"
    )


# ---------------------------------------------------------------------------------------- many at once


def _resolution_key(req: ResolveRequest) -> str:
    """What uv's answer depends on: the inputs without the axes (which only name the environment). Two GPU
    kinds of one platform ask the same question."""
    canon = {k: v for k, v in _canonical_inputs(req).items() if k != "axes"}
    canon["as_released"] = as_released(req)  # the same question asked of another day's index
    return json.dumps(canon, sort_keys=True, separators=(",", ":"))


def _lock_body(text: str) -> str:
    """A lock's body: everything after its leading `#` header block."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    return "".join(lines[start:])


def _same_answer(req: ResolveRequest, answer: ResolveOutcome, *, out_dir: Path, uv: str) -> ResolveOutcome:
    """`req`'s outcome from the resolution of a request with the same key: its own lock (its own header, the
    same body), or the same verdict."""
    digest = inputs_hash(req)
    lockfile = Path(out_dir) / f"{req.env_id}.lock.txt"
    if answer.status != "resolved" or answer.lockfile is None:
        return replace(answer, env_id=req.env_id, axes=req.axes, inputs_hash=digest, lockfile=None, cached=False)
    body = _lock_body(answer.lockfile.read_text(encoding="utf-8"))
    try:
        exclude_newer = _exclude_newer(req)
    except ReleasePinsError as exc:
        return replace(answer, env_id=req.env_id, status=exc.status, reason=exc.reason, lockfile=None, pins={})
    header = lock_header(req, crossed=answer.crossed, resolver=_uv_version(uv), exclude_newer=exclude_newer)
    text = render_header(header) + body
    atomic_write(lockfile, text, durable=True)
    return replace(answer, env_id=req.env_id, axes=req.axes, inputs_hash=digest, lockfile=lockfile, cached=False)


def default_jobs() -> int:
    """Concurrent resolutions: a cold resolution mostly waits on the index, so more than the cores."""
    return max(4, 4 * (os.cpu_count() or 1))


def resolve_many(
    requests: Sequence[ResolveRequest],
    *,
    out_dir: Path,
    jobs: int | None = None,
    uv: str = "uv",
    timeout_s: float = 600,
    pins_cache_dir: Path | None = None,
) -> list[ResolveOutcome]:
    """`resolve` for many environments: each distinct question (`_resolution_key`) asked of uv once, the
    distinct ones concurrently (uv's cache is safe to share between processes); outcomes in `requests`' order."""
    groups: dict[str, list[ResolveRequest]] = {}
    for req in requests:
        groups.setdefault(_resolution_key(req), []).append(req)

    def answer(group: list[ResolveRequest]) -> list[ResolveOutcome]:
        # A member whose own lock is current needs no uv; the first one that is not asks for the group.
        current = [(req, resolve_cached(req, out_dir=out_dir)) for req in group]
        asked = next((req for req, cached in current if cached is None), None)
        if asked is None:
            return [cached for _, cached in current if cached is not None]
        first = resolve(asked, out_dir=out_dir, uv=uv, timeout_s=timeout_s, pins_cache_dir=pins_cache_dir)
        return [
            first if req is asked else cached or _same_answer(req, first, out_dir=out_dir, uv=uv)
            for req, cached in current
        ]

    # One question first, alone: it reads into uv's cache the index pages that the others mostly share (torch,
    # the nvidia-* and CUDA wheels), which the cache policy lets them reuse instead of each reading its own.
    questions = list(groups.values())
    found: dict[str, ResolveOutcome] = {}
    first = next((g for g in questions if any(resolve_cached(r, out_dir=out_dir) is None for r in g)), None)
    if first is not None:
        found.update((o.env_id, o) for o in answer(first))
        questions.remove(first)
    with ThreadPoolExecutor(max_workers=max(1, min(jobs or default_jobs(), len(questions) or 1))) as pool:
        found.update((o.env_id, o) for outcomes in pool.map(answer, questions) for o in outcomes)
    return [found[req.env_id] for req in requests]


def resolve_cached(req: ResolveRequest, *, out_dir: Path) -> ResolveOutcome | None:
    """`req`'s outcome from its own lock when that lock's inputs hash is current, else None."""
    lockfile = Path(out_dir) / f"{req.env_id}.lock.txt"
    header = read_lock_header(lockfile)
    if header is None or header.inputs_hash != inputs_hash(req):
        return None
    return ResolveOutcome(
        env_id=req.env_id,
        status="resolved",
        reason="",
        pins=parse_pins(lockfile.read_text(encoding="utf-8")),
        lockfile=lockfile,
        inputs_hash=header.inputs_hash,
        crossed=header.crossed,
        cached=True,
        axes=req.axes,
    )
