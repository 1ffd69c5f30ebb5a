"""sglang's FP4 trace probe, a CPU pre-flight that can end a piecewise cell before it costs GPU time.

A piecewise cell traces the forward with dynamo (`torch.compile(fullgraph=True)`). If the FP4 quantize entry
point that this sglang reaches on this arch does not trace under the cell's (torch, flashinfer), the GPU run
would die with `torch._dynamo.exc.Unsupported`. `probe_script.py` runs in a small venv holding only that
torch and flashinfer-python, and reports.

Which entry point each sglang release reaches per arch, where flashinfer keeps it, and whether a
release's piecewise mode uses dynamo at all is data (`probe.toml`, beside this module), not code.

Probe venvs are built once per (torch, flashinfer) under the cache folder, and each probe result is
cached per (torch, flashinfer, entry, arch), so a matrix pays for each pair once. The installer is uv by
default (`SERVEMATRIX_PROBE_INSTALLER=uv|pip`); uv fetches the default index's CUDA build of torch,
which runs on a CPU, and hardlinks it from its cache into later venvs. `SERVEMATRIX_PROBE_PYTHON`
chooses the venv's interpreter (default: the one running servematrix).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import AfterValidator, Field

from servematrix.formats import tomlsource
from servematrix.formats.tomlsource import DataTable
from servematrix.util import atomic_write, install_venv, run_captured, uv_env

__all__ = [
    "ENTRIES",
    "ProbeResult",
    "entry_point_for",
    "flashinfer_has",
    "fp4_entry_rule",
    "fp4_module_for",
    "piecewise_traces_with_dynamo",
    "probe_cell",
    "trace_probe",
]

ENTRIES = ("plain", "custom-op", "sglang-op")
NO_ENTRY = "none"
INSTALLER_ENV = "SERVEMATRIX_PROBE_INSTALLER"
PYTHON_ENV = "SERVEMATRIX_PROBE_PYTHON"
RESULT_SCHEMA = 1
_READY = ".servematrix-probe-env.json"
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
_TAIL_LINES = 12


# ----------------------------------------------------------------------------------------------- data


@dataclass(frozen=True, kw_only=True)
class EntryRule:
    sglang: SpecifierSet
    archs: tuple[str, ...]
    entry: str
    source: str = ""
    flashinfer: SpecifierSet | None = None


@dataclass(frozen=True, kw_only=True)
class _Data:
    probe: _ProbeSection  # what the probe venv gets, and its time limits
    modules: tuple[tuple[SpecifierSet, str], ...]
    features: dict[str, SpecifierSet]
    entries: tuple[EntryRule, ...]
    piecewise: tuple[tuple[SpecifierSet, _PiecewiseRow], ...]


def _range(value: str) -> str:
    try:
        SpecifierSet(value)
    except InvalidSpecifier:
        raise ValueError(f"not a version range: {value!r}") from None
    return value


Range = Annotated[str, AfterValidator(_range)]


class _ProbeSection(DataTable):
    packages: tuple[str, ...]
    assume_cuda: str = ""
    install_timeout_s: float = Field(default=1800, gt=0)
    probe_timeout_s: float = Field(default=300, gt=0)


class _ModuleRow(DataTable):
    flashinfer: Range
    module: str


class _EntryRow(DataTable):
    sglang: Range
    arch: tuple[str | int, ...]
    entry: Literal["plain", "custom-op", "sglang-op", "none"]
    flashinfer: Range | None = None
    source: str = ""


class _PiecewiseRow(DataTable):
    sglang: Range
    applicable: bool = True
    dynamo: bool = False
    default_dynamo: bool = False
    reason: str = ""


class _ProbeFile(DataTable):
    schema_: int = Field(alias="schema")
    probe: _ProbeSection
    flashinfer_module: tuple[_ModuleRow, ...] = ()
    flashinfer_features: dict[str, Range] = Field(default_factory=dict)
    fp4_entry: tuple[_EntryRow, ...] = ()
    piecewise: tuple[_PiecewiseRow, ...] = ()


@functools.cache
def _data() -> _Data:
    """probe.toml, validated: a mistake in it is an InputError naming its line and key."""
    with resources.as_file(resources.files(__package__).joinpath("probe.toml")) as path:
        raw = tomlsource.validate(tomlsource.load(path, what="probe data"), _ProbeFile)
    return _Data(
        probe=raw.probe,
        modules=tuple((SpecifierSet(row.flashinfer), row.module) for row in raw.flashinfer_module),
        features={k: SpecifierSet(v) for k, v in raw.flashinfer_features.items()},
        entries=tuple(
            EntryRule(
                sglang=SpecifierSet(row.sglang),
                archs=tuple(_normalize_arch(a) for a in row.arch),
                entry=row.entry,
                source=row.source,
                flashinfer=SpecifierSet(row.flashinfer) if row.flashinfer is not None else None,
            )
            for row in raw.fp4_entry
        ),
        piecewise=tuple((SpecifierSet(row.sglang), row) for row in raw.piecewise),
    )


def _normalize_arch(arch: str | int) -> str:
    """'sm_120', 'sm120a', '12.0', 120 -> '120'."""
    text = str(arch).strip().lower().removeprefix("sm_").removeprefix("sm")
    if re.fullmatch(r"\d+\.\d+", text):
        major, minor = text.split(".")
        text = f"{major}{minor}"
    text = text.rstrip("af")
    if not text.isdigit():
        raise ValueError(f"not a GPU arch: {arch!r}")
    return text


def _version(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion as exc:
        raise ValueError(f"not a version: {text!r}") from exc


def _contains(spec: SpecifierSet, version: Version) -> bool:
    return spec.contains(version, prereleases=True)


def fp4_entry_rule(sglang_version: str, arch: str, flashinfer_version: str | None = None) -> EntryRule | None:
    """The data row deciding which FP4 entry this sglang reaches on this arch (first match), or None."""
    version, arch = _version(sglang_version), _normalize_arch(arch)
    fi = _version(flashinfer_version) if flashinfer_version else None
    for rule in _data().entries:
        if arch not in rule.archs or not _contains(rule.sglang, version):
            continue
        if rule.flashinfer is not None and (fi is None or not _contains(rule.flashinfer, fi)):
            continue
        return rule
    return None


def entry_point_for(sglang_version: str, arch: str, flashinfer_version: str) -> str | None:
    """The probe entry ('plain', 'sglang-op', 'custom-op') this cell's traced forward reaches.

    None when the traced forward makes no flashinfer FP4 quantize call on this arch, and when the data
    does not cover this version (`fp4_entry_rule` tells the two apart).
    """
    rule = fp4_entry_rule(sglang_version, arch, flashinfer_version)
    return None if rule is None or rule.entry == NO_ENTRY else rule.entry


def fp4_module_for(flashinfer_version: str) -> str | None:
    """The module holding get_fp4_quantization_module in this flashinfer, or None (the probe tries both)."""
    version = _version(flashinfer_version)
    return next((module for spec, module in _data().modules if _contains(spec, version)), None)


def flashinfer_has(feature: str, flashinfer_version: str) -> bool:
    """A flashinfer feature listed in probe.toml: 'custom_op', 'backend_kwarg'."""
    spec = _data().features.get(feature)
    if spec is None:
        raise KeyError(f"unknown flashinfer feature {feature!r}; known: {sorted(_data().features)}")
    return _contains(spec, _version(flashinfer_version))


def piecewise_traces_with_dynamo(sglang_version: str, *, default: bool = False) -> bool | None:
    """Whether this release's piecewise mode (or, with `default`, its default prefill path) uses dynamo.

    None when piecewise CUDA graphs are not applicable to the release, or the data does not cover it.
    """
    version = _version(sglang_version)
    for spec, row in _data().piecewise:
        if _contains(spec, version):
            if not row.applicable:
                return None
            return row.default_dynamo if default else row.dynamo
    return None


# ---------------------------------------------------------------------------------------- trace probe


@dataclass(frozen=True, kw_only=True)
class ProbeResult:
    """What the trace probe found. `traceable` is None when the probe could not decide (see `error`).

    `torch` and `flashinfer` are the versions the probe venv reported (e.g. 2.13.0+cpu). `seconds` is
    the wall time of the call that ran the probe (venv build included); a cached result keeps it.
    """

    traceable: bool | None
    entry: str
    torch: str
    flashinfer: str
    arch: str
    evidence: str
    seconds: float
    cached: bool
    error: str


def probe_cell(
    *, sglang_version: str, torch_version: str, flashinfer_version: str, arch: str, cache_dir: Path
) -> ProbeResult | None:
    """Trace-probe a piecewise cell, or None when there is nothing to probe (no dynamo, no FP4 entry)."""
    if not piecewise_traces_with_dynamo(sglang_version):
        return None
    entry = entry_point_for(sglang_version, arch, flashinfer_version)
    if entry is None:
        return None
    return trace_probe(
        torch_version=torch_version, flashinfer_version=flashinfer_version, entry=entry, arch=arch, cache_dir=cache_dir
    )


def venv_dir(cache_dir: Path, torch_version: str, flashinfer_version: str) -> Path:
    """Where the probe venv of a (torch, flashinfer) pair lives; built once, shared by every cell."""
    return Path(cache_dir) / "probe" / "venvs" / f"torch-{torch_version}__flashinfer-{flashinfer_version}"


def venv_is_built(cache_dir: Path, torch_version: str, flashinfer_version: str) -> bool:
    return (venv_dir(cache_dir, torch_version, flashinfer_version) / _READY).is_file()


def trace_probe(*, torch_version: str, flashinfer_version: str, entry: str, arch: str, cache_dir: Path) -> ProbeResult:
    """Does `entry` trace under torch.compile(fullgraph=True) with this torch and flashinfer?"""
    if entry not in ENTRIES:
        raise ValueError(f"unknown probe entry {entry!r}; expected one of {ENTRIES}")
    arch = _normalize_arch(arch)
    for name, value in (("torch", torch_version), ("flashinfer", flashinfer_version)):
        if not _SAFE.match(value):
            raise ValueError(f"unusable {name} version {value!r}")
    root = Path(cache_dir) / "probe"
    pair = f"torch-{torch_version}__flashinfer-{flashinfer_version}"
    result_path = root / "results" / f"{pair}__{entry}__sm{arch}__{probe_code_version()}.json"
    cached = _read_result(result_path)
    if cached is not None:
        return cached

    started = time.monotonic()

    def finish(**fields: Any) -> ProbeResult:
        base: dict[str, Any] = {
            "traceable": None, "entry": entry, "torch": torch_version, "flashinfer": flashinfer_version,
            "arch": arch, "evidence": "", "error": "", "cached": False,
        }  # fmt: skip
        base.update(fields)
        return ProbeResult(seconds=round(time.monotonic() - started, 2), **base)

    data = _data()
    env_dir = venv_dir(cache_dir, torch_version, flashinfer_version)
    try:
        python = _ensure_env(env_dir, torch_version=torch_version, flashinfer_version=flashinfer_version, data=data)
    except _EnvError as exc:
        return finish(error=str(exc))

    argv = ["--entry", entry, "--arch", arch, "--assume-cuda", data.probe.assume_cuda]
    module = fp4_module_for(flashinfer_version) if entry == "plain" else None
    if module:
        argv += ["--module", module]
    with resources.as_file(resources.files(__package__).joinpath("probe_script.py")) as script:
        run = run_captured(
            [str(python), str(script), *argv], timeout_s=data.probe.probe_timeout_s, env=_probe_env(env_dir)
        )
    report = _last_json_line(run.stdout)
    if report is None:
        return finish(error=f"the probe script printed no report (exit {run.returncode}): {_tail(run.stderr)}")

    result = finish(
        traceable=report.get("traceable"),
        torch=report.get("torch") or torch_version,
        flashinfer=report.get("flashinfer") or flashinfer_version,
        evidence=_evidence(report),
        error="" if report.get("traceable") is not None else _error(report),
    )
    # Decided results are facts about the pair; an absent op is too. Anything else may be transient.
    if result.traceable is not None or str(report.get("error_type", "")).endswith("LookupError"):
        _write_result(result_path, result, report)
    return result


def _evidence(report: dict) -> str:
    if report.get("traceable") is True:
        graph = ", ".join(report.get("graph") or []) or "(empty)"
        text = f"traced under torch.compile(fullgraph=True); graph calls: {graph}"
        if report.get("accepts_backend_kwarg") is False:
            text += (
                f"; note: flashinfer {report.get('flashinfer')} fp4_quantize() has no backend= parameter, which "
                "sglang >= 0.5.12's wrapper passes: expect TypeError at the first FP4 call (run time, not trace)"
            )
        return text
    if report.get("traceable") is False:
        where = f" (in {report['module']})" if report.get("module") else ""
        return f"{report.get('error_type')}{where}: {report.get('message', '')}".strip()
    return ""


def _error(report: dict) -> str:
    return f"{report.get('error_type') or 'inconclusive'}: {report.get('message', '')}".strip()


# ------------------------------------------------------------------------------------ result cache


@functools.cache
def probe_code_version() -> str:
    """The probe's own code and data (probe_script.py, probe.toml): part of each result's key, so a changed
    script probes again instead of reading what the old one found."""
    digest = hashlib.sha256()
    for name in ("probe_script.py", "probe.toml"):
        with resources.as_file(resources.files(__package__).joinpath(name)) as path:
            digest.update(name.encode() + b"\0" + Path(path).read_bytes())
    return digest.hexdigest()[:12]


def _read_result(path: Path) -> ProbeResult | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("schema") != RESULT_SCHEMA:
        return None
    try:
        return ProbeResult(**{**data["result"], "cached": True})
    except (KeyError, TypeError):
        return None


def _write_result(path: Path, result: ProbeResult, report: dict) -> None:
    payload = {"schema": RESULT_SCHEMA, "result": asdict(result), "report": report}
    atomic_write(path, json.dumps(payload, indent=1, sort_keys=True) + "\n")


# ------------------------------------------------------------------------------------------- venvs


class _EnvError(RuntimeError):
    """A venv could not be built (`ensure_venv`)."""


VenvError = _EnvError  # its name for `ensure_venv`'s other callers


def _installer() -> str:
    value = os.environ.get(INSTALLER_ENV, "uv").strip().lower() or "uv"
    if value not in ("uv", "pip"):
        raise ValueError(f"{INSTALLER_ENV} must be 'uv' or 'pip', not {value!r}")
    return value


def _base_python() -> str:
    return os.environ.get(PYTHON_ENV) or sys.executable


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One builder per venv, across processes (parallel shards share the cache)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _ensure_env(env_dir: Path, *, torch_version: str, flashinfer_version: str, data: _Data) -> Path:
    packages = [p.format(torch=torch_version, flashinfer=flashinfer_version) for p in data.probe.packages]
    return ensure_venv(env_dir, packages, timeout_s=data.probe.install_timeout_s, what="probe venv")


def ensure_venv(
    env_dir: Path,
    requirements: Sequence[str],
    *,
    timeout_s: float,
    python: str | None = None,
    what: str = "venv",
) -> Path:
    """A small venv of `requirements` (installer arguments: `name==version`, `-c FILE`, ...) at `env_dir`,
    built once and kept (a marker says it is complete), one builder at a time across processes; its
    interpreter. `python` is the base interpreter (default: `SERVEMATRIX_PROBE_PYTHON`, else this one). Also
    the sglang config pre-flight's transformers venv (`configcheck`)."""
    python_in_venv = env_dir / "bin" / "python"
    packages = list(requirements)
    base = python or _base_python()
    marker = env_dir / _READY
    with _locked(env_dir.with_name(env_dir.name + ".lock")):
        if marker.is_file() and python_in_venv.exists():
            return python_in_venv
        shutil.rmtree(env_dir, ignore_errors=True)
        installer = _installer()
        uv = "uv"
        if installer == "uv":
            found = shutil.which("uv")
            if found is None:
                raise _EnvError(f"uv not found; install it or set {INSTALLER_ENV}=pip")
            uv = found
        done = install_venv(
            env_dir,
            packages,
            python=base,
            env=_install_env(),
            timeout_s=timeout_s,
            uv=uv,
            installer="pip" if installer == "pip" else "uv",
            quiet=True,
        )
        if not done.ok:
            assert done.run is not None
            failed = " ".join(done.failed[:4])
            raise _EnvError(f"{what}: `{failed} ...` failed: {_tail(done.run.stderr or done.run.stdout)}")
        marker.write_text(json.dumps({"installer": installer, "packages": packages}, indent=1) + "\n")
    return python_in_venv


def _install_env() -> dict[str, str]:
    env = uv_env(NO_COLOR="1")  # a probe venv uses an interpreter that is already here
    env.pop("VIRTUAL_ENV", None)
    return env


def _probe_env(env_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    env["CUDA_VISIBLE_DEVICES"] = ""  # the probe never needs a GPU, even on a GPU host
    env["PYTHONWARNINGS"] = "ignore"
    env["TORCHINDUCTOR_CACHE_DIR"] = str(env_dir / ".inductor-cache")
    return env


def _last_json_line(stdout: str) -> dict | None:
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


def _tail(text: str) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return "\n".join(lines[-_TAIL_LINES:])
