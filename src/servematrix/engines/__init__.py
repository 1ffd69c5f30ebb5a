"""Engines are plugins described by data (``data/engines/<name>.toml``), with hooks where data cannot say it.

An engine says how to install a version (requirements), how to launch it (argv by version range), how
to tell it is ready, which flags each mode needs in each version, and which flags were renamed. This
module reads those tables; adding an engine or a version is a data change.

What data cannot say, an engine's hooks module does (`hooks = "servematrix.engines.sglang"` in its data):
its CPU pre-flights (`PREFLIGHTS`, by the names the data's `preflight` lists) and what the run says about
them before it starts (`preamble`). The runner calls them by name and knows nothing of any engine.
Engine data files are found in the directories of `SERVEMATRIX_ENGINES` (os.pathsep-separated), then
among servematrix's own.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version
from pydantic import ConfigDict, Field, field_validator

from servematrix import tomlsource
from servematrix.errors import InputError
from servematrix.tomlsource import DataTable

if TYPE_CHECKING:
    from servematrix.cells import Cell
    from servematrix.verdict import Verdict


class _Ranged(DataTable):
    versions: str

    @field_validator("versions")
    @classmethod
    def _valid_range(cls, value: str) -> str:
        try:
            SpecifierSet(value)
        except InvalidSpecifier as exc:
            raise ValueError(f"invalid version range {value!r}") from exc
        return value

    def contains(self, version: Version) -> bool:
        return SpecifierSet(self.versions).contains(version, prereleases=True)


class LaunchRow(_Ranged):
    argv: tuple[str, ...]


class ModeFlagsRow(_Ranged):
    mode: str
    args: tuple[str, ...] = ()
    applicable: bool = True
    reason: str = ""
    source: str = ""  # where the fact was read (the release's wheel, file:line)


class FlagRename(_Ranged):
    flag: str
    to: str


class DerivedPorts(_Ranged):
    """Ports the server opens at fixed offsets from its own, which must be valid (<= 65535) and free."""

    offsets: tuple[int, ...]
    source: str = ""


class ModeEvidence(_Ranged):
    """Log lines that prove a mode really ran (`applied`) or really did not (`not_applied`): an engine may
    silently switch a feature off, and a cell must not pass under a mode it did not run."""

    mode: str
    applied: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    source: str = ""


class ImportCheckSpec(DataTable):
    """The import pre-flight (stages/importcheck.py): what to import in an environment built from its lock,
    and which lines mean "this needs a GPU" (inconclusive on a CPU) rather than a broken stack."""

    modules: tuple[str, ...] = ()
    help: tuple[str, ...] = ()  # argv; "python" is the environment's interpreter
    env: dict[str, str] = Field(default_factory=dict)
    needs_gpu: tuple[str, ...] = ()
    cost: str = ""  # what one check costs (disk, time), said before a run starts
    # The same, as numbers the announcement totals: disk while one check runs, and its time (low, high).
    cost_gb: float | None = Field(default=None, gt=0)
    cost_minutes: tuple[float, float] | None = None


class Readiness(DataTable):
    path: str
    interval_s: float = Field(gt=0)
    timeout_s: float = Field(gt=0)
    ready_log: str = ""
    # The request that confirms the ready line (default: `path`): a cheap one. sglang's health endpoints
    # generate a token and wait in 1 s steps before they answer (0.5.12 http_server.py).
    confirm_path: str = ""


class Requirements(DataTable):
    model_config = ConfigDict(extra="allow", frozen=True)
    extra: tuple[str, ...] = ()

    def for_axis(self, axis: str) -> str | None:
        value = (self.model_extra or {}).get(axis)
        return value if isinstance(value, str) else None


class Prepare(DataTable):
    """What must exist before the server starts; `{workdir}` is the run's work directory."""

    directories: tuple[str, ...] = ()


class ModeFlags(DataTable):
    """What a mode means for one engine version."""

    applicable: bool
    args: tuple[str, ...]
    reason: str


