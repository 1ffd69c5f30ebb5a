"""The Nix path's input: the matrices' locked environments as one JSON file (nix/envs.json) for flake.nix.

A lock from the resolve stage holds `name==version` and the sha256 of every file of that release, but no
URL, and Nix must know the exact file and its hash before it fetches anything (a fixed-output derivation).
So the export asks uv once, at export time, for the files of exactly the locked set (`uv pip compile LOCK
--no-deps --format pylock.toml` for the lock's Python and platform), picks the one wheel the target would
install (the best-ranked compatible tag, as an installer would), and accepts it only if its sha256 is one
the lock already lists: the lock stays the trust anchor, the index is only asked where a file lives.

Committed files name no host. A wheel's URL is stored as (base name, path); the flake maps base names to URLs
given by the user (nix/wheel-bases.json or SERVEMATRIX_WHEEL_BASES, see docs/nix.md). The one origin of an
ordinary single-index export is called `default`; other origins must be named with `--wheel-base NAME=URL`.

    python -m servematrix.scaleout.nixexport [MATRIX...] [--out nix/envs.json] [--wheel-base NAME=URL]...
    python -m servematrix.scaleout.nixexport --check        # offline: is nix/envs.json in step with the locks?
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tempfile
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

from packaging.markers import Marker
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from servematrix.errors import InputError
from servematrix.formats.lockfile import (
    LockedPackage,
    TargetError,
    index_args,
    marker_environment,
    parse_lock,
    platform_parts,
    target_tags,
)
from servematrix.options import NIX_ENVS, command_parser, validate
from servematrix.util import atomic_write, run_captured, uv_env

__all__ = [
    "DEFAULT_BASE",
    "DEFAULT_OUT",
    "FORMAT",
    "ExportError",
    "LockedEnvironment",
    "Wheel",
    "assign_bases",
    "check",
    "export",
    "locked_environments",
    "main",
    "nix_system",
    "render",
    "select_wheels",
]

FORMAT = 1
_SDIST_ONLY = "an sdist only"  # a locked package the index has no wheel of
DEFAULT_OUT = NIX_ENVS
DEFAULT_BASE = "default"
_BASE_NAME_RE = re.compile(r"^[a-z][a-z0-9-]*$")

# uv's --python-platform architecture -> Nix system.
_ARCHES = {"x86_64": "x86_64-linux", "aarch64": "aarch64-linux"}


class ExportError(RuntimeError):
    """The export cannot produce a faithful environment; the message says which env and package."""


# ------------------------------------------------------------------------------------------- the target


def nix_system(platform: str) -> str:
    """`x86_64-manylinux_2_34` -> `x86_64-linux`."""
    try:
        return _ARCHES[platform_parts(platform)[0]]
    except TargetError as exc:
        raise ExportError(f"{exc} (the Nix path builds Linux images from manylinux wheels)") from None


@dataclass(frozen=True, kw_only=True)
class LockedEnvironment:
    """An environment of a matrix whose lock exists and was made from the matrix's current inputs."""

    env_id: str
    matrices: tuple[str, ...]  # repo-relative posix paths
    axes: Mapping[str, str]
    python_version: str
    platform: str
    lockfile: Path
    lock: str  # repo-relative posix path of the lock file
    lock_sha256: str
    inputs_hash: str
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()


def _relative(path: Path, root: Path) -> str:
    try:
        return PurePosixPath(path.resolve().relative_to(root.resolve())).as_posix()
    except ValueError:
        # A host path in a committed file would leak the machine's layout and break on every other one.
        raise ExportError(f"{path} is outside {root}: the export records repository-relative paths only") from None


