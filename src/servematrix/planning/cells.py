"""Expansion: a validated Spec becomes environments and cells with content-hash ids.

An environment is a point on the version axes plus a GPU kind; a cell is an environment and a mode.
Ids hash canonical JSON of the inputs only (no paths, timestamps or dict order), so the same matrix
gives the same ids on any machine, in any checkout and in any run.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Iterable, Sequence
from types import MappingProxyType
from typing import Any

from packaging.requirements import Requirement

from servematrix.config.spec import (
    LOCKED,
    PINNED,
    RECIPE_DEFAULT,
    RESOLUTION,
    TODAY,
    GpuKind,
    Rule,
    Spec,
    value_matches,
    warn,
)
from servematrix.engines import Engine, ModeFlags
from servematrix.errors import InputError, Location
from servematrix.records.cell import Cell, Environment

DEFAULT_HOST = "127.0.0.1"
# A guard against a matrix that would exhaust memory (2,000,000 cells took 5.9 GB before failing), far
# above any matrix a fleet runs: the product matrix has 52 cells, and 10,000 plan in well under 2 s.
DEFAULT_MAX_CELLS = 20_000


def content_hash(payload: Any, length: int = 12) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:length]


def environment_points(spec: Spec) -> list[dict[str, str]]:
    """Every point (version axes + gpu) of the full product, before rules apply. A flag axis sweeps only the
    GPU kinds it names; on the others it takes the kind's recipe value, once."""
    names = spec.axis_names
    axes = spec.file.axes
    flag_axes = spec.file.flag_axes
    fixed = [n for n in names if n not in flag_axes]
    points = []
    merged: dict[tuple[str, str, str], list[str]] = {}
    for values in itertools.product(*(axes[n] for n in fixed)):
        point = dict(zip(fixed, values, strict=True))
        version = point[spec.engine.version_axis]
        choices = [_flag_values(spec, name, point["gpu"], version) for name in flag_axes]
        for name in flag_axes:
            same = _default_is_listed(spec, name, point["gpu"], version)
            if same is not None and version not in merged.setdefault((name, point["gpu"], same), []):
                merged[(name, point["gpu"], same)].append(version)
        for swept in itertools.product(*choices):
            full = {**point, **dict(zip(flag_axes, swept, strict=True))}
            points.append({n: full[n] for n in names})
    for (name, gpu, value), versions in merged.items():
        flag = spec.file.flag_axes[name].flag
        warn(
            f"{spec.path}: flag axis {name!r}: {RECIPE_DEFAULT!r} on GPU kind {gpu!r} is its recipe's "
            f"{flag} {value} ({spec.engine.name} {', '.join(versions)}), which the axis also lists: the two "
            f"would be one server argv under two cell ids, so it is planned once, as {value!r}"
        )
    return points


def _default_is_listed(spec: Spec, axis: str, gpu: str, version: str) -> str | None:
    """The recipe's value of a swept flag where the axis lists both it and `default` (which keeps the recipe's
    value): the two would be the same argv, served, benchmarked and published twice under two ids."""
    declared = spec.file.flag_axes[axis]
    values = spec.file.axes[axis]
    if not swept(spec, axis, gpu) or RECIPE_DEFAULT not in values:
        return None
    recipe = flag_value(recipe_args(spec.file.gpu[gpu], version), declared.flag)
    return recipe if recipe is not None and recipe != RECIPE_DEFAULT and recipe in values else None


def _flag_values(spec: Spec, axis: str, gpu: str, version: str) -> list[str]:
    declared = spec.file.flag_axes[axis]
    if declared.gpu and gpu not in declared.gpu:
        return [flag_value(recipe_args(spec.file.gpu[gpu], version), declared.flag) or RECIPE_DEFAULT]
    values = list(spec.file.axes[axis])
    if _default_is_listed(spec, axis, gpu, version) is not None:
        values.remove(RECIPE_DEFAULT)  # the recipe's own value stands for it (and keeps the id it had)
    return values


def swept(spec: Spec, axis: str, gpu: str) -> bool:
    """Whether a flag axis sweeps this GPU kind (else the kind keeps its recipe's value)."""
    declared = spec.file.flag_axes[axis]
    return not declared.gpu or gpu in declared.gpu


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value `args` give `flag` (`--flag value` or `--flag=value`; the last one wins, as argparse reads it)."""
    found = None
    for index, arg in enumerate(args):
        if arg == flag and index + 1 < len(args):
            found = args[index + 1]
        elif arg.startswith(flag + "="):
            found = arg.partition("=")[2]
    return found


def with_flag(args: Sequence[str], flag: str, value: str) -> tuple[str, ...]:
    """`args` with `flag` set to `value`: in place where it is given (each time), else appended."""
    out = list(args)
    placed = False
    for index, arg in enumerate(out):
        if arg == flag and index + 1 < len(out):
            out[index + 1] = value
            placed = True
        elif arg.startswith(flag + "="):
            out[index] = f"{flag}={value}"
            placed = True
    return tuple(out) if placed else (*out, flag, value)


def recipe_value(kind: GpuKind, flag: str) -> str:
    """What the kind's own `args` give a flag (its recipe, before any release's rows): the value a flag axis
    leaves out of the environment's id."""
    return flag_value(kind.args, flag) or RECIPE_DEFAULT


