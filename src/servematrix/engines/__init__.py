"""Engines are plugins described by data (``data/engines/<name>.toml``), with hooks where data cannot say it.

An engine says how to install a version (requirements), how to launch it (argv by version range), how
to tell it is ready, which flags each mode needs in each version, and which flags were renamed. This
module reads those tables; adding an engine or a version is a data change.

What data cannot say, an engine's hooks module does (`hooks = "servematrix.engines.sglang"` in its data),
to the contract in `engines/hooks.py`; `engines/plugins.py` imports it and checks the data's names against
it when a plan is made. This module reads data only, and imports no hooks: loading a spec or reading a
store loads no engine code. The runner calls hooks by name and knows nothing of any engine.
An engine's own code lives in a subpackage named for it: `sglang/` (its hooks), `transformers/` (the tiny
model builder its data names in `model_builders`).
Engine data files are found in the directories of `SERVEMATRIX_ENGINES` (os.pathsep-separated), then
among servematrix's own; only their file names (`ENGINE_NAME`) are engine names.
"""

from __future__ import annotations

import functools
import os
import re
import string
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version
from pydantic import ConfigDict, Field, field_validator, model_validator

from servematrix.errors import InputError
from servematrix.formats import tomlsource
from servematrix.formats.tomlsource import DataTable


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


class TensorParallel(_Ranged):
    """How a server spreads over a GPU kind of several GPUs that asks for it (`tensor_parallel = true`), one
    rank per GPU: the args it adds, where `{gpus}` is the kind's count and `{port+N}` a port N above --port
    (one the ranks use: the harness checks it valid and free with --port, as a derived port)."""

    args: tuple[str, ...]
    source: str = ""

    def port_offsets(self) -> tuple[int, ...]:
        return tuple(int(n) for arg in self.args for n in _PORT_ABOVE.findall(arg))

    def formatted(self, gpus: int, port: int) -> tuple[str, ...]:
        return tuple(
            _PORT_ABOVE.sub(lambda m: str(port + int(m.group(1))), arg).replace("{gpus}", str(gpus))
            for arg in self.args
        )


_PORT_ABOVE = re.compile(r"\{port\+(\d+)\}")


class ModeEvidence(_Ranged):
    """Log lines that prove a mode really ran (`applied`) or really did not (`not_applied`): an engine may
    silently switch a feature off, and a cell must not pass under a mode it did not run."""

    mode: str
    applied: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    source: str = ""


class ImageRow(_Ranged):
    """The engine's own published image of a release (`--backend image`): a reference per CUDA version it is
    published for (the environment's `cuda` axis), or one `reference` for an engine without a CUDA axis. In a
    reference, `{version}` is the engine's version and any other `{axis}` that axis's value. A CUDA version a
    row does not name has no image of that release."""

    cuda: dict[str, str] = Field(default_factory=dict)
    reference: str = ""
    source: str  # where the scheme was read (the engine's release workflow at a tag)

    @model_validator(mode="after")
    def _one_kind(self) -> ImageRow:
        if bool(self.cuda) == bool(self.reference):
            raise ValueError("an image row names either `cuda` (a reference per CUDA version) or `reference`")
        return self

    def templates(self) -> dict[str, str]:
        """Each reference template by where it is written (`reference`, or the CUDA version's key)."""
        return dict(self.cuda) or {"reference": self.reference}


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
    # The streaming APIs its server answers, of those the bench speaks (`stages/bench/workload.py` APIS): a
    # matrix's `[bench] api` must be one of them.
    bench_apis: tuple[Literal["chat", "completions", "generate"], ...] = ("chat", "completions")
    derived_ports: tuple[DerivedPorts, ...] = ()
    images: tuple[ImageRow, ...] = ()  # its published images, by version range (`--backend image`)
    tensor_parallel: tuple[TensorParallel, ...] = ()
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

    def port_offsets(self, version: str, *, ranks: int = 1) -> tuple[int, ...]:
        """Offsets from --port of every port this version derives from it, with those its ranks use when a
        server has several (tensor parallelism)."""
        parsed = Version(version)
        offsets = {o for row in self.derived_ports if row.contains(parsed) for o in row.offsets}
        tensor_parallel = self.tensor_parallel_for(version) if ranks > 1 else None
        if tensor_parallel is not None:
            offsets.update(tensor_parallel.port_offsets())
        return tuple(sorted(offsets))

    def tensor_parallel_for(self, version: str) -> TensorParallel | None:
        parsed = Version(version)
        return next((row for row in self.tensor_parallel if row.contains(parsed)), None)

    def tensor_parallel_args(self, version: str, *, gpus: int, port: int) -> tuple[str, ...]:
        """What a tensor-parallel server on `gpus` GPUs adds to its argv; nothing on one GPU (one rank is the
        default of every engine), so a single-GPU cell keeps its argv."""
        row = self.tensor_parallel_for(version) if gpus > 1 else None
        return row.formatted(gpus, port) if row is not None else ()

    def phase_of(self, mode: str) -> str:
        return self.phases.get(mode, "decode")

    def evidence_for(self, mode: str, version: str) -> ModeEvidence | None:
        parsed = Version(version)
        return next((row for row in self.mode_evidence if row.mode == mode and row.contains(parsed)), None)

    def image_row(self, version: str) -> ImageRow | None:
        """The published images of this version, if the data names them."""
        parsed = Version(version)
        return next((row for row in self.images if row.contains(parsed)), None)


