"""Reusing published CPU pre-flight results, stage by stage: each stage's result is a function of the inputs
that stage reads, so a published row whose stage keys equal today's is that stage's result, without
installing or probing anything again; a stage whose key changed runs again alone, for the cells it touches.

Each stage has its own key (`stage_keys`), stored with its outcome (`preflight`, `preflight_hash`). Only a
row decided on a CPU by a verdict that is a fact of its inputs is replayed, on a host without the cell's GPUs;
an erred stage only for a reason of its inputs (`INPUT_FAULTS`). `--fresh` reuses nothing.

More, with the measurements behind it: docs/design-notes.md#srcservematrixrunreusepy
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, TypeGuard

from servematrix.classify.placeholder import placeholder_fault
from servematrix.config.spec import model_config_dir
from servematrix.engines import Engine, _engine_folders
from servematrix.engines.plugins import hooks_of
from servematrix.errors import InputError
from servematrix.formats.lockfile import read_lock_header
from servematrix.formats.verdict import Verdict
from servematrix.planning.plan import Plan
from servematrix.records.cell import Cell, Environment
from servematrix.run.stagecode import StageCode, stage_code
from servematrix.stages import importcheck, locking, naming, resolve, uvfailure
from servematrix.stages.locking import resolve_request
from servematrix.stages.resolve import inputs_hash as request_hash
from servematrix.store.store import Row

# Bumping it invalidates every stored stage key (what a key covers changed).
SCHEMA = 2
PUBLISHED = Path("docs") / "results" / "latest.json"  # the published record, from the repository's root
REUSED_PREFIX = "reused: published "
# What a stage's outcome may be: `resolved` and `passed` (with evidence, or none) let the next stage run,
# `verdict` ended the cell; `unavailable` and `error` are never replayed.
REPLAYED = ("resolved", "passed", "verdict")
# A stage that could not run is replayed only where the reason is a fact of its inputs, not of the host: the load
# probe ran in the lock's own environment and the stack refused to prepare (flashinfer-cubin 0.6.7.post2 beside
# flashinfer 0.6.12 refuses to import). Every other reason (no index, no interpreter, an install that failed) is
# the host's, and the stage runs again.
INPUT_FAULTS = ("the load probe could not prepare:",)
# An install that erred is replayed where the index serves a pin only as a placeholder (`classify/placeholder.py`).


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _key(data: Mapping[str, Any]) -> str:
    return _digest(json.dumps({"schema": SCHEMA, **data}, sort_keys=True, separators=(",", ":")).encode())[:24]


def files_digest(paths: Iterable[Path]) -> str:
    """One digest of some files' names and bytes (order-independent)."""
    entries = sorted((p.name, _digest(p.read_bytes())) for p in paths)
    return _digest(json.dumps(entries).encode())


def engine_data_path(engine: Engine) -> Path:
    """The engine data file `load_engine` reads for this engine (the first folder that has it)."""
    for folder in _engine_folders():
        candidate = folder.joinpath(f"{engine.name}.toml")
        if candidate.is_file():
            with resources.as_file(candidate) as path:
                return Path(path)
    raise InputError(f"engine {engine.name}: its data file is not found")


def stage_order(engine: Engine, stages: Sequence[str]) -> tuple[str, ...]:
    """The pre-flight stages a run of `stages` goes through on a host without the cell's GPUs, in order:
    resolve, the import check, then the engine's hook pre-flights in its data's order (first verdict wins)."""
    order = ["resolve"] if "resolve" in stages else []
    if "resolve" in stages and "import" in stages and "import" in engine.preflight:
        order.append("import")
    if "probe" in stages:
        hooks = hooks_of(engine).preflights
        order += [name for name in engine.preflight if name in hooks]
    return tuple(order)


@functools.cache
def _resolve_code() -> str:
    return files_digest(Path(m.__file__ or "") for m in (resolve, locking, uvfailure))


@functools.cache
def _import_code() -> str:
    return _digest(Path(importcheck.__file__ or "").read_bytes())


def hook_code(engine: Engine) -> dict[str, StageCode]:
    """What each hook pre-flight of the engine runs (`run/stagecode.py`), by name."""
    hooks = hooks_of(engine).preflights
    return {name: stage_code(engine, hooks[name]) for name in engine.preflight if name in hooks}