def _groups(args: Sequence[str]) -> list[tuple[str, ...]]:
    """`args` as groups: a flag with the values that follow it up to the next flag (`--cuda-graph-bs 1 2 4`
    is one group of three values; `--flag=value` is a group of its own), a leading bare argument on its own."""
    groups: list[list[str]] = []
    for arg in args:
        if arg.startswith("--") or not groups or "=" in groups[-1][0] or not groups[-1][0].startswith("--"):
            groups.append([arg])
        else:
            groups[-1].append(arg)
    return [tuple(group) for group in groups]


def _flag_of(group: tuple[str, ...]) -> str | None:
    head = group[0]
    return head.partition("=")[0] if head.startswith("--") else None


def recipe_args(kind: GpuKind, version: str) -> tuple[str, ...]:
    """The kind's server arguments for one engine release: its `args`, then each `args_by_release` row whose
    range holds the release. A flag a row gives replaces the flag with all its values where it is given (a
    flag of several values, `--cuda-graph-bs 1 2 4`, is replaced whole), else is appended; a bare argument
    is appended unless the argv already holds it."""
    groups = _groups(kind.args)
    for rows in kind.args_by_release:
        if not value_matches(version, rows.versions):
            continue
        for group in _groups(rows.args):
            flag = _flag_of(group)
            if flag is None:
                if not any(group[0] in kept for kept in groups):
                    groups.append(group)
                continue
            where = [index for index, kept in enumerate(groups) if _flag_of(kept) == flag]
            if not where:
                groups.append(group)
                continue
            groups[where[0]] = group
            groups = [kept for index, kept in enumerate(groups) if index not in where[1:]]
    return tuple(arg for group in groups for arg in group)


def cell_bound(spec: Spec) -> tuple[int, int]:
    """At most how many cells expand() makes, computed from the axis sizes without expanding: the full
    product of the axes, and what includes add to it (excludes only remove)."""
    modes = spec.file.axes["mode"]
    product = math.prod(len(spec.file.axes[axis]) for axis in (*spec.axis_names, "mode"))
    included = sum(len(dict(rule.conditions).get("mode", modes)) for rule in spec.include)
    return product, included


def check_cell_limit(spec: Spec, max_cells: int = DEFAULT_MAX_CELLS) -> None:
    product, included = cell_bound(spec)
    if product + included <= max_cells:
        return
    sizes = " x ".join(f"{len(spec.file.axes[axis])} {axis}" for axis in (*spec.axis_names, "mode"))
    if included:
        sizes += f", + {included:,} included"
    raise InputError(
        f"the matrix expands to up to {product + included:,} cells ({sizes}), more than the limit of "
        f"{max_cells:,}: narrow the axes, or raise the limit with --max-cells N",
        Location(file=spec.path, line=spec.axes_line, key="axes"),
    )


def expand(spec: Spec, *, max_cells: int = DEFAULT_MAX_CELLS) -> list[Cell]:
    """All cells of the matrix; an InputError before any work when there would be more than max_cells."""
    check_cell_limit(spec, max_cells)
    names = spec.axis_names
    modes = spec.file.axes["mode"]
    candidates = [{**point, "mode": mode} for point in environment_points(spec) for mode in modes]
    used: set[int] = set()
    kept = []
    for values in candidates:
        hit = _first_match(spec.exclude, values)
        if hit is None:
            kept.append(values)
        else:
            used.add(hit)
    for index, rule in enumerate(spec.exclude):
        if index not in used:
            warn(f"{spec.path}:{rule.line}: exclude[{index}]: rule matches no cell")
    present = {tuple(values.items()) for values in kept}
    for rule in spec.include:
        given = dict(rule.conditions)
        point = {axis: given[axis][0] for axis in names if axis in given}
        if RESOLUTION in names:
            point.setdefault(RESOLUTION, TODAY)
        for axis in spec.file.flag_axes:
            version = point[spec.engine.version_axis]
            point.setdefault(axis, _flag_values(spec, axis, point["gpu"], version)[0])
            if point[axis] == RECIPE_DEFAULT:
                point[axis] = _default_is_listed(spec, axis, point["gpu"], version) or RECIPE_DEFAULT
        point = {axis: point[axis] for axis in names}
        for mode in given.get("mode", modes):
            values = {**point, "mode": mode}
            if tuple(values.items()) not in present:
                present.add(tuple(values.items()))
                kept.append(values)
    environments: dict[tuple[str, ...], Environment] = {}
    # Flags and argv depend only on (mode, engine version, GPU kind): a matrix has few of those and
    # many cells, so each is computed once.
    flags: dict[tuple[str, str], tuple[ModeFlags, tuple[str, ...]]] = {}
    cells = []
    for values in kept:
        key = tuple(values[n] for n in names)
        env = environments.get(key)
        if env is None:
            env = environments[key] = _environment(spec, {n: values[n] for n in names})
        mode = values["mode"]
        memo = (mode, env.env_id)
        cached = flags.get(memo)
        if cached is None:
            mode_flags = spec.engine.mode_flags_for(mode, env.version)
            command = server_command(spec, env, mode_flags.args) if mode_flags.applicable else ()
            cached = flags[memo] = (mode_flags, command)
        cells.append(_cell(spec, env, mode, *cached))
    return cells