ENGINES_PATH_ENV = "SERVEMATRIX_ENGINES"
# An engine's name is the stem of its data file: an identifier, never a path. Anything else (a store row's
# "../../tmp/evil/e") is refused before it is joined into one.
ENGINE_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")


def _engine_folders() -> list[Traversable]:
    """Where engine data files are looked for: SERVEMATRIX_ENGINES's directories, then servematrix's own."""
    extra = [Path(p) for p in os.environ.get(ENGINES_PATH_ENV, "").split(os.pathsep) if p.strip()]
    return [*extra, resources.files("servematrix.data").joinpath("engines")]


def engine_file(name: str) -> Traversable | None:
    """The data file of the registered engine `name` (one of `available_engines()`), None for any other name:
    only an identifier is joined into a folder's path, so no name reaches outside the engine folders."""
    if not ENGINE_NAME.match(name):
        return None
    for folder in _engine_folders():
        candidate = folder.joinpath(f"{name}.toml")
        if candidate.is_file():
            return candidate
    return None


def check_registered(name: object, where: str) -> None:
    """A name read from a store row or a published record (`where`): one of `available_engines()`, else an
    InputError at `where`, before anything loads it."""
    if not isinstance(name, str) or engine_file(name) is None:
        shown = repr(name)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise InputError(
            f"{where}: engine {shown} is not a registered engine (known: {', '.join(available_engines())})"
        )


def load_engine(name: str) -> Engine:
    candidate = engine_file(name)
    if candidate is None:
        known = ", ".join(available_engines())
        raise InputError(f"unknown engine {name!r} (known: {known})")
    with resources.as_file(candidate) as path:
        return _load(path)


@functools.cache
def _load(path: Path) -> Engine:
    """Engine data alone: its hooks module is neither imported nor checked here (`engines/plugins.py`)."""
    source = tomlsource.load(path, what="engine data")
    engine = tomlsource.validate(source, Engine)
    if engine.name != path.stem:
        raise source.error(("name",), f"engine data in {path.name} names itself {engine.name!r}, not {path.stem!r}")
    known = {"version", *engine.axes}
    for index, row in enumerate(engine.images):
        for key, template in row.templates().items():
            where = ("images", index, *(("cuda", key) if row.cuda else ("reference",)))
            try:
                fields = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
            except ValueError as exc:
                raise source.error(where, f"image reference {template!r}: {exc}") from None
            if unknown := sorted(fields - known):
                raise source.error(
                    where, f"image reference {template!r} names {unknown}: only {sorted(known)} can be filled in"
                )
    return engine


def secret_flags() -> frozenset[str]:
    """Every registered engine's secret flags, from their data alone: what a store masks in any argv."""
    return _secret_flags(os.environ.get(ENGINES_PATH_ENV, ""))


@functools.cache
def _secret_flags(_engine_path: str) -> frozenset[str]:  # keyed by SERVEMATRIX_ENGINES: its engines count too
    return frozenset(flag for name in available_engines() for flag in load_engine(name).secret_flags)


def available_engines() -> list[str]:
    """The registry: the engine names of every data file found (`ENGINE_NAME`), in name order."""
    return sorted(
        {
            p.name.removesuffix(".toml")
            for folder in _engine_folders()
            if folder.is_dir()
            for p in folder.iterdir()
            if p.name.endswith(".toml") and ENGINE_NAME.match(p.name.removesuffix(".toml"))
        }
    )