class Engine(DataTable):
    name: str
    description: str
    axes: tuple[str, ...]
    modes: tuple[str, ...]
    pinnable: tuple[str, ...] = ()
    # CPU pre-flights, in order: "import" (the generic import check) and the names of the hooks module's
    # PREFLIGHTS (sglang: "flags", "trace").
    preflight: tuple[str, ...] = ()
    hooks: str = ""  # the module with this engine's hooks (see the module doc); none when empty
    trace_modes: tuple[str, ...] = ()  # modes whose capture goes through dynamo
    # The phase of serving each mode changes ("prefill" or "decode"; a mode not named: "decode"). The bench runs
    # that phase's profile and the A/B judges the mode on its figures (stages/bench/compare.py).
    phases: dict[str, Literal["prefill", "decode"]] = Field(default_factory=dict)
    default_port: int
    requirements: Requirements
    env: dict[str, str] = Field(default_factory=dict)
    prepare: Prepare = Prepare()
    readiness: Readiness
    launch: tuple[LaunchRow, ...]
    mode_flags: tuple[ModeFlagsRow, ...]
    flag_renames: tuple[FlagRename, ...] = ()
    pins: dict[str, dict[str, str]] = Field(default_factory=dict)
    model_builders: dict[str, str] = Field(default_factory=dict)
    import_check: ImportCheckSpec = ImportCheckSpec()
    # The OpenAI API's `ignore_eos` extra: every request then makes exactly output_len tokens. transformers
    # serve refuses unknown fields (422), so it is the engine's to say.
    supports_ignore_eos: bool = False
    derived_ports: tuple[DerivedPorts, ...] = ()
    mode_evidence: tuple[ModeEvidence, ...] = ()
    # Flags whose value is a credential: masked as `***` in every stored, printed or published argv.
    secret_flags: tuple[str, ...] = ()
    # Variables given to the server whose values are not secret: shown in its log as they are. The values of
    # all others are masked wherever the log goes (`redact.launch_secret_values`).
    public_env: tuple[str, ...] = ()
    # The report heatmap's second axis, the one whose choice decides the second mode's fate (for sglang the
    # flashinfer version, not torch); default: the second version axis.
    heatmap_axis: str = ""

    def axis_package(self, axis: str) -> str:
        """The (normalized) name of the package an axis's requirement installs: flashinfer -> flashinfer-python."""
        requirement = self.requirements.for_axis(axis)
        return canonicalize_name(re.split(r"[\s\[=<>!~;]", requirement, maxsplit=1)[0] if requirement else axis)

    @property
    def version_axis(self) -> str:
        """The axis that holds the engine's own version (``sglang``, ``transformers``)."""
        return self.axes[0]

    def launch_argv(self, version: str) -> tuple[str, ...]:
        parsed = Version(version)
        for row in self.launch:
            if row.contains(parsed):
                return row.argv
        raise InputError(f"engine {self.name} has no launch command for version {version}")

    def mode_flags_for(self, mode: str, version: str) -> ModeFlags:
        parsed = Version(version)
        for row in self.mode_flags:
            if row.mode == mode and row.contains(parsed):
                return ModeFlags(applicable=row.applicable, args=row.args, reason=row.reason)
        return ModeFlags(applicable=False, args=(), reason=f"mode {mode} is not defined for {self.name} {version}")

    def rename_flags(self, args: tuple[str, ...], version: str) -> tuple[str, ...]:
        parsed = Version(version)
        renames = {row.flag: row.to for row in self.flag_renames if row.contains(parsed)}
        if not renames:
            return args
        out = []
        for arg in args:
            flag, eq, value = arg.partition("=")
            out.append(renames.get(flag, flag) + eq + value if flag in renames else arg)
        return tuple(out)

    def port_offsets(self, version: str) -> tuple[int, ...]:
        """Offsets from --port of every port this version derives from it."""
        parsed = Version(version)
        return tuple(sorted({o for row in self.derived_ports if row.contains(parsed) for o in row.offsets}))

    def phase_of(self, mode: str) -> str:
        return self.phases.get(mode, "decode")

    def evidence_for(self, mode: str, version: str) -> ModeEvidence | None:
        parsed = Version(version)
        return next((row for row in self.mode_evidence if row.mode == mode and row.contains(parsed)), None)


