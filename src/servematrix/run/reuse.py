"""Reusing published CPU pre-flight verdicts: a verdict decided on a CPU is a function of its inputs, so a
published row with the same inputs is that verdict, without installing or probing anything again.

The inputs of a cell's CPU pre-flight (resolve, flags, import, trace probe), hashed into `preflight_hash`:

- the cell (its id hashes the versions, the GPU kind with its platform, the Python, the mode and the argv)
  and which CPU stages ran (a run without the import check decides less);
- the resolution request and the bytes of the lock file it was resolved to (none for an unresolvable one);
- the bytes of the engine data file and of its failure signatures, and of the model's config files (`[model]
  config_dir`, which the load pre-flight reads);
- the checks' own code: the import check, the failure classifier, the harness-fault data, and every file of
  the engine's hooks module (sglang's flag reader, trace probe, probe script and probe data).

Every run stores the hash with its rows, and publishing carries it into `docs/results/latest.json`. A row
is reused only when it was decided on a CPU (nothing served, no figures, a host without the cell's GPUs),
by a verdict that is a fact about its inputs (`unresolvable`, `predicted-fail:*`, `skipped:no-gpu`, a
`fail:` of a pre-flight), and only on a host that lacks the cell's GPUs too: there the GPU stages decide.
An `error:` is never reused. `--fresh` reuses nothing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from servematrix.config.spec import model_config_dir
from servematrix.engines import Engine, _engine_folders
from servematrix.errors import InputError
from servematrix.formats.lockfile import read_lock_header
from servematrix.formats.verdict import Verdict
from servematrix.planning.cells import Cell, Environment
from servematrix.planning.plan import Plan
from servematrix.stages import CPU_STAGES
from servematrix.stages.locking import resolve_request
from servematrix.stages.resolve import inputs_hash as request_hash
from servematrix.store.store import Row

# Bumping it invalidates every published hash (what the hash covers changed).
SCHEMA = 1
PUBLISHED = Path("docs") / "results" / "latest.json"  # the published record, from the repository's root
REUSED_PREFIX = "reused: published "


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def files_digest(paths: Iterable[Path]) -> str:
    """One digest of some files' names and bytes (order-independent)."""
    entries = sorted((p.name, _digest(p.read_bytes())) for p in paths)
    return _digest(json.dumps(entries).encode())


def _packaged(*parts: str) -> Path | None:
    candidate = resources.files("servematrix").joinpath(*parts)
    if not candidate.is_file():
        return None
    with resources.as_file(candidate) as path:
        return Path(path)


def engine_data_path(engine: Engine) -> Path:
    """The engine data file `load_engine` reads for this engine (the first folder that has it)."""
    for folder in _engine_folders():
        candidate = folder.joinpath(f"{engine.name}.toml")
        if candidate.is_file():
            with resources.as_file(candidate) as path:
                return Path(path)
    raise InputError(f"engine {engine.name}: its data file is not found")


def check_sources(engine: Engine) -> tuple[Path, ...]:
    """The code and data the engine's CPU pre-flights run: a change to any byte of these is a new check."""
    from servematrix import classify
    from servematrix.classify import tracebacks
    from servematrix.stages import importcheck

    paths = [Path(importcheck.__file__), Path(tracebacks.__file__)]
    paths += sorted(Path(classify.__file__).parent.glob("*.py"))  # the classify package, every module
    paths += [p for p in (_packaged("data", "harness_faults.toml"),) if p is not None]
    if engine.hooks:
        # Where the hooks module lies, found without importing it (the store and reuse import no plugin).
        spec = importlib.util.find_spec(engine.hooks)
        origin = Path(spec.origin if spec is not None and spec.origin else "")
        if origin.name == "__init__.py":  # a package: every module and data file of it
            paths += sorted(p for p in origin.parent.iterdir() if p.is_file() and p.suffix in (".py", ".toml"))
        else:
            paths.append(origin)
    return tuple(paths)


