"""The matrix spec: a TOML file in matrix/, validated completely before anything is expanded.

Validation is two passes over one file: pydantic checks shapes (unknown keys are errors), then the
engine's data checks meaning (which axes exist, which modes, which values may be `pinned`). Every error
is an InputError that names the file, line and key.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field

from servematrix.engines import Engine, load_engine
from servematrix.errors import InputError
from servematrix.formats import tomlsource
from servematrix.formats.tomlsource import KeyPath, TomlSource
from servematrix.records.cell import PINNED, GpuKind

LOCKED = "locked"  # a package axis left to the resolver
# The optional `resolution` axis: resolve as the index is today, or as it was when the engine release was
# published (uv's --exclude-newer at the release's upload time). `today` is what a matrix without the axis does.
RESOLUTION = "resolution"
TODAY = "today"
AS_RELEASED = "as-released"
RESOLUTIONS = (TODAY, AS_RELEASED)
RECIPE_DEFAULT = "default"  # a flag axis's value on a kind whose recipe does not give the flag
PACKAGE_NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
# Arguments are never given to a shell, but reproduce commands are pasted into one: a value that needs
# quoting to be safe is almost always a mistake in a matrix file.
SHELL_METACHARACTERS = re.compile(r"[;&|$`<>\\\n\r]|\$\(")
RULE_OPERATORS = ("==", "!=", ">=", "<=", "~=", ">", "<")
# Names end up in file names, CI job names, HTML and Markdown: keep them to characters that need no
# quoting or escaping anywhere.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*\Z")  # \Z: `$` would let a trailing newline through
NAME_RULE = "letters, digits and . _ + -, starting with a letter or digit"

PositiveSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ModelSpec(_Strict):
    name: str = Field(min_length=1)
    path: str = Field(min_length=1)
    build: str | None = None  # a model builder of the engine, e.g. "tiny-llama"
    # The model's config files without weights (config.json, its quantization config), a folder relative to
    # the matrix file: what the load pre-flight reads on a host without the model. A runner with the weights
    # serves `path` as before.
    config_dir: str | None = None


class FlagAxis(_Strict):
    """`[flag_axes.<axis>]`: an axis whose values are one server flag's values (`moe_runner` sweeping
    `--moe-runner-backend`). A kind outside `gpu` keeps its recipe's value; a value equal to the recipe's
    leaves the environment's id as it was without the axis."""

    flag: str = Field(pattern=r"^--[A-Za-z0-9][A-Za-z0-9_-]*$")
    gpu: list[str] = []  # the kinds it sweeps; empty: all
    source: str = ""


class CudaKind(_Strict):
    index_url: str | None = None
    extra_index_urls: list[str] = []
    base_image: str | None = None


class ServerSpec(_Strict):
    args: list[str] = []
    env: dict[str, str] = {}
    ready_timeout_s: PositiveSeconds | None = None
    # Flags whose value is a credential, beside the engine's own: masked as *** wherever argv is stored,
    # printed or published.
    secret_flags: list[Annotated[str, Field(pattern=r"^--?[A-Za-z0-9][A-Za-z0-9_-]*$")]] = []


class PrefillProfileSpec(_Strict):
    """`[bench.prefill]`: the prefill profile, run for every cell of a matrix that has a mode changing prefill
    (engine data: `phases`), the baseline included. Long prompts, one output token, low concurrency, so each
    batch stays inside the token range a prefill graph captures (sglang: up to chunked_prefill_size, 8192 on
    an H200); judged on TTFT and input tok/s. SGLang's own PRs measure prefill graphs with 1024 tokens in."""

    concurrency: list[Annotated[int, Field(gt=0, le=1024)]] = Field(default=[1, 4], min_length=1)
    input_len: int = Field(default=1024, gt=0, le=131072)
    output_len: int = Field(default=1, gt=0, le=16)
    prompts_per_concurrency: int = Field(default=16, gt=0, le=100_000)
    warmup: int = Field(default=4, ge=0, le=10_000)
    repeats: int = Field(default=3, ge=1, le=100)
    min_level_s: float = Field(default=0.0, ge=0, le=3600, allow_inf_nan=False)