def _lock_body(lockfile: Path) -> bytes:
    stat = lockfile.stat()
    return _lock_body_of(lockfile, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=256)
def _lock_body_of(lockfile: Path, _mtime_ns: int, _size: int) -> bytes:
    """A lock's bytes without its comment lines, read once per (path, mtime, size): a run asks for each cell's
    keys several times, and a lock is shared by an environment's cells (a lock of 4,000 lines)."""
    return b"".join(line for line in lockfile.read_bytes().splitlines(keepends=True) if not line.startswith(b"#"))


def current_lock(plan: Plan, cell: Cell, lock_dir: Path) -> Path | None:
    """The cell's lock when it answers today's request (a stale one is resolved again), else None."""
    lockfile = lock_dir / f"{cell.env_id}.lock.txt"
    header = read_lock_header(lockfile) if lockfile.is_file() else None
    wanted = request_hash(resolve_request(plan, cell.env_id))
    return lockfile if header is not None and header.inputs_hash == wanted else None


def stage_keys(
    plan: Plan,
    cell: Cell,
    stages: Sequence[str],
    lock_dir: Path,
    code: Mapping[str, StageCode] | None = None,
) -> dict[str, str]:
    """Each pre-flight stage's key for `cell` (see the module doc), in the order the stages run."""
    engine = plan.spec.engine
    code = hook_code(engine) if code is None else code
    env = cell.env
    request = request_hash(resolve_request(plan, cell.env_id))
    lockfile = current_lock(plan, cell, lock_dir)
    lock = _digest(lockfile.read_bytes()) if lockfile is not None else None
    body = _digest(_lock_body(lockfile)) if lockfile is not None else None
    installed = "import" in stages and "resolve" in stages and "import" in engine.preflight
    keys: dict[str, str] = {}
    for stage in stage_order(engine, stages):
        if stage == "resolve":
            keys[stage] = _key(
                {"stage": stage, "request": request, "lock": lock, "code": None if lock else _resolve_code()}
            )
        elif stage == "import":
            check = engine.import_check.model_dump(exclude={"cost", "cost_gb", "cost_minutes"})
            keys[stage] = _key(
                {"stage": stage, "lock": body, "python": env.python, "check": check, "code": _import_code()}
            )
        else:
            hook = code[stage]
            data = engine.model_dump(include=set(hook.engine_fields), mode="json")
            keys[stage] = _key(
                {
                    "stage": stage,
                    "cell": cell.id,
                    "lock": body,
                    "code": hook.digest(),
                    "engine": data,
                    "model_config": _model_config_digest(plan) if hook.model_config else None,
                    "installed": installed if hook.environment else None,
                }
            )
    return keys


def keys_hash(keys: Mapping[str, str]) -> str:
    """One digest of a cell's stage keys (`preflight_hash`: the history's `checks`)."""
    return _digest(json.dumps(list(keys.items())).encode())


def preflight_hash(
    plan: Plan, cell: Cell, stages: Sequence[str], lock_dir: Path, code: Mapping[str, StageCode] | None = None
) -> str:
    return keys_hash(stage_keys(plan, cell, stages, lock_dir, code))


def _model_config_digest(plan: Plan) -> str | None:
    """The model's config files the load pre-flight reads (`[model] config_dir`, committed beside the matrix;
    never a built model's folder, which only some hosts have), by name and bytes."""
    folder = model_config_dir(plan.spec) if plan.spec.file.model.config_dir else None
    if folder is None or not folder.is_dir():
        return None
    return files_digest(p for p in folder.iterdir() if p.is_file() and p.suffix == ".json")


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
    decided = kind in ("unresolvable", "predicted-fail", "fail") or text in ("skipped:no-gpu", "skipped:not-applicable")
    if not (decided or (kind == "error" and _input_error(row) is not None)):
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