def engine_digest(engine: Engine) -> dict[str, str]:
    signatures = _packaged("data", "signatures", f"{engine.name}.toml")
    return {
        "engine_data": _digest(engine_data_path(engine).read_bytes()),
        "signatures": _digest(signatures.read_bytes()) if signatures else "",
        "checks": files_digest(check_sources(engine)),
    }


def preflight_inputs(
    plan: Plan, cell: Cell, stages: Sequence[str], lock_dir: Path, engine: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """What a CPU pre-flight verdict of `cell` is a function of (see the module doc), as canonical data;
    `engine` is `engine_digest` of the plan's engine, when the caller has it already."""
    request = resolve_request(plan, cell.env_id)
    wanted = request_hash(request)
    lockfile = lock_dir / f"{cell.env_id}.lock.txt"
    header = read_lock_header(lockfile) if lockfile.is_file() else None
    # A lock whose header does not match the request is stale: resolve would make a new one.
    lock = _digest(lockfile.read_bytes()) if header is not None and header.inputs_hash == wanted else None
    env = cell.env
    return {
        "schema": SCHEMA,
        "cell": cell.id,
        "stages": [s for s in CPU_STAGES if s in stages],
        "request": wanted,
        "lock": lock,
        "platform": env.gpu.platform,
        "arch": env.gpu.arch,
        "python": env.python,
        "model_config": _model_config_digest(plan),
        **(engine if engine is not None else engine_digest(plan.spec.engine)),
    }


def _model_config_digest(plan: Plan) -> str | None:
    """The model's config files the load pre-flight reads (`[model] config_dir`, committed beside the matrix;
    never a built model's folder, which only some hosts have), by name and bytes."""
    folder = model_config_dir(plan.spec) if plan.spec.file.model.config_dir else None
    if folder is None or not folder.is_dir():
        return None
    return files_digest(p for p in folder.iterdir() if p.is_file() and p.suffix == ".json")


def preflight_hash(
    plan: Plan, cell: Cell, stages: Sequence[str], lock_dir: Path, engine: Mapping[str, str] | None = None
) -> str:
    blob = json.dumps(preflight_inputs(plan, cell, stages, lock_dir, engine), sort_keys=True, separators=(",", ":"))
    return _digest(blob.encode())


def _lacks_gpus(env: Environment, host: Mapping[str, Any] | None) -> bool:
    """Whether a host (a stored row's `host`) lacked the GPUs an environment needs."""
    kind = env.gpu
    if kind.arch == "cpu" or kind.count == 0:
        return False  # a CPU cell is served on a CPU: its verdict is observed, never predicted
    gpus = (host or {}).get("gpus") or []
    return sum(1 for g in gpus if g.get("arch") == kind.arch) < kind.count


def decided_on_a_cpu(row: Row | Mapping[str, Any], env: Environment) -> bool:
    """Whether a stored row is a CPU pre-flight's verdict: nothing served, no figures, no GPUs of its kind."""
    text = str(row.get("verdict") or "")
    kind = text.partition(":")[0]
    stages = row.get("stages") or {}
    if row.get("metrics") is not None or any(s in stages for s in ("build", "serve", "bench")):
        return False
    if not (kind in ("unresolvable", "predicted-fail", "fail") or text == "skipped:no-gpu"):
        return False
    return _lacks_gpus(env, row.get("host"))


def reused_note(row: Row | Mapping[str, Any]) -> str:
    """The evidence line a reused verdict carries: when and where it was decided (kept through reuses)."""
    earlier = next((e for e in row.get("evidence") or [] if str(e).startswith(REUSED_PREFIX)), None)
    if earlier is not None:
        return str(earlier)
    day = str(row.get("finished_at") or "")[:10] or "on an unknown day"
    return f"{REUSED_PREFIX}{day}, decided on a CPU (run {row.get('run_id')})"


def was_reused(row: Row | Mapping[str, Any]) -> bool:
    """Whether a stored row is a published verdict a run reused, not a run that decided its cell: for
    `--fresh`, no finished run."""
    evidence = row.get("evidence") or []
    return bool(evidence) and str(evidence[0]).startswith(REUSED_PREFIX)


def provenance(row: Mapping[str, Any]) -> dict[str, Any]:
    """What a reused row keeps of the published one: the lock it was decided from."""
    return {k: row.get(k) for k in ("lock_hash", "lock_file", "crossed_pins")}


@dataclass(frozen=True, kw_only=True)
class Reused:
    """A published row reused for a cell: its verdict, with a note saying so first in its evidence."""

    verdict: Verdict
    row: Mapping[str, Any]
    note: str


@dataclass(kw_only=True)
class Reuse:
    """The published record of a run, and which of the run's cells it decides (see the module doc)."""

    plan: Plan
    stages: Sequence[str]
    lock_dir: Path
    record: Path | None = PUBLISHED  # None: no record, nothing reused
    fresh: bool = False
    _rows: dict[str, Mapping[str, Any]] | None = field(default=None, repr=False)
    _engine: dict[str, str] | None = field(default=None, repr=False)

    def hash_for(self, cell: Cell) -> str:
        if self._engine is None:  # read once a run: the engine's files do not change under it
            self._engine = engine_digest(self.plan.spec.engine)
        return preflight_hash(self.plan, cell, self.stages, self.lock_dir, self._engine)

    def _published(self) -> dict[str, Mapping[str, Any]]:
        if self._rows is None:
            from servematrix.report.publish import read_record

            record = None if self.fresh or self.record is None else read_record(self.record)
            self._rows = dict((record or {}).get("cells") or {})
        return self._rows

    def lookup(self, cell: Cell, *, this_host_lacks_gpus: bool) -> Reused | None:
        """The published verdict of `cell` when its inputs are unchanged and it may be reused here."""
        if self.fresh or not cell.applicable or not this_host_lacks_gpus:
            return None
        row = self._published().get(cell.id)
        if row is None or not row.get("preflight_hash") or not decided_on_a_cpu(row, cell.env):
            return None
        if row["preflight_hash"] != self.hash_for(cell):
            return None
        note = reused_note(row)
        evidence = (note, *(e for e in row.get("evidence") or [] if not str(e).startswith(REUSED_PREFIX)))
        found = Verdict.parse(str(row["verdict"]), excerpt=str(row.get("excerpt") or ""))
        return Reused(
            verdict=Verdict(kind=found.kind, detail=found.detail, excerpt=found.excerpt, evidence=evidence),
            row=row,
            note=note,
        )

    def split(self, cells: Sequence[Cell], lacks_gpus: Callable[[Environment], bool]) -> tuple[list[Cell], list[Cell]]:
        """The applicable cells the record decides here, and those this run checks."""
        reused: list[Cell] = []
        to_check: list[Cell] = []
        for cell in (c for c in cells if c.applicable):
            (reused if self.lookup(cell, this_host_lacks_gpus=lacks_gpus(cell.env)) else to_check).append(cell)
        return reused, to_check

    def plan_line(self, reused: Sequence[Cell], to_check: Sequence[Cell]) -> str:
        """The up-front plan's count: how many cells the record decides, how many this run checks."""
        if self.fresh:
            return f"--fresh: nothing reused from {self.record}; {len(to_check)} cell(s) decided now"
        if not reused:
            return f"0 reused ({self.record} has no verdict with these inputs), {len(to_check)} to check"
        days = sorted({self.lookup_day(c) for c in reused})
        return (
            f"{len(reused)} reused (published {', '.join(days)}, decided on a CPU, same inputs; --fresh decides "
            f"them again), {len(to_check)} to check"
        )

    def lookup_day(self, cell: Cell) -> str:
        row = self._published().get(cell.id) or {}
        return reused_note(row).removeprefix(REUSED_PREFIX).split(",", 1)[0]