class CorrectnessSpec(_Strict):
    """`[bench.correctness]`: every mode's greedy answers against the baseline mode's before its figures
    (`stages/bench/correctness.py`): the built-in prompt set at one stream and batched, ``max_tokens`` each, with
    the top ``top_k`` logprobs where the API gives them. ``accuracy_floor``: for real weights, the exact-match
    floor of the arithmetic probe (``accuracy_problems`` generated additions); unset on random weights, where
    every mode scores about 0."""

    enabled: bool = True
    max_tokens: int = Field(default=16, gt=0, le=512)
    top_k: int = Field(default=5, gt=0, le=20)
    accuracy_floor: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    accuracy_problems: int = Field(default=50, gt=0, le=10_000)


# Server starts per mode: a bound past which a value is a typo (each start of a large model costs minutes).
MAX_STARTS = 10


class BenchSpec(_Strict):
    # The decode profile (the bench's record itself). Upper bounds: what a run can do in hours, not days; a
    # value past them is a typo, refused at its line before anything starts (1e9 prompts used to fail after
    # the server was up; input_len = 1e9 ran out of memory building prompts).
    concurrency: list[Annotated[int, Field(gt=0, le=1024)]] = Field(min_length=1)
    input_len: int = Field(gt=0, le=131072)
    output_len: int = Field(gt=0, le=65536)
    prompts_per_concurrency: int = Field(gt=0, le=100_000)
    warmup: int = Field(default=2, ge=0, le=10_000)
    repeats: int = Field(default=1, ge=1, le=100)
    # chat or completions (OpenAI), or generate (sglang's native /generate): one the engine lists in `bench_apis`.
    api: Literal["chat", "completions", "generate"] = "chat"
    temperature: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    # Each repeat lasts at least this long at the throughput measured in the warmup (0: prompts_per_concurrency).
    min_level_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    # Server starts per mode, interleaved across an environment's modes (baseline, piecewise, baseline, ...):
    # the spread between starts was larger than the piecewise effect on a real H200.
    starts: int = Field(default=1, ge=1, le=MAX_STARTS)
    # The client's worker processes, and how many of the host's CPUs they get to themselves (0: no pinning;
    # the server then runs on the rest). Its ceiling is measured on this host before the first cell.
    client_processes: int = Field(default=1, ge=1, le=64)
    client_cpus: int = Field(default=0, ge=0)
    # Warm-up until stable: a level whose repeats drift by more than drift_bound (first half against second
    # half, ranges apart) turns its oldest repeat into warm-up and runs one more, up to max_warmup_repeats.
    drift_bound: float = Field(default=0.10, gt=0, le=10, allow_inf_nan=False)
    max_warmup_repeats: int = Field(default=3, ge=0, le=100)
    prefill: PrefillProfileSpec = PrefillProfileSpec()
    correctness: CorrectnessSpec = CorrectnessSpec()


class SpecFile(_Strict):
    engine: str
    description: str = ""
    # A version (`3.12`, `3.12.4`): it reaches uv's command line and a workflow's step outputs as it is written.
    python: str = Field(default="3.12", pattern=r"^3\.\d{1,2}(\.\d{1,3})?$")
    model: ModelSpec
    # Package axes: any package's version, beside the engine's own axes (e.g. kernels = ["locked", "0.14.1"]).
    # A version is a resolver override, recorded as a crossed pin; `locked` leaves the package to the resolver.
    packages: list[str] = []
    axes: dict[str, list[str]]
    # Axes over a server flag's values, beside the version axes (their values: axes.<name>).
    flag_axes: dict[str, FlagAxis] = {}
    include: list[dict[str, str | list[str]]] = []
    exclude: list[dict[str, str | list[str]]] = []
    server: ServerSpec = ServerSpec()
    gpu: dict[str, GpuKind]
    cuda: dict[str, CudaKind] = {}
    bench: BenchSpec


def matrix_json_schema() -> dict[str, Any]:
    """The JSON schema of a matrix file, for editors (`servematrix schema`; matrix/schema.json is its output)."""
    schema = SpecFile.model_json_schema()
    schema["title"] = "servematrix matrix"
    schema["description"] = (
        "A servematrix matrix file: version axes, rules, server arguments, GPU kinds and the benchmark workload. "
        "Engine-dependent checks (axis names, versions, modes) are made by `servematrix plan`."
    )
    return schema


class Rule(BaseModel):
    """An include/exclude rule: axis -> accepted values (exact strings or version specifiers)."""

    model_config = ConfigDict(frozen=True)
    conditions: tuple[tuple[str, tuple[str, ...]], ...]
    line: int | None = None

    def matches(self, values: dict[str, str]) -> bool:
        return all(any(value_matches(values.get(k, ""), want) for want in wants) for k, wants in self.conditions)