def outcome(key: str, result: Verdict | None, evidence: Sequence[str] = (), *, state: str = "") -> dict[str, Any]:
    """One stage's stored outcome: its key, what it found (`REPLAYED`, `unavailable`, `error`), the verdict it
    ended the cell with and the evidence it added."""
    found: dict[str, Any] = {"key": key}
    if state:
        found["outcome"] = state
    elif result is None or result.kind == "pass":
        found["outcome"] = "passed"
    else:
        found["outcome"] = "verdict"
        found["verdict"] = str(result)
    shown = [*(result.evidence if result is not None else ()), *evidence]
    if shown:
        found["evidence"] = list(dict.fromkeys(shown))
    return found


@dataclass(frozen=True, kw_only=True)
class Kept:
    """A stage's stored outcome whose key is today's: what the stage gives without running."""

    verdict: Verdict | None  # the verdict it ended the cell with; None: it let the next stage run
    evidence: tuple[str, ...]
    state: str = ""  # "unavailable": it could not run, for a reason of its inputs (INPUT_FAULTS)


@dataclass(frozen=True, kw_only=True)
class Replay:
    """A published row replayed against today's stage keys: the stages it answers, the first that runs again
    (None: the row decides the cell), and the verdict when it does."""

    row: Mapping[str, Any]
    kept: Mapping[str, Kept]
    changed: str | None  # the first stage that runs again
    verdict: Verdict | None = None
    note: str = ""


# Kept for the runner: a published row that decides its cell (every stage replayed).
Reused = Replay


def _input_error(row: Row | Mapping[str, Any]) -> str | None:
    """Why a row's stage erred for a fact of its inputs, not of the host (None: the host's, run it again): the
    lock pins a package the index serves only as a placeholder that fetches its wheel elsewhere."""
    found = placeholder_fault(str(row.get("excerpt") or ""))
    return found.note() if found is not None else None


def _replayable(stored: Any, row: Mapping[str, Any]) -> TypeGuard[Mapping[str, Any]]:
    if not isinstance(stored, Mapping):
        return False
    if stored.get("outcome") == "unavailable":
        return any(str(e).startswith(INPUT_FAULTS) for e in stored.get("evidence") or [])
    if stored.get("outcome") == "error":
        return _input_error(row) is not None
    return stored.get("outcome") in REPLAYED


def _kept(stored: Mapping[str, Any], row: Mapping[str, Any]) -> Kept:
    evidence = tuple(str(e) for e in stored.get("evidence") or [])
    if stored.get("outcome") == "unavailable":
        return Kept(verdict=None, evidence=evidence, state="unavailable")
    if stored.get("outcome") == "error":
        found = Verdict.parse(str(row.get("verdict") or ""), excerpt=str(row.get("excerpt") or ""))
        why = _input_error(row)
        noted = (*evidence, why) if why is not None and why not in evidence else evidence
        verdict = Verdict(kind=found.kind, detail=found.detail, excerpt=found.excerpt, evidence=noted)
        return Kept(verdict=verdict, evidence=noted)
    if stored.get("outcome") != "verdict":
        return Kept(verdict=None, evidence=evidence)
    named = naming.named_now({**row, "verdict": stored.get("verdict")})
    found = Verdict.parse(named, excerpt=str(row.get("excerpt") or ""))
    return Kept(
        verdict=Verdict(kind=found.kind, detail=found.detail, excerpt=found.excerpt, evidence=evidence),
        evidence=evidence,
    )


def replay(row: Mapping[str, Any], keys: Mapping[str, str], cell: Cell) -> Replay:
    """`row` against today's `keys` (see the module doc)."""
    stored = row.get("preflight") or {}
    kept: dict[str, Kept] = {}
    changed: str | None = None
    for stage, key in keys.items():
        found = stored.get(stage)
        if not _replayable(found, row) or found.get("key") != key:
            changed = changed or stage
            continue
        kept[stage] = _kept(found, row)
        if changed is None and kept[stage].verdict is not None:
            return _decided(row, kept, kept[stage].verdict)
    if changed is not None:
        return Replay(row=row, kept=kept, changed=changed)
    kind = cell.env.gpu
    passed = [e for stage, k in kept.items() if stage not in ("resolve", "import") and not k.state for e in k.evidence]
    notes = [*passed, *(kept["import"].evidence if "import" in kept else ())]
    skipped = Verdict(
        kind="skipped", detail="no-gpu", excerpt=f"needs {kind.count}x {kind.arch}", evidence=tuple(notes)
    )
    return _decided(row, kept, skipped)