def _first_match(rules: Iterable[Rule], values: dict[str, str]) -> int | None:
    for index, rule in enumerate(rules):
        if rule.matches(values):
            return index
    return None


def _environment(spec: Spec, axes: dict[str, str]) -> Environment:
    gpu = spec.file.gpu[axes["gpu"]]
    # Resolving as today and a flag at its recipe's value are what a matrix without those axes does: they leave
    # the id as it was, so adding an axis never renames the cells that were already there.
    same = {
        name
        for name, declared in spec.file.flag_axes.items()
        if not swept(spec, name, axes["gpu"]) or axes[name] == recipe_value(gpu, declared.flag)
    }
    if axes.get(RESOLUTION) == TODAY:
        same.add(RESOLUTION)
    identity = {
        "engine": spec.engine.name,
        "axes": {k: v for k, v in axes.items() if k not in same},
        "gpu": {"arch": gpu.arch, "count": gpu.count, "platform": gpu.platform},
        "python": spec.file.python,
    }
    return Environment(
        env_id=content_hash(identity),
        engine=spec.engine.name,
        axes=MappingProxyType(dict(axes)),
        gpu=gpu,
        python=spec.file.python,
    )


def server_command(
    spec: Spec,
    env: Environment,
    mode_args: tuple[str, ...],
    *,
    port: int | None = None,
    host: str = DEFAULT_HOST,
    model: str | None = None,
) -> tuple[str, ...]:
    """The exact server argv: launch + common args + GPU-kind args (with the engine's tensor-parallel args on a
    kind that asks for them) + mode args, in this version's spelling."""
    engine = spec.engine
    values = {
        "model": model if model is not None else spec.file.model.path,
        "host": host,
        "port": str(port if port is not None else engine.default_port),
    }
    launch = tuple(part.format_map(values) for part in engine.launch_argv(env.version))
    parallel = engine.tensor_parallel_args(env.version, gpus=env.ranks, port=int(values["port"]))
    kind_args = recipe_args(env.gpu, env.version)
    for name, declared in spec.file.flag_axes.items():
        value = env.axes.get(name)
        if value is not None and value != RECIPE_DEFAULT and swept(spec, name, env.axes["gpu"]):
            kind_args = with_flag(kind_args, declared.flag, value)
    args = (*spec.file.server.args, *kind_args, *parallel, *mode_args)
    return launch + engine.rename_flags(args, env.version)


def _cell(spec: Spec, env: Environment, mode: str, flags: ModeFlags, command: tuple[str, ...]) -> Cell:
    server_env = {**spec.engine.env, **spec.file.server.env, **env.gpu.env}
    identity = {
        "env_id": env.env_id,
        "mode": mode,
        "command": list(command),
        "env": server_env,
        "applicable": flags.applicable,
    }
    return Cell(
        id=content_hash(identity),
        env=env,
        mode=mode,
        applicable=flags.applicable,
        reason=flags.reason,
        command=command,
        server_env=MappingProxyType(server_env),
        swept_flags=MappingProxyType(
            {
                declared.flag: env.axes[name]
                for name, declared in spec.file.flag_axes.items()
                if swept(spec, name, env.axes["gpu"])
            }
        ),
    )


# ------------------------------------------------------------------------------ what an environment installs


def requirements(
    env: Environment, engine: Engine, packages: Sequence[str] = ()
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(requirements, overrides) from an environment's axes.

    The engine's own version is a requirement. An axis the release pins (torch, flashinfer for sglang)
    is left to the pin when `pinned`, and is otherwise a resolver override, since it may cross the
    release's exact pin. Axes the engine does not pin are plain requirements.
    """
    reqs: list[str] = []
    overrides: list[str] = []
    for axis in engine.axes:
        template = engine.requirements.for_axis(axis)
        value = env.axes[axis]
        if template is None or value == PINNED:
            continue
        line = template.format(version=value)
        (overrides if axis in engine.pinnable else reqs).append(line)
    # Package axes (the matrix's `packages`): a version overrides whatever the resolver would pick.
    overrides += [f"{axis}=={value}" for axis, value in env.axes.items() if axis in packages and value != LOCKED]
    return (*reqs, *engine.requirements.extra), tuple(overrides)


def axis_packages(env: Environment, engine: Engine, packages: Sequence[str] = ()) -> list[tuple[str, str]]:
    """(package, version) for each version axis with a known value: `pinned` is the release's known pin,
    and a package axis (the matrix's `packages`) at `locked` says nothing."""
    out = [(axis, value) for axis, value in env.axes.items() if axis in packages and value != LOCKED]
    for axis in engine.axes:
        template = engine.requirements.for_axis(axis)
        value = env.effective(axis, engine.pins)
        if template is None or value is None or value == PINNED:
            continue
        out.append((Requirement(template.format(version=value)).name, value))
    return sorted(out)