def value_matches(value: str, wanted: str) -> bool:
    if wanted.startswith(RULE_OPERATORS):
        try:
            return SpecifierSet(wanted).contains(Version(value), prereleases=True)
        except InvalidVersion:
            return False  # `pinned` never satisfies a numeric range
    return value == wanted


class Spec(BaseModel):
    """A validated matrix: the input of expansion."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    path: Path
    engine: Engine
    file: SpecFile
    include: tuple[Rule, ...]
    exclude: tuple[Rule, ...]
    axes_line: int | None = None  # for errors about the matrix as a whole, e.g. too many cells

    @property
    def axis_names(self) -> tuple[str, ...]:
        """The axes of an environment, in order: the engine's versions, package axes, the optional
        `resolution`, flag axes, then the GPU kind."""
        optional = (RESOLUTION,) if RESOLUTION in self.file.axes else ()
        return (*self.engine.axes, *self.file.packages, *optional, *self.file.flag_axes, "gpu")


def model_config_dir(spec: Spec) -> Path | None:
    """The folder of the model's config files on this host (no weights): the matrix's `[model] config_dir`
    (relative to the matrix file), else the model path when it is a local folder with a config.json."""
    model = spec.file.model
    if model.config_dir:
        return (Path(spec.path).parent / model.config_dir).resolve()
    local = Path(model.path)
    return local.resolve() if (local / "config.json").is_file() else None


def load_spec(path: Path | str) -> Spec:
    source = tomlsource.load(Path(path))
    file = tomlsource.validate(source, SpecFile)
    _check_names(source, file)
    engine = _engine(source, file)
    _check_axes(source, file, engine)
    _check_bench(source, file, engine)
    _check_arguments(source, file)
    _check_tensor_parallel(source, file, engine)
    _check_harness_flags(source, file, engine)
    _check_flag_axes_reach_the_server(source, file, engine)
    exclude = tuple(_rule(source, ("exclude", i), r, file, engine) for i, r in enumerate(file.exclude))
    include = tuple(_rule(source, ("include", i), r, file, engine) for i, r in enumerate(file.include))
    _check_includes(source, include, engine)
    return Spec(
        path=Path(path),
        engine=engine,
        file=file,
        include=include,
        exclude=exclude,
        axes_line=source.line_of(("axes",)),
    )


def _check_names(source: TomlSource, file: SpecFile) -> None:
    places: list[tuple[KeyPath, str, str]] = [(("engine",), file.engine, "engine name")]
    places += [(("gpu", name), name, "GPU kind name") for name in file.gpu]
    places += [(("cuda", name), name, "CUDA kind name") for name in file.cuda]
    places += [(("axes", "mode", i), mode, "mode name") for i, mode in enumerate(file.axes.get("mode", []))]
    for where, name, what in places:
        if not NAME.match(name):
            raise source.error(where, f"{name!r} is not a valid {what}: use {NAME_RULE}")


def _check_bench(source: TomlSource, file: SpecFile, engine: Engine) -> None:
    if file.bench.api not in engine.bench_apis:
        raise source.error(
            ("bench", "api"),
            f"engine {engine.name} does not serve the {file.bench.api!r} API; use one of {list(engine.bench_apis)}",
        )
    for where, levels in ((("bench",), file.bench.concurrency), (("bench", "prefill"), file.bench.prefill.concurrency)):
        seen: dict[int, int] = {}
        for index, level in enumerate(levels):
            if level in seen:
                raise source.error((*where, "concurrency", index), f"concurrency {level} is listed twice")
            seen[level] = index


def _check_tensor_parallel(source: TomlSource, file: SpecFile, engine: Engine) -> None:
    """A kind that asks for tensor parallelism needs the engine's data to say how, for every version."""
    for name, kind in file.gpu.items():
        if not kind.tensor_parallel or kind.count < 2:
            continue
        for version in file.axes.get(engine.version_axis, []):
            if engine.tensor_parallel_for(version) is None:
                raise source.error(
                    ("gpu", name, "tensor_parallel"),
                    f"engine {engine.name} {version} does not say how to serve tensor-parallel (its data has no "
                    "[[tensor_parallel]] row for this version)",
                )


def _sets(args: Sequence[str], flag: str) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for arg in args)