def _decided(row: Mapping[str, Any], kept: Mapping[str, Kept], verdict: Verdict | None) -> Replay:
    assert verdict is not None
    note = reused_note(row)
    evidence = (note, *(e for e in verdict.evidence if not str(e).startswith(REUSED_PREFIX)))
    decided = Verdict(kind=verdict.kind, detail=verdict.detail, excerpt=verdict.excerpt, evidence=evidence)
    return Replay(row=row, kept=kept, changed=None, verdict=decided, note=note)


@dataclass(kw_only=True)
class Reuse:
    """The published record of a run, and which of the run's cells, or stages of them, it decides (see the
    module doc)."""

    plan: Plan
    stages: Sequence[str]
    lock_dir: Path
    record: Path | None = PUBLISHED  # None: no record, nothing reused
    fresh: bool = False
    _rows: dict[str, Mapping[str, Any]] | None = field(default=None, repr=False)
    _code: dict[str, StageCode] | None = field(default=None, repr=False)
    _keys: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)

    def keys_for(self, cell: Cell) -> dict[str, str]:
        if self._code is None:  # read once a run: the engine's files do not change under it
            self._code = hook_code(self.plan.spec.engine)
        # Asked several times a cell (plan, replay, record); a lock the run writes changes the resolve key, so
        # a key is kept only while the cell's lock is the one it was computed from.
        lockfile = self.lock_dir / f"{cell.env_id}.lock.txt"
        stamp = f"{cell.id}:{lockfile.stat().st_mtime_ns if lockfile.exists() else 0}"
        if stamp not in self._keys:
            self._keys[stamp] = stage_keys(self.plan, cell, self.stages, self.lock_dir, self._code)
        return dict(self._keys[stamp])

    def hash_for(self, cell: Cell) -> str:
        return keys_hash(self.keys_for(cell))

    def _published(self) -> dict[str, Mapping[str, Any]]:
        if self._rows is None:
            from servematrix.report.publish import read_record

            record = None if self.fresh or self.record is None else read_record(self.record)
            self._rows = dict((record or {}).get("cells") or {})
        return self._rows

    def replay(self, cell: Cell, *, this_host_lacks_gpus: bool) -> Replay | None:
        """The published row of `cell` replayed against today's keys, when it may be reused here at all."""
        if self.fresh or not cell.applicable or not this_host_lacks_gpus:
            return None
        row = self._published().get(cell.id)
        if row is None or not row.get("preflight") or not decided_on_a_cpu(row, cell.env):
            return None
        return replay(row, self.keys_for(cell), cell)

    def lookup(self, cell: Cell, *, this_host_lacks_gpus: bool) -> Replay | None:
        """The published verdict of `cell` when every stage that decides it is unchanged and it may be reused here."""
        found = self.replay(cell, this_host_lacks_gpus=this_host_lacks_gpus)
        return found if found is not None and found.verdict is not None else None

    def split(self, cells: Sequence[Cell], lacks_gpus: Callable[[Environment], bool]) -> tuple[list[Cell], list[Cell]]:
        """The applicable cells the record decides here, and those this run checks."""
        reused: list[Cell] = []
        to_check: list[Cell] = []
        for cell in (c for c in cells if c.applicable):
            (reused if self.lookup(cell, this_host_lacks_gpus=lacks_gpus(cell.env)) else to_check).append(cell)
        return reused, to_check

    def changed_line(self, cells: Sequence[Cell], lacks_gpus: Callable[[Environment], bool]) -> str | None:
        """Which stages run again, said up front: "load pre-flight changed: 47 cells re-run; 133 reused"."""
        changed: Counter[str] = Counter()
        reused = 0
        for cell in (c for c in cells if c.applicable):
            found = self.replay(cell, this_host_lacks_gpus=lacks_gpus(cell.env))
            if found is None:
                continue
            if found.changed is None:
                reused += 1
            else:
                changed[found.changed] += 1
        if not changed:
            return None
        parts = [f"{stage} pre-flight changed: {n} cell(s) re-run" for stage, n in changed.most_common()]
        return "; ".join([*parts, f"{reused} reused"]) + " (each re-run cell runs its changed stages alone)"

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