GENERIC_PREFLIGHTS = ("import",)  # run by the runner's own stages, for any engine
ENGINES_PATH_ENV = "SERVEMATRIX_ENGINES"


class PreflightUnavailable(Exception):
    """A pre-flight that cannot run here (e.g. a wheel it reads could not be downloaded): it predicts
    nothing, and the GPU stages decide. Any other exception from a hook is a harness fault."""


@dataclass(frozen=True, kw_only=True)
class PreflightInput:
    """What a pre-flight hook is given about one cell."""

    cell: Cell
    engine: Engine
    pins: Mapping[str, str]  # the environment's resolved lock, by package name (empty before resolve)
    cache_dir: Path  # where a hook keeps what it fetched or derived, shared by every cell

    def package(self, axis: str) -> str | None:
        """The version of an axis's package: the lock's, else the axis value or the release pin."""
        return self.pins.get(self.engine.axis_package(axis)) or self.cell.env.effective(axis, self.engine.pins)


Preflight = Callable[[PreflightInput], "Verdict | None"]


@dataclass(frozen=True, kw_only=True)
class Hooks:
    """An engine's hooks module, as the runner sees it."""

    preflights: Mapping[str, Preflight]
    preamble: Callable[[Sequence[Cell], Engine, Path], list[str]] | None = None
    # `bisect --probe-entry ENTRY`: one named probe of a cell, as (verdict, whether its result was cached).
    probe_entry: Callable[..., tuple[Verdict, bool]] | None = None

    @staticmethod
    def of(engine: Engine) -> Hooks:
        if not engine.hooks:
            return Hooks(preflights={})
        module = importlib.import_module(engine.hooks)
        return Hooks(
            preflights=getattr(module, "PREFLIGHTS", {}),
            preamble=getattr(module, "preamble", None),
            probe_entry=getattr(module, "probe_entry", None),
        )


def _engine_folders() -> list[Traversable]:
    """Where engine data files are looked for: SERVEMATRIX_ENGINES's directories, then servematrix's own."""
    extra = [Path(p) for p in os.environ.get(ENGINES_PATH_ENV, "").split(os.pathsep) if p.strip()]
    return [*extra, resources.files("servematrix.data").joinpath("engines")]


def load_engine(name: str) -> Engine:
    for folder in _engine_folders():
        candidate = folder.joinpath(f"{name}.toml")
        if candidate.is_file():
            with resources.as_file(candidate) as path:
                return _load(path)
    known = ", ".join(available_engines())
    raise InputError(f"unknown engine {name!r} (known: {known})")


@functools.cache
def _load(path: Path) -> Engine:
    source = tomlsource.load(path, what="engine data")
    engine = tomlsource.validate(source, Engine)
    try:
        hooks = Hooks.of(engine)
    except ImportError as exc:
        raise source.error(("hooks",), f"cannot import the hooks module {engine.hooks!r}: {exc}") from None
    for i, name in enumerate(engine.preflight):
        if name not in GENERIC_PREFLIGHTS and name not in hooks.preflights:
            known = ", ".join((*GENERIC_PREFLIGHTS, *hooks.preflights))
            raise source.error(
                ("preflight", i),
                f"pre-flight {name!r} is neither generic nor one of {engine.hooks or 'the (absent) hooks module'}'s "
                f"PREFLIGHTS (known: {known})",
            )
    return engine


def available_engines() -> list[str]:
    return sorted(
        {
            p.name.removesuffix(".toml")
            for folder in _engine_folders()
            if folder.is_dir()
            for p in folder.iterdir()
            if p.name.endswith(".toml")
        }
    )