def _harness_flags(engine: Engine, versions: Sequence[str]) -> set[str]:
    """The flags whose value the harness fills in each release's launch command (`--port {port}`, `--host
    {host}`): the harness picks the port it probes and binds the server to loopback; a matrix never sets them."""
    owned = {"--port", "--host"}
    for version in versions:
        try:
            argv = engine.launch_argv(version)
        except InputError:
            continue
        owned |= {argv[i - 1] for i, part in enumerate(argv) if part in ("{port}", "{host}") and i}
    return {flag for flag in owned if flag.startswith("-")}


def _check_harness_flags(source: TomlSource, file: SpecFile, engine: Engine) -> None:
    """A matrix that sets `--port` or `--host` would move the server off the port the harness probes (a
    `server-timeout` blamed on the stack) or off loopback (argparse keeps the last value): refused."""
    owned = _harness_flags(engine, file.axes.get(engine.version_axis, []))
    places: list[tuple[KeyPath, str]] = [(("server", "args", i), a) for i, a in enumerate(file.server.args)]
    for name, kind in file.gpu.items():
        places += [(("gpu", name, "args", i), a) for i, a in enumerate(kind.args)]
        places += [
            (("gpu", name, "args_by_release", r, "args", i), a)
            for r, rows in enumerate(kind.args_by_release)
            for i, a in enumerate(rows.args)
        ]
    places += [(("flag_axes", name, "flag"), axis.flag) for name, axis in file.flag_axes.items()]
    for where, arg in places:
        flag = arg.partition("=")[0]
        if flag in owned:
            raise source.error(
                where,
                f"{flag} is the harness's own: it picks the server's port and binds it to 127.0.0.1 "
                "(a matrix's value would override it); remove it",
            )


def _check_flag_axes_reach_the_server(source: TomlSource, file: SpecFile, engine: Engine) -> None:
    """A flag axis whose flag a mode's args or the tensor-parallel args also give is refused: those come after
    the kind's args in the argv, and argparse keeps the last value, so every cell of the sweep would run the
    mode's value under the swept value's label. (The axis is not applied last instead: a mode's flags are what
    make it that mode, and a sweep that overrode them would publish cells of another mode under its name.)"""
    versions = file.axes.get(engine.version_axis, [])
    modes = file.axes.get("mode", [])
    for name, axis in file.flag_axes.items():
        kinds = [kind for kind in file.axes.get("gpu", []) if kind in file.gpu and (not axis.gpu or kind in axis.gpu)]
        for version in versions:
            try:
                flag = engine.rename_flags((axis.flag,), version)[0]
            except InvalidVersion:
                continue
            for mode in modes:
                flags = engine.mode_flags_for(mode, version)
                if flags.applicable and _sets(engine.rename_flags(flags.args, version), flag):
                    raise source.error(
                        ("flag_axes", name, "flag"),
                        f"flag axis {name!r} sweeps {axis.flag}, which mode {mode!r} sets itself on "
                        f"{engine.name} {version} (its args come last, so every cell would run the mode's value): "
                        "sweep another flag, or leave that mode out of this matrix",
                    )
            for kind in kinds:
                gpu = file.gpu[kind]
                parallel = engine.tensor_parallel_args(version, gpus=gpu.count, port=engine.default_port)
                if gpu.tensor_parallel and _sets(parallel, flag):
                    raise source.error(
                        ("flag_axes", name, "flag"),
                        f"flag axis {name!r} sweeps {axis.flag}, which the tensor-parallel args of GPU kind "
                        f"{kind!r} set on {engine.name} {version} (from its count): sweep another flag",
                    )


def _engine(source: TomlSource, file: SpecFile) -> Engine:
    try:
        return load_engine(file.engine)
    except InputError as exc:
        raise source.error(("engine",), exc.message) from None


def _check_packages(source: TomlSource, file: SpecFile, engine: Engine) -> None:
    seen: set[str] = set()
    for index, name in enumerate(file.packages):
        if not PACKAGE_NAME.match(name) or canonicalize_name(name) != name:
            raise source.error(("packages", index), f"{name!r} is not a package name (lowercase, as pip normalises it)")
        if name in (*engine.axes, "gpu", "mode") or name in seen:
            raise source.error(("packages", index), f"{name!r} is already an axis")
        seen.add(name)


def _known_axes(file: SpecFile, engine: Engine) -> tuple[str, ...]:
    return (*engine.axes, *file.packages, RESOLUTION, *file.flag_axes, "gpu", "mode")