def locked_environments(
    matrices: Sequence[Path], *, root: Path, lock_dir: Path | None = None
) -> tuple[list[LockedEnvironment], dict[str, str]]:
    """The environments of `matrices` that have a current lock, and {env_id: why not} for the others.

    A lock counts only when its header's inputs hash is the one the matrix asks for now: a stale lock would
    give an image of versions the matrix no longer describes.
    """
    from servematrix.formats.lockfile import read_lock_header
    from servematrix.planning.plan import make_plan
    from servematrix.stages.locking import default_lock_dir, resolve_request
    from servematrix.stages.resolve import inputs_hash

    found: dict[str, LockedEnvironment] = {}
    skipped: dict[str, str] = {}
    for matrix in matrices:
        plan = make_plan(matrix)
        matrix_rel = _relative(Path(matrix), root)
        locks = lock_dir or default_lock_dir(plan)
        for env_id in plan.environments:
            request = resolve_request(plan, env_id)
            lockfile = locks / f"{env_id}.lock.txt"
            header = read_lock_header(lockfile)
            if header is None:
                skipped[env_id] = f"{matrix_rel}: no lock (unresolvable, or not locked yet)"
                continue
            wanted = inputs_hash(request)
            if header.inputs_hash != wanted:
                skipped[env_id] = f"{matrix_rel}: stale lock {lockfile.name} (run `servematrix lock {matrix_rel}`)"
                continue
            if env_id in found:
                previous = found[env_id]
                found[env_id] = LockedEnvironment(
                    **{**previous.__dict__, "matrices": tuple(sorted({*previous.matrices, matrix_rel}))}
                )
                continue
            found[env_id] = LockedEnvironment(
                env_id=env_id,
                matrices=(matrix_rel,),
                axes=dict(sorted(request.axes.items())),
                python_version=request.python_version,
                platform=request.platform,
                lockfile=lockfile,
                lock=_relative(lockfile, root),
                lock_sha256=hashlib.sha256(lockfile.read_bytes()).hexdigest(),
                inputs_hash=wanted,
                index_url=request.index_url,
                extra_index_urls=tuple(request.extra_index_urls),
            )
    for env_id in found:
        skipped.pop(env_id, None)
    return sorted(found.values(), key=lambda e: e.env_id), dict(sorted(skipped.items()))


# ------------------------------------------------------------------------------------------- the wheels


@dataclass(frozen=True, kw_only=True)
class Wheel:
    name: str  # normalized
    version: str
    filename: str
    sha256: str
    url: str  # absolute; never written out (see assign_bases)

    def to_json(self, base: str, path: str) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "filename": self.filename, "base": base, "path": path}


