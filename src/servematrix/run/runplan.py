"""What a run will do, decided before it starts: its options, which cells run again and which stages each
goes through, the work announced up front (`planned_work`, said by `progress.announce`), and the checks of
its inputs. `pipeline` runs it."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from servematrix.engines.plugins import hooks_of
from servematrix.errors import InputError, Location
from servematrix.formats import tomlsource
from servematrix.planning.cells import content_hash
from servematrix.planning.plan import Plan
from servematrix.records.cell import Cell, Environment
from servematrix.run import hostinfo, reuse
from servematrix.run.models import check_model_path
from servematrix.run.progress import HEARTBEAT_S, Step, Work, announce, free_disk_gb
from servematrix.stages import CPU_STAGES, STAGES, importcheck
from servematrix.stages.locking import default_lock_dir, resolve_request
from servematrix.stages.resolve import resolve_cached
from servematrix.store.redact import (
    MissingSecretError,
    fill_secrets,
    placeholder_flags,
    secret_variable,
    spec_secret_flags,
)
from servematrix.store.store import DEFAULT_STORE, Store
from servematrix.util import DEFAULT_WORKDIR

CPU_SMOKE = "matrix/cpu-smoke.toml"


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    stages: tuple[str, ...] = STAGES
    store: Path = DEFAULT_STORE
    workdir: Path = DEFAULT_WORKDIR
    lock_dir: Path | None = None  # default: locks/ beside the matrix file
    rerun: bool = False
    fresh: bool = False  # reuse no published verdict (reuse.py)
    published: Path | None = None  # the published record whose CPU verdicts may be reused (the CLI's: reuse.PUBLISHED)
    trust_probe: bool = False
    model_roots: tuple[Path, ...] = ()  # directories besides the workdir where models may be built
    jobs: int = 1  # environments pre-flighted at once, each in a process of its own (run/pool.py); 1: in turn
    run_id: str = field(default_factory=lambda: time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6])


@dataclass
class Summary:
    run_id: str
    verdicts: dict[str, str] = field(default_factory=dict)  # cell id -> verdict
    skipped_unchanged: int = 0
    reused: int = 0  # cells whose published CPU verdict was reused (reuse.py), not decided now
    skipped_owned: dict[str, int] = field(default_factory=dict)  # cell id -> pid of the live run that owns it
    reaped: list[int] = field(default_factory=list)


def inputs_hash(plan: Plan, cell: Cell, stages: Sequence[str]) -> str:
    """What decides whether a finished result still stands: the cell, the workload, the model, the stages."""
    file = plan.spec.file
    return content_hash(
        {"cell": cell.id, "bench": file.bench.model_dump(), "model": file.model.model_dump(), "stages": list(stages)}
    )


def gpu_ready(env: Environment) -> bool:
    """Whether this host has the GPUs an environment's cells need: the kind's arch, and its card where it names
    one (`sku`: an H100 does not serve an H200 kind's cells and label them H200). A CPU kind always runs."""
    kind = env.gpu
    if kind.arch == "cpu" or kind.count == 0:
        return True
    return hostinfo.host().count(kind.arch, kind.sku) >= kind.count


def builds_here(plan: Plan, stages: Sequence[str]) -> list[str]:
    """The env_ids this run will build: applicable cells on GPUs this host has, when the build stage runs."""
    if "build" not in stages:
        return []
    return list(dict.fromkeys(c.env_id for c in plan.cells if c.applicable and gpu_ready(c.env)))


def preamble(plan: Plan, options: RunOptions) -> list[str]:
    """What the run will do, said before it starts (progress.announce of planned_work), and where a secret it
    passes is exposed."""
    return [*announce(planned_work(plan, options)), *argv_secret_notes(plan)]


def argv_secret_notes(plan: Plan) -> list[str]:
    """A line per secret flag a server gets in its argv (`***` filled from SERVEMATRIX_SECRET_*): servematrix knows
    no variable or file an engine reads these from, so the value is in the server's process list, where another
    user of the host can read it (`ps`). It is never logged, stored nor published."""
    flags = spec_secret_flags(plan.spec)
    args = [*plan.spec.file.server.args, *(a for kind in plan.spec.file.gpu.values() for a in kind.args)]
    return [
        f"note: {flag}'s value (from {secret_variable(flag)}) is in the server's argv (servematrix knows no variable "
        f"or file {plan.spec.engine.name} reads it from): another user of this host can read it with `ps` while the "
        "server runs"
        for flag in placeholder_flags(args, flags)
    ]


def unchanged(store: Store, plan: Plan, cell: Cell, options: RunOptions) -> bool:
    """Whether a cell's finished result still stands, so the run does not run it again (for `--fresh`, a reused
    published verdict does not)."""
    done = None if options.rerun else store.finished(cell.id, inputs_hash(plan, cell, options.stages))
    return done is not None and not (options.fresh and reuse.was_reused(done))


def cell_stages(plan: Plan, cell: Cell, stages: Sequence[str]) -> tuple[str, ...]:
    """The stages a cell will really go through here: the CPU ones where the host lacks its GPUs (import only
    there), probe only for an engine with pre-flights of its own (or, on a host that serves the cell, the import
    check of the interpreter it is served with), serve only after a build, bench after serve. The one place this
    is decided: the run's announcement counts it (`planned_work`) and the runner follows it (`_Runner._wants`)."""
    if not cell.applicable:
        return ()
    engine = plan.spec.engine
    ready = gpu_ready(cell.env)
    wanted = [s for s in stages if (s in CPU_STAGES or ready)]
    drop = set()
    if ready or "import" not in engine.preflight or "resolve" not in stages:
        drop.add("import")
    if not any(name in hooks_of(engine).preflights for name in engine.preflight) and not (
        ready and "import" in engine.preflight  # the served interpreter's own import check (run/selfcheck.py)
    ):
        drop.add("probe")
    if "build" not in wanted:
        drop |= {"serve", "bench"}
    if "serve" not in wanted:
        drop.add("bench")
    return tuple(s for s in wanted if s not in drop)


def planned_work(plan: Plan, options: RunOptions) -> Work:
    """The work this run will do, as data: the cells it will run (not those unchanged since their last
    finished run), the stages they will go through, and the costly steps counted."""
    host = hostinfo.host()
    envs = {c.env_id: c.env for c in plan.cells}
    gpus = host.summary() or "no NVIDIA GPU found"
    skipped: set[str] = set()
    if options.store.is_file() and not options.rerun:  # read only: a run that never starts creates no store
        with Store(options.store) as store:
            skipped = {c.id for c in plan.cells if unchanged(store, plan, c, options)}
    known = reuse_for(plan, options)
    reused, to_check = known.split(plan.cells, lambda env: not gpu_ready(env))
    reused_ids = {c.id for c in reused}  # a published CPU verdict with the same inputs: nothing runs (reuse.py)
    to_run = [c for c in plan.cells if c.id not in skipped and c.id not in reused_ids]
    stages_of = {c.id: cell_stages(plan, c, options.stages) for c in to_run}
    lacking = [c for c in to_run if c.applicable and not gpu_ready(c.env)]
    lacking_lines: list[str] = []
    if lacking:
        kinds = ", ".join(
            sorted(
                {
                    f"{c.env.axes.get('gpu', '?')} ({c.env.gpu.count}x {c.env.gpu.arch}"
                    + (f" {c.env.gpu.sku})" if c.env.gpu.sku else ")")
                    for c in lacking
                }
            )
        )
        here = [s for s in STAGES if any(s in stages_of[c.id] for c in lacking)]
        lacking_lines.append(
            f"{len(lacking)} cell(s) need GPUs this host lacks: {kinds}. Here they run "
            f"{','.join(here) or 'no stage'} and end skipped:no-gpu, or with the CPU probe's verdict."
        )
        if len(lacking) == sum(c.applicable for c in to_run):
            lacking_lines.append(f"To run every stage on this machine's CPU instead: nox -s matrix -- {CPU_SMOKE}")
    engine = plan.spec.engine
    steps = []
    imports = {c.env_id for c in lacking if "import" in stages_of[c.id]}
    if imports:
        lock_dir = options.lock_dir or default_lock_dir(plan)
        cache = options.workdir / "cache"
        locks = {env_id: lock_dir / f"{env_id}.lock.txt" for env_id in imports}
        locked = {e for e, lock in locks.items() if lock.is_file()}
        todo = {e for e in locked if importcheck.recorded(locks[e], engine, cache_dir=cache) is None}
        check = engine.import_check
        distinct = importcheck.distinct_locks(todo, lock_dir)  # one check per distinct lock body
        steps.append(
            Step(
                stage="import",
                count=distinct,
                # Without a lock yet, resolving comes first, and an unresolvable environment needs no install.
                maybe=len(imports - locked),
                what=f"environment lock(s) installed on this CPU and {', '.join(check.modules)} imported",
                cost=check.cost,
                each_gb=check.cost_gb,
                each_minutes=check.cost_minutes,
                # As many at once as the run will check: the host's room (check_imports_ahead), or the
                # environments pre-flighted at once (--jobs, run/pool.py).
                at_once=max(1, min(distinct, options.jobs if options.jobs > 1 else importcheck.room(cache))),
                note="each venv is removed after its check; uv's cache keeps the wheels, and grows by what the "
                "locks do not share; --stages resolve,probe skips it",
            )
        )
    hooks = hooks_of(engine)
    notes: list[str] = []
    probed = [c for c in to_run if "probe" in stages_of[c.id]]
    if probed and hooks.preamble is not None:
        notes = hooks.preamble(probed, engine, options.workdir / "cache")
    unserved = {c.env_id for c in to_run if c.applicable and not (gpu_ready(c.env) and "build" in options.stages)}
    if options.jobs > 1 and "import" in options.stages and len(unserved) > 1:  # run/pool.py (envs_to_pool)
        notes = [
            *notes,
            f"pre-flight: up to {min(options.jobs, len(unserved))} of {len(unserved)} environment(s) at once, each in "
            f"a process of its own (--jobs {options.jobs}; --jobs 1: one at a time)",
        ]
    if options.published is not None:
        changed = known.changed_line(plan.cells, lambda env: not gpu_ready(env))
        notes = [*([changed] if changed else []), known.plan_line(reused, to_check), *notes]
    return Work(
        matrix=str(plan.spec.path),
        cells=len(plan.cells),
        environments=len(envs),
        host=gpus,
        to_run=len(to_run),
        not_run={
            "unchanged since their last finished run (--rerun runs them again)": len(skipped),
            "reused from the published results (--fresh decides them again)": len(reused_ids - skipped),
        },
        stages=tuple(s for s in STAGES if any(s in st for st in stages_of.values())),
        lacking=tuple(lacking_lines),
        steps=tuple(steps),
        notes=tuple(notes),
        free_disk_gb=free_disk_gb(options.workdir),
    )


def check_imports_ahead(
    plan: Plan, options: RunOptions, todo: Mapping[str, Sequence[Cell]], known: reuse.Reuse, say: Callable[[str], None]
) -> None:
    """The import checks a run will need, each distinct current lock once and as many at once as the host has
    room for (importcheck.check_all); each environment then reads its result from the check's cache. An
    environment whose published check is replayed (reuse.py) or whose cells are all reused needs none."""
    engine = plan.spec.engine
    if not ("import" in options.stages and "import" in engine.preflight):
        return
    lock_dir = options.lock_dir or default_lock_dir(plan)
    by_python: dict[str, list[Path]] = {}
    for env_id, cells in todo.items():
        env = cells[0].env
        replays = [known.replay(c, this_host_lacks_gpus=True) for c in cells if c.applicable]
        if gpu_ready(env) or all(r is not None and (r.verdict or "import" in r.kept) for r in replays):
            continue
        current = resolve_cached(resolve_request(plan, env_id), out_dir=lock_dir)
        if current is not None and current.lockfile is not None:
            by_python.setdefault(env.python, []).append(current.lockfile)
    cache = options.workdir / "cache"
    for python, locks in by_python.items():
        distinct = importcheck.distinct_locks([p.name.removesuffix(".lock.txt") for p in locks], lock_dir)
        jobs = min(distinct, importcheck.room(cache))
        if jobs > 1:
            say(f"import checks: {distinct} distinct lock(s) of {len(locks)} environment(s), {jobs} at once")
            with _import_heartbeat(say, cache / "import" / "results", distinct):
                importcheck.check_all(locks, engine, python_version=python, cache_dir=cache, jobs=jobs)


@contextlib.contextmanager
def _import_heartbeat(say: Callable[[str], None], results: Path, total: int) -> Iterator[None]:
    """A line every HEARTBEAT_S while the import checks run ahead of the cells (20-30 min on a fresh host):
    how many have finished, counted by the results they wrote, so a CI log never falls silent."""
    began = time.time()
    stop = threading.Event()

    def finished() -> int:
        try:
            return sum(1 for p in results.glob("*.json") if p.stat().st_mtime >= began)
        except OSError:
            return 0

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            say(f"import checks: {finished()} of {total} finished, {time.time() - began:.0f}s in")

    thread = threading.Thread(target=beat, name="servematrix-import-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        say(f"import checks: {finished()} of {total} finished in {time.time() - began:.0f}s")


def reuse_for(plan: Plan, options: RunOptions) -> reuse.Reuse:
    lock_dir = options.lock_dir or default_lock_dir(plan)
    return reuse.Reuse(
        plan=plan, stages=options.stages, lock_dir=lock_dir, record=options.published, fresh=options.fresh
    )


def model_roots(options: RunOptions) -> tuple[Path, ...]:
    """Where a built model may lie: the run's workdir, the default workdir of the directory the run started
    in (a matrix's relative `model.path`, such as `.servematrix/models/tiny-llama`, is read from there too,
    whatever --workdir says), and the model roots the user names."""
    return (options.workdir, Path.cwd() / DEFAULT_WORKDIR, *options.model_roots)


def check_inputs(plan: Plan, options: RunOptions) -> None:
    """What can only be checked against this run (its workdir, its environment), before anything runs."""
    model = plan.spec.file.model
    if model.build:
        check_model_path(plan.spec, model_roots(options))
    # The plan's argv is masked already; `***` placeholders are found where they are written.
    flags = spec_secret_flags(plan.spec)
    where: list[tuple[tuple[str | int, ...], list[str]]] = [(("server", "args"), plan.spec.file.server.args)]
    where += [(("gpu", name, "args"), kind.args) for name, kind in plan.spec.file.gpu.items()]
    for keypath, args in where:
        for flag in placeholder_flags(args, flags):
            try:
                fill_secrets((flag, "***"), flags, os.environ)
            except MissingSecretError as exc:
                index = next(i for i, a in enumerate(args) if a == flag or a.startswith(f"{flag}="))
                raise InputError(str(exc), _matrix_location(plan, (*keypath, index))) from None


def _matrix_location(plan: Plan, keypath: tuple[str | int, ...]) -> Location:
    try:
        return tomlsource.load(plan.spec.path).location(keypath)
    except InputError:
        return Location(file=plan.spec.path)