def _check_flag_axes(source: TomlSource, file: SpecFile, engine: Engine) -> None:
    taken = (*engine.axes, *file.packages, RESOLUTION, "gpu", "mode")
    flags: dict[str, str] = {}
    for name, axis in file.flag_axes.items():
        where = ("flag_axes", name)
        if not NAME.match(name) or name in taken:
            raise source.error(where, f"{name!r} cannot name a flag axis: it is taken or not a name ({NAME_RULE})")
        if axis.flag in flags:
            raise source.error((*where, "flag"), f"{axis.flag} is already swept by flag axis {flags[axis.flag]!r}")
        flags[axis.flag] = name
        for index, kind in enumerate(axis.gpu):
            if kind not in file.gpu:
                raise source.error(
                    (*where, "gpu", index), f"unknown GPU kind {kind!r}: define it in a [gpu.{kind}] table"
                )
        if name not in file.axes:
            raise source.error(where, f"flag axis {name!r} has no values: give them as axes.{name}")


def _near(version: Version) -> set[Version]:
    """A version, one just above it and one just below it: the points where a range's bounds can change."""
    release = version.release
    points = {version, Version(".".join(map(str, (*release, 0, 0, 0, 1)))), Version(f"{version.base_version}.dev0")}
    points.add(Version(".".join(map(str, (*release[:-1], release[-1] + 1)))))
    last = max((i for i, part in enumerate(release) if part), default=None)
    if last is not None:
        points.add(Version(".".join(map(str, (*release[:last], release[last] - 1, 999999)))))
    return points


def _probe_versions(ranges: Sequence[SpecifierSet], releases: Sequence[str]) -> list[Version] | None:
    """Versions that decide whether ranges hold a release and share one: the matrix's releases, and each
    bound with a version just above and just below it (a range is a union of intervals between its bounds).
    None where a range compares as text (`===`), which no probe decides."""
    points: set[Version] = set()
    for value in releases:
        try:
            points.add(Version(value))
        except InvalidVersion:
            continue
    for ranges_ in ranges:
        for one in ranges_:
            if one.operator == "===":
                return None
            points |= _near(Version(one.version.removesuffix(".*")))
    return sorted(points)


def _row_flags(args: Sequence[str]) -> set[str]:
    return {arg.partition("=")[0] for arg in args if arg.startswith("--")}


def _check_releases(source: TomlSource, file: SpecFile, engine: Engine) -> None:
    """Each `args_by_release` row's range must be a version specifier that holds a release, and two rows of
    a kind whose ranges share a release must not set the same flag: the later row would win silently."""
    for name, kind in file.gpu.items():
        ranges: list[SpecifierSet] = []
        for index, rows in enumerate(kind.args_by_release):
            try:
                ranges.append(SpecifierSet(rows.versions))
            except InvalidSpecifier:
                raise source.error(
                    ("gpu", name, "args_by_release", index, "versions"), f"{rows.versions!r} is not a version specifier"
                ) from None
        probes = _probe_versions(ranges, file.axes.get(engine.version_axis, []))
        if probes is None:
            continue
        held = [{v for v in probes if spec.contains(v, prereleases=True)} for spec in ranges]
        for index, rows in enumerate(kind.args_by_release):
            where = ("gpu", name, "args_by_release", index, "versions")
            if not held[index]:
                raise source.error(where, f"{rows.versions!r} holds no release: this row would never apply")
            for earlier in range(index):
                shared = held[earlier] & held[index]
                same = _row_flags(kind.args_by_release[earlier].args) & _row_flags(rows.args)
                if shared and same:
                    line = source.line_of(("gpu", name, "args_by_release", earlier, "versions"))
                    raise source.error(
                        where,
                        f"{rows.versions!r} overlaps row {earlier + 1}'s {kind.args_by_release[earlier].versions!r}"
                        + (f" (line {line})" if line else "")
                        + f" (both hold {min(shared)}) and both set {', '.join(sorted(same))}: the later row "
                        "would win silently; make the ranges disjoint or give the flag in one row",
                    )


def _check_axes(source: TomlSource, file: SpecFile, engine: Engine) -> None:
    _check_packages(source, file, engine)
    _check_flag_axes(source, file, engine)
    _check_releases(source, file, engine)
    known = _known_axes(file, engine)
    for axis, values in file.axes.items():
        if axis not in known:
            raise source.error(("axes", axis), f"unknown axis for engine {engine.name} (axes: {', '.join(known)})")
        if not values:
            raise source.error(("axes", axis), "axis is empty: give at least one value")
        seen: dict[str, int] = {}
        for index, value in enumerate(values):
            _check_axis_value(source, ("axes", axis, index), axis, value, file, engine)
            # 0.5.9 and 0.5.09 are one version: both would build and run the same cells twice.
            same = _canonical(value)
            if same in seen:
                first = source.line_of(("axes", axis, seen[same]))
                raise source.error(
                    ("axes", axis, index),
                    f"duplicate value {value!r} (already listed as {values[seen[same]]!r}"
                    + (f" on line {first})" if first else ")"),
                )
            seen[same] = index
    for axis in known:
        if axis not in file.axes and axis != RESOLUTION:
            raise source.error(("axes",), f"axis {axis!r} is missing")