def select_wheels(
    pylock: Mapping, pins: Mapping[str, LockedPackage], *, python_version: str, platform: str
) -> list[Wheel]:
    """The one wheel per locked package the target installs; each must carry a hash the lock lists."""
    try:
        ranking = {tag: i for i, tag in enumerate(target_tags(python_version, platform))}
    except TargetError as exc:
        raise ExportError(f"{exc} (the Nix path builds Linux images from manylinux wheels)") from None
    environment = marker_environment(python_version, platform)
    chosen: dict[str, Wheel] = {}
    seen: set[str] = set()
    problems: list[str] = []
    for package in pylock.get("packages", []):
        name = canonicalize_name(package["name"])
        marker = package.get("marker")
        if marker and not Marker(marker).evaluate(environment):
            continue
        seen.add(name)
        pin = pins.get(name)
        if pin is None:
            problems.append(f"{name}: in uv's answer but not in the lock")
            continue
        version, hashes = pin.version, pin.hashes
        if str(package.get("version")) != version:
            problems.append(f"{name}: uv answered {package.get('version')}, the lock pins {version}")
            continue
        best: tuple[int, Wheel] | None = None
        for entry in package.get("wheels", []):
            url = entry.get("url")
            sha = str(entry.get("hashes", {}).get("sha256", "")).lower()
            if not url or not sha:
                continue
            filename = entry.get("name") or unquote(urlsplit(url).path.rsplit("/", 1)[-1])
            try:
                _, _, _, tags = parse_wheel_filename(filename)
            except InvalidWheelFilename:
                continue
            rank = min((ranking[t] for t in tags if t in ranking), default=None)
            if rank is None:
                continue
            wheel = Wheel(name=name, version=version, filename=filename, sha256=sha, url=url)
            if best is None or (rank, filename) < (best[0], best[1].filename):
                best = (rank, wheel)
        if best is None:
            kind = _SDIST_ONLY if package.get("sdist") and not package.get("wheels") else "no compatible wheel"
            problems.append(f"{name}=={version}: {kind} for {python_version}/{platform} (the Nix path installs wheels)")
            continue
        if best[1].sha256 not in hashes:
            problems.append(
                f"{name}=={version}: {best[1].filename} has sha256 {best[1].sha256}, which the lock does not list"
            )
            continue
        chosen[name] = best[1]
    problems += [
        f"{name}=={pins[name].version}: locked, but uv listed no files for it" for name in sorted(set(pins) - seen)
    ]
    if problems:
        raise ExportError("\n".join(problems))
    return [chosen[name] for name in sorted(chosen)]


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def assign_bases(urls: Iterable[str], bases: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """{url: (base name, path under the base)}. Named bases match by longest prefix; the single remaining
    origin, if there is exactly one, is `default`."""
    for name in bases:
        if not _BASE_NAME_RE.match(name):
            raise ExportError(f"wheel base name {name!r} must match {_BASE_NAME_RE.pattern}")
    prefixes = sorted(((url.rstrip("/") + "/", name) for name, url in bases.items()), key=lambda p: -len(p[0]))
    placed: dict[str, tuple[str, str]] = {}
    unnamed: dict[str, list[str]] = {}
    for url in sorted(set(urls)):
        for prefix, name in prefixes:
            if url.startswith(prefix):
                placed[url] = (name, url[len(prefix) :])
                break
        else:
            unnamed.setdefault(_origin(url), []).append(url)
    if unnamed:
        if len(unnamed) > 1 or DEFAULT_BASE in bases:
            raise ExportError(
                f"wheels come from {len(unnamed)} unnamed origin(s); name each with --wheel-base NAME=URL "
                f"(the base named {DEFAULT_BASE!r} may be left implicit only when it is the single origin)"
            )
        ((origin, members),) = unnamed.items()
        for url in members:
            placed[url] = (DEFAULT_BASE, url[len(origin) :].lstrip("/"))
    return placed


# --------------------------------------------------------------------------------------------- uv query


def _uv_pylock(env: LockedEnvironment, *, uv: str, timeout_s: float) -> dict:
    args = [
        uv,
        "pip",
        "compile",
        str(env.lockfile.resolve()),
        # Every locked package is listed: no resolution, so a crossed pin (an override at lock time) cannot
        # make uv refuse the set or move a version.
        "--no-deps",
        "--python-version",
        env.python_version,
        "--python-platform",
        env.platform,
        "--format",
        "pylock.toml",
        "--no-header",
        "--quiet",
    ]
    args += index_args(env.index_url, env.extra_index_urls)
    with tempfile.TemporaryDirectory(prefix="servematrix-nixexport-") as cwd:
        done = run_captured(args, cwd=cwd, timeout_s=timeout_s, env=uv_env())
    if done.returncode != 0:
        why = done.problem or done.stderr.strip()[-2000:]
        raise ExportError(f"{env.env_id}: uv could not list the locked files:\n{why}")
    return tomllib.loads(done.stdout)


# ------------------------------------------------------------------------------------------ the document


@dataclass(frozen=True, kw_only=True)
class Exported:
    document: dict
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return render(self.document)


def render(document: Mapping) -> str:
    """Deterministic JSON: sorted keys, one value per line, so a re-lock shows as a readable diff."""
    return json.dumps(document, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def _env_entry(env: LockedEnvironment, wheel_ids: list[str]) -> dict:
    return {
        "axes": dict(env.axes),
        "inputs_hash": env.inputs_hash,
        "lock": env.lock,
        "lock_sha256": env.lock_sha256,
        "matrices": list(env.matrices),
        "platform": env.platform,
        "python_version": env.python_version,
        "system": nix_system(env.platform),
        "wheels": wheel_ids,
    }


def export(
    matrices: Sequence[Path],
    *,
    root: Path,
    lock_dir: Path | None = None,
    bases: Mapping[str, str] | None = None,
    uv: str = "uv",
    timeout_s: float = 600,
    query=_uv_pylock,  # injectable for tests: (env, uv=, timeout_s=) -> pylock dict
) -> Exported:
    envs, skipped = locked_environments(matrices, root=root, lock_dir=lock_dir)
    chosen: dict[str, list[Wheel]] = {}
    not_exported: dict[str, str] = {}
    for env in envs:
        pins = parse_lock(env.lockfile.read_text(encoding="utf-8"))
        try:
            chosen[env.env_id] = select_wheels(
                query(env, uv=uv, timeout_s=timeout_s),
                pins,
                python_version=env.python_version,
                platform=env.platform,
            )
        except ExportError as exc:
            problems = str(exc).splitlines()
            if not all(_SDIST_ONLY in p for p in problems):
                raise ExportError(f"{env.env_id} ({env.lock}):\n{exc}") from None
            # A lock that pins a package the index has as an sdist only (sglang 0.5.18-0.5.22's cuda-tile
            # 1.6.0rc5, a placeholder) has no image here: listed with the reason, not a failed export.
            not_exported[env.env_id] = f"{env.lock}: " + "; ".join(problems)
    envs = [e for e in envs if e.env_id not in not_exported]
    placed = assign_bases((w.url for ws in chosen.values() for w in ws), bases or {})
    wheels: dict[str, dict[str, str]] = {}
    for ws in chosen.values():
        for w in ws:
            base, path = placed[w.url]
            entry = w.to_json(base, path)
            if wheels.setdefault(w.sha256, entry) != entry:
                raise ExportError(f"sha256 {w.sha256} names two different files: {wheels[w.sha256]} and {entry}")
    document = {
        "format": FORMAT,
        "generated_by": "python -m servematrix.scaleout.nixexport; do not edit (docs/nix.md)",
        "environments": {env.env_id: _env_entry(env, [w.sha256 for w in chosen[env.env_id]]) for env in envs},
        "wheel_bases": sorted({entry["base"] for entry in wheels.values()}),
        "wheels": wheels,
    }
    if not_exported:
        document["not_exported"] = dict(sorted(not_exported.items()))
    return Exported(document=document, skipped=skipped)


def check(document: Mapping, matrices: Sequence[Path], *, root: Path, lock_dir: Path | None = None) -> list[str]:
    """Offline: how `document` (a parsed nix/envs.json) differs from what the locks say; [] when in step."""
    if document.get("format") != FORMAT:
        return [f"format {document.get('format')!r}, expected {FORMAT}"]
    envs, _ = locked_environments(matrices, root=root, lock_dir=lock_dir)
    recorded = document.get("environments", {})
    wheels = document.get("wheels", {})
    problems: list[str] = []
    expected_ids = {e.env_id for e in envs}
    not_exported = document.get("not_exported", {})
    for env_id in sorted(expected_ids - set(recorded) - set(not_exported)):
        problems.append(f"{env_id}: locked, but not exported")
    for env_id in sorted((set(recorded) | set(not_exported)) - expected_ids):
        problems.append(f"{env_id}: exported, but no current lock in the matrices")
    for env in envs:
        entry = recorded.get(env.env_id)
        if entry is None:
            continue
        expected = _env_entry(env, entry.get("wheels", []))
        for key, value in expected.items():
            if key != "wheels" and entry.get(key) != value:
                problems.append(f"{env.env_id}: {key} is {entry.get(key)!r}, the lock says {value!r}")
        pins = parse_lock(env.lockfile.read_text(encoding="utf-8"))
        seen: dict[str, str] = {}
        for sha in entry.get("wheels", []):
            wheel = wheels.get(sha)
            if wheel is None:
                problems.append(f"{env.env_id}: wheel {sha} is not in the wheels table")
                continue
            name, version = wheel["name"], wheel["version"]
            seen[name] = version
            pin = pins.get(name)
            if pin is None:
                problems.append(f"{env.env_id}: {name} is exported but not locked")
            elif pin.version != version or sha not in pin.hashes:
                problems.append(f"{env.env_id}: {wheel['filename']} does not match the lock's {name}=={pin.version}")
        for name in sorted(set(pins) - set(seen)):
            problems.append(f"{env.env_id}: {name}=={pins[name].version} is locked but has no exported wheel")
    for sha, wheel in sorted(wheels.items()):
        if wheel.get("base") not in document.get("wheel_bases", []):
            problems.append(f"wheel {wheel.get('filename')}: base {wheel.get('base')!r} is not in wheel_bases")
        if "://" in wheel.get("path", "") or wheel.get("path", "").startswith("/"):
            problems.append(f"wheel {wheel.get('filename')}: path must be relative to its base")
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            problems.append(f"wheel {wheel.get('filename')}: {sha!r} is not a sha256")
    return problems


# ---------------------------------------------------------------------------------------------- command


def build_parser() -> argparse.ArgumentParser:
    """`python -m servematrix.scaleout.nixexport`: `servematrix nix-export`'s options, from servematrix.options."""
    return command_parser("nix-export", prog="python -m servematrix.scaleout.nixexport")


def command(args: argparse.Namespace) -> int:
    """`servematrix nix-export` once its options are parsed and checked. InputError and ExportError propagate
    to the caller, which says them (exit 2); a stale or missing --check target is exit 1."""
    matrices = args.matrices or sorted((args.root / "matrix").glob("*.toml"))
    if args.check:
        if not args.out.is_file():
            print(f"{args.out}: missing; run servematrix nix-export", file=sys.stderr)
            return 1
        problems = check(json.loads(args.out.read_text()), matrices, root=args.root, lock_dir=args.lock_dir)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print(f"{args.out} is stale: run servematrix nix-export", file=sys.stderr)
            return 1
        print(f"{args.out}: in step with the locks", file=sys.stderr)
        return 0
    result = export(matrices, root=args.root, lock_dir=args.lock_dir, bases=args.bases, uv=args.uv)
    atomic_write(args.out, result.text)
    document = result.document
    for env_id, reason in [*result.skipped.items(), *document.get("not_exported", {}).items()]:
        print(f"skipped {env_id}: {reason}", file=sys.stderr)
    print(
        f"wrote {args.out}: {len(document['environments'])} environment(s), {len(document['wheels'])} wheel(s), "
        f"bases {', '.join(document['wheel_bases']) or '-'}",
        file=sys.stderr,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return command(validate(args))
    except (ExportError, InputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