def _check_axis_value(
    source: TomlSource, where: KeyPath, axis: str, value: str, file: SpecFile, engine: Engine
) -> None:
    if axis == "mode":
        if value not in engine.modes:
            raise source.error(where, f"unknown mode {value!r} for {engine.name} (modes: {', '.join(engine.modes)})")
    elif axis == "gpu":
        if value not in file.gpu:
            raise source.error(where, f"unknown GPU kind {value!r}: define it in a [gpu.{value}] table")
    elif axis in file.packages and value == LOCKED:
        return
    elif axis == RESOLUTION:
        if value not in RESOLUTIONS:
            raise source.error(where, f"unknown resolution {value!r} (one of: {', '.join(RESOLUTIONS)})")
    elif axis in file.flag_axes:
        if not NAME.match(value):
            raise source.error(where, f"{value!r} is not a flag value this axis can sweep: use {NAME_RULE}")
    elif value == PINNED:
        if axis not in engine.pinnable:
            raise source.error(
                where, f"{axis} cannot be {PINNED!r}: only {', '.join(engine.pinnable) or 'no axis'} can"
            )
    else:
        try:
            Version(value)
        except InvalidVersion:
            raise source.error(where, f"{value!r} is not a valid version") from None


def _canonical(value: str) -> str:
    try:
        return str(Version(value))
    except InvalidVersion:
        return value


def _check_arguments(source: TomlSource, file: SpecFile) -> None:
    places: list[tuple[KeyPath, str]] = [(("model", "path"), file.model.path)]
    places += [(("server", "args", i), a) for i, a in enumerate(file.server.args)]
    places += [(("server", "env", k), v) for k, v in file.server.env.items()]
    for name, kind in file.gpu.items():
        places += [(("gpu", name, "args", i), a) for i, a in enumerate(kind.args)]
        places += [
            (("gpu", name, "args_by_release", r, "args", i), a)
            for r, rows in enumerate(kind.args_by_release)
            for i, a in enumerate(rows.args)
        ]
        places += [(("gpu", name, "env", k), v) for k, v in kind.env.items()]
    for where, value in places:
        if SHELL_METACHARACTERS.search(value):
            raise source.error(
                where, f"{value!r} contains shell metacharacters; give each argument as its own list item"
            )


def _rule(source: TomlSource, where: KeyPath, raw: dict[str, str | list[str]], file: SpecFile, engine: Engine) -> Rule:
    known = _known_axes(file, engine)
    if not raw:
        raise source.error(where, "rule is empty")
    conditions = []
    for key, value in raw.items():
        if key not in known:
            raise source.error((*where, key), f"unknown axis in rule (axes: {', '.join(known)})")
        wanted = (value,) if isinstance(value, str) else value
        for item in wanted:
            if item.startswith(RULE_OPERATORS):
                try:
                    SpecifierSet(item)
                except InvalidSpecifier:
                    raise source.error((*where, key), f"{item!r} is not a valid version specifier") from None
            elif key in ("gpu", "mode", RESOLUTION, *file.flag_axes) or item in (PINNED, LOCKED):
                _check_axis_value(source, (*where, key), key, item, file, engine)
            else:
                try:
                    Version(item)
                except InvalidVersion:
                    raise source.error((*where, key), f"{item!r} is not a valid version or specifier") from None
        conditions.append((key, tuple(wanted)))
    return Rule(conditions=tuple(conditions), line=source.line_of(where))


def _check_includes(source: TomlSource, include: tuple[Rule, ...], engine: Engine) -> None:
    for index, rule in enumerate(include):
        given = dict(rule.conditions)
        for axis in (*engine.axes, "gpu"):
            if axis not in given:
                raise source.error(("include", index), f"an include names one environment: {axis!r} is missing")
            if len(given[axis]) != 1 or given[axis][0].startswith(RULE_OPERATORS):
                raise source.error(("include", index, axis), "an include takes one exact value per axis")


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)
