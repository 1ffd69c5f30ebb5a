"""`servematrix run`: each environment, then each of its cells, through the stages in order.

    resolve (uv lock) → build (venv | image) → probe (CPU checks) → serve (launch, ready, early abort) → bench

Each stage is a small named function that may end the cell with a verdict. Environment-level stages
(resolve, build) run once and are shared by every mode. Every finished cell is written to the store at
once, so a crash loses nothing finished; a row is opened before a server starts, with its process
group, so the next run can reap a server orphaned by a killed harness.
"""

from __future__ import annotations

import copy
import functools
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from servematrix import hostinfo, ports, reuse, tomlsource, verdict
from servematrix.backends import Backend, Built, LaunchSpec
from servematrix.cells import Cell, Environment, content_hash, server_command
from servematrix.engines import Engine, Hooks, PreflightInput, PreflightUnavailable
from servematrix.errors import InputError, Location
from servematrix.locking import default_lock_dir, resolve_request
from servematrix.models import ModelBuildError, check_model_path, ensure_model
from servematrix.plan import Plan
from servematrix.progress import RunProgress, print_summary
from servematrix.reaper import reap_orphans
from servematrix.redact import (
    MissingSecretError,
    fill_secrets,
    masked_flags,
    placeholder_flags,
    redact_argv,
    spec_secret_flags,
)
from servematrix.stages import CPU_STAGES, STAGES, bench, build, importcheck, serve
from servematrix.stages.resolve import ResolveOutcome, resolve, resolve_cached
from servematrix.store import DEFAULT_STORE, Store
from servematrix.store import now as store_now
from servematrix.util import DEFAULT_WORKDIR
from servematrix.verdict import Verdict

CPU_SMOKE = "matrix/cpu-smoke.toml"
# The project's own servematrix directory: built models may live there even when --workdir is elsewhere.
PROJECT_DIR = DEFAULT_WORKDIR


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
    run_id: str = field(default_factory=lambda: time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6])


@dataclass
class Summary:
    run_id: str
    verdicts: dict[str, str] = field(default_factory=dict)  # cell id -> verdict
    skipped_unchanged: int = 0
    skipped_owned: dict[str, int] = field(default_factory=dict)  # cell id -> pid of the live run that owns it
    reaped: list[int] = field(default_factory=list)


def inputs_hash(plan: Plan, cell: Cell, stages: Sequence[str]) -> str:
    """What decides whether a finished result still stands: the cell, the workload, the model, the stages."""
    file = plan.spec.file
    return content_hash(
        {"cell": cell.id, "bench": file.bench.model_dump(), "model": file.model.model_dump(), "stages": list(stages)}
    )


def gpu_ready(env: Environment) -> bool:
    """Whether this host has the GPUs an environment's cells need (a CPU kind always runs)."""
    kind = env.gpu
    if kind.arch == "cpu" or kind.count == 0:
        return True
    return hostinfo.host().count(kind.arch) >= kind.count


def builds_here(plan: Plan, stages: Sequence[str]) -> list[str]:
    """The env_ids this run will build: applicable cells on GPUs this host has, when the build stage runs."""
    if "build" not in stages:
        return []
    return list(dict.fromkeys(c.env_id for c in plan.cells if c.applicable and gpu_ready(c.env)))


def preamble(plan: Plan, options: RunOptions) -> list[str]:
    """What the run will do, said before it starts: on a host without the matrix's GPUs most of the work is
    CPU pre-flight, and the trace probe downloads CUDA builds of torch."""
    host = hostinfo.host()
    envs = {c.env_id: c.env for c in plan.cells}
    gpus = ", ".join(sorted({f"{host.count(g.arch)}x {g.arch}" for g in host.gpus})) or "no NVIDIA GPU found"
    lines = [
        f"{plan.spec.path}: {len(plan.cells)} cell(s) in {len(envs)} environment(s); "
        f"stages {','.join(options.stages)}; this host: {gpus}"
    ]
    known = reuse_for(plan, options)
    lock_dir = options.lock_dir or default_lock_dir(plan)
    reused, to_check = known.split(plan.cells, lambda env: not gpu_ready(env))
    if options.published is not None:
        lines.append(known.plan_line(reused, to_check))
    lacking = [c for c in plan.cells if c.applicable and not gpu_ready(c.env)]
    if lacking:
        kinds = ", ".join(
            sorted({f"{c.env.axes.get('gpu', '?')} ({c.env.gpu.count}x {c.env.gpu.arch})" for c in lacking})
        )
        here = [s for s in options.stages if s in CPU_STAGES]
        lines.append(
            f"{len(lacking)} cell(s) need GPUs this host lacks: {kinds}. Here they run "
            f"{','.join(here) or 'no stage'} and end skipped:no-gpu, or with the CPU probe's verdict."
        )
        if len(lacking) == sum(c.applicable for c in plan.cells):
            lines.append(f"To run every stage on this machine's CPU instead: nox -s matrix -- {CPU_SMOKE}")
    engine = plan.spec.engine
    checked = {c.id for c in to_check}  # a reused cell runs nothing here
    imports = (
        {c.env_id for c in lacking if c.id in checked}
        if "import" in options.stages and "import" in engine.preflight
        else set()
    )
    if imports:
        cost = f"{engine.import_check.cost}; " if engine.import_check.cost else ""
        lines.append(
            f"The import check installs each of {importcheck.distinct_locks(imports, lock_dir)} distinct lock "
            f"bod(ies) of {len(imports)} environment(s) in turn on this CPU and imports "
            f"{', '.join(engine.import_check.modules)} ({cost}removed after, results cached). --stages "
            "resolve,probe skips it."
        )
    hooks = Hooks.of(engine)
    if "probe" in options.stages and hooks.preamble is not None:
        lines += hooks.preamble(to_check, engine, options.workdir / "cache")
    return lines


def reuse_for(plan: Plan, options: RunOptions) -> reuse.Reuse:
    lock_dir = options.lock_dir or default_lock_dir(plan)
    return reuse.Reuse(
        plan=plan, stages=options.stages, lock_dir=lock_dir, record=options.published, fresh=options.fresh
    )


def run_plan(plan: Plan, backend: Backend, options: RunOptions, console: Console | None = None) -> Summary:
    console = console or Console(stderr=True)
    summary = Summary(run_id=options.run_id)
    check_inputs(plan, options)
    store = Store(options.store)
    try:
        summary.reaped = reap_orphans(store)
        backend.reap_orphans()
        if summary.reaped:
            console.print(f"[yellow]killed {len(summary.reaped)} orphaned server process(es) of an earlier run[/]")
        runner = _Runner(plan=plan, backend=backend, options=options, store=store, console=console, summary=summary)
        runner.run()
    finally:
        store.close()
    return summary


def model_roots(options: RunOptions) -> tuple[Path, ...]:
    return (options.workdir, PROJECT_DIR, *options.model_roots)


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


@dataclass(frozen=True, kw_only=True)
class _Served:
    """One server start of a cell: its verdict, benchmark and stage times."""

    result: Verdict
    metrics: dict[str, Any] | None
    stage_seconds: dict[str, float]


@dataclass
class _Pending:
    cell: Cell
    prediction: Verdict | None
    starts: list[_Served]


@dataclass
class _EnvState:
    env: Environment
    resolved: ResolveOutcome | None = None
    built: Built | None = None
    ended: Verdict | None = None  # an environment-level verdict that ends every cell
    notes: tuple[str, ...] = ()  # environment-level evidence for every cell (e.g. the import check)
    pending: dict[str, _Pending] = field(default_factory=dict)  # served cells with more starts to come
    imported: bool = False  # the import check ran (its verdict, if any, is in `ended`)
    stage_seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class _Runner:
    plan: Plan
    backend: Backend
    options: RunOptions
    store: Store
    console: Console
    summary: Summary
    _ceiling: bench.Ceiling | None = None  # the benchmark client's, measured on this host once per run
    _ceiling_tried: bool = False

    @property
    def _starts(self) -> int:
        return self.plan.spec.file.bench.starts

    @functools.cached_property
    def _hooks(self) -> Hooks:
        return Hooks.of(self.plan.spec.engine)

    @functools.cached_property
    def _reuse(self) -> reuse.Reuse:
        return reuse_for(self.plan, self.options)

    @functools.cached_property
    def _cpu_split(self) -> bench.CpuSplit | None:
        wanted = self.plan.spec.file.bench.client_cpus
        return bench.split_cpus(wanted) if wanted else None

    def run(self) -> None:
        spec = self.plan.spec
        host = hostinfo.host()
        self.host = host.to_dict()
        self._started = store_now()
        self._secret_flags = spec_secret_flags(spec)
        todo: dict[str, list[Cell]] = {}
        for cell in self.plan.cells:
            if not self.options.rerun and self.store.finished(cell.id, self._inputs(cell)):
                self.summary.skipped_unchanged += 1
                continue
            todo.setdefault(cell.env_id, []).append(cell)
        total = sum(len(c) for c in todo.values())
        if self.summary.skipped_unchanged:
            self.console.print(
                f"{self.summary.skipped_unchanged} cell(s) unchanged since their last finished run: not run again "
                "(--rerun to force)"
            )
        self._check_imports_ahead(todo)
        self._progress = RunProgress(self.console, title=spec.path.name, total=total)
        with self._progress.shown():
            by_id = {c.id: c for c in self.plan.cells}
            for cells in todo.values():
                state = _EnvState(env=cells[0].env)
                for cell in cells:
                    self._claimed_cell(state, cell)
                    if cell.id in state.pending:
                        continue  # more server starts follow: counted when the cell is finished
                    self._progress.finished(cell, self.summary.verdicts.get(cell.id, "?"))
                for cell_id in self._more_starts(state):
                    self._progress.finished(by_id[cell_id], self.summary.verdicts.get(cell_id, "?"))
        if self.summary.skipped_owned:
            owners = sorted(set(self.summary.skipped_owned.values()))
            self.console.print(
                f"{len(self.summary.skipped_owned)} cell(s) skipped: another live run on this store (pid "
                f"{', '.join(map(str, owners))}) was running them"
            )
        print_summary(self.console, self.options.run_id, {c.id: c for c in self.plan.cells}, self.summary.verdicts)

    def _check_imports_ahead(self, todo: dict[str, list[Cell]]) -> None:
        """The import checks this run will need, each distinct current lock once and as many at once as the host
        has room for (importcheck.check_all); each environment then reads its result from the check's cache."""
        engine = self.plan.spec.engine
        if not (self._wants("import") and "import" in engine.preflight):
            return
        lock_dir = self.options.lock_dir or default_lock_dir(self.plan)
        by_python: dict[str, list[Path]] = {}
        for env_id, cells in todo.items():
            env = cells[0].env
            if gpu_ready(env) or all(
                not c.applicable or self._reuse.lookup(c, this_host_lacks_gpus=True) for c in cells
            ):
                continue
            current = resolve_cached(resolve_request(self.plan, env_id), out_dir=lock_dir)
            if current is not None and current.lockfile is not None:
                by_python.setdefault(env.python, []).append(current.lockfile)
        for python, locks in by_python.items():
            distinct = importcheck.distinct_locks([p.name.removesuffix(".lock.txt") for p in locks], lock_dir)
            jobs = min(distinct, importcheck.room(self.options.workdir / "cache"))
            if jobs > 1:
                self._stage_note(
                    f"import checks: {distinct} distinct lock(s) of {len(locks)} environment(s), {jobs} at once"
                )
                cache = self.options.workdir / "cache"
                importcheck.check_all(locks, engine, python_version=python, cache_dir=cache, jobs=jobs)

    def _claimed_cell(self, state: _EnvState, cell: Cell) -> None:
        """Run a cell under its lock (the claimed `running` row); a harness fault is `error:harness`."""
        claim = self.store.claim(
            **{**self._base_row(cell, state), **self._argv_fields(cell.command)},
            harness_pid=os.getpid(),
            hostname=hostinfo.host().hostname,
            rerun=self.options.rerun,
            since=self._started,
        )
        if claim.owner_pid is not None:
            self.summary.skipped_owned[cell.id] = claim.owner_pid
            self.console.print(f"{cell.id}: another run (pid {claim.owner_pid}) is running this cell: skipped")
            return
        if claim.unchanged:
            self.summary.skipped_unchanged += 1
            return
        try:
            self._run_cell(state, cell)
        except KeyboardInterrupt:
            self._end_claim(cell, "interrupted", "interrupted (SIGINT/SIGTERM)")
            raise
        except InputError:
            self._end_claim(cell, "interrupted", "the run stopped on bad input")
            raise
        except Exception as exc:  # the harness failed, not the stack: keep going, retry next run
            self._record(cell, state, verdict.error("harness", excerpt=f"{type(exc).__name__}: {exc}"))

    def _more_starts(self, state: _EnvState) -> list[str]:
        """The further server starts of the environment's served cells, interleaved across its modes
        (baseline, piecewise, baseline, piecewise, ...); a cell stops at its first start that does not pass.
        Returns the cells finished here."""
        for _ in range(1, self._starts):
            for pending in state.pending.values():
                if pending.starts[-1].result.kind == "pass":
                    self._serve_again(state, pending)
        for pending in state.pending.values():
            self._finish_served(state, pending.cell, pending.starts, pending.prediction)
        finished = list(state.pending)
        state.pending.clear()
        return finished

    def _end_claim(self, cell: Cell, result: str, excerpt: str) -> None:
        if cell.id not in self.summary.verdicts:
            self.store.finish(self.options.run_id, cell.id, verdict=result, excerpt=excerpt)
            self.summary.verdicts[cell.id] = result

    # -- helpers ---------------------------------------------------------------------------------
    def _inputs(self, cell: Cell) -> str:
        return inputs_hash(self.plan, cell, self.options.stages)

    def _stage(self, cell: Cell, name: str) -> None:
        self._progress.stage(cell, name)

    def _wants(self, stage: str) -> bool:
        return stage in self.options.stages

    def _base_row(self, cell: Cell, state: _EnvState) -> dict[str, Any]:
        return {
            "run_id": self.options.run_id,
            "cell_id": cell.id,
            "env_id": cell.env_id,
            "engine": cell.env.engine,
            "mode": cell.mode,
            "matrix": str(self.plan.spec.path),
            "axes": dict(cell.env.axes),
            "inputs_hash": self._inputs(cell),
            "host": self.host,
            "argv": list(cell.command),
            "lock_hash": state.built.lock_hash
            if state.built
            else (state.resolved.inputs_hash if state.resolved else None),
            "lock_file": str(state.resolved.lockfile) if state.resolved and state.resolved.lockfile else None,
            "crossed_pins": state.resolved.crossed if state.resolved else None,
            "image_digest": state.built.image_digest if state.built else None,
            "backend": self.backend.name,
            "preflight_hash": self._reuse.hash_for(cell),
        }

    def _argv_fields(self, argv: Sequence[str]) -> dict[str, Any]:
        """argv as stored: secret values masked, and which flags were (the reproduce block names them)."""
        return {
            "argv": redact_argv(argv, self._secret_flags),
            "redacted_flags": masked_flags(argv, self._secret_flags),
        }

    def _record(self, cell: Cell, state: _EnvState, result: Verdict, **extra: Any) -> None:
        self.store.record(
            **{**self._base_row(cell, state), **self._argv_fields(cell.command), **extra},
            verdict=str(result),
            excerpt=result.excerpt,
            evidence=list(result.evidence),
            stages=state.stage_seconds,
        )
        self.summary.verdicts[cell.id] = str(result)

    # -- environment stages ----------------------------------------------------------------------
    def _prepare_env(self, state: _EnvState, cell: Cell) -> Verdict | None:
        if state.ended is not None:
            return state.ended
        env, engine = state.env, self.plan.spec.engine
        if self._wants("resolve") and state.resolved is None:
            self._stage(cell, "resolve")
            started = time.monotonic()
            state.resolved = self._resolve(env)
            state.stage_seconds["resolve"] = round(time.monotonic() - started, 3)
            if state.resolved.status == "unresolvable":
                state.ended = Verdict(kind="unresolvable", excerpt=state.resolved.reason)
            elif state.resolved.status == "error":
                state.ended = verdict.error("resolve", state.resolved.reason)
            if state.ended:
                return state.ended
        if not gpu_ready(env):
            if self._wants("import") and "import" in engine.preflight and not state.imported:
                state.imported = True  # once per environment: its cells share the lock
                state.ended = self._import_check(state, cell)
            return state.ended  # GPU stages are skipped per cell below; nothing to build here
        if self._wants("build") and state.built is None:
            self._stage(cell, "build")
            resolved = state.resolved if state.resolved and state.resolved.status == "resolved" else None
            build_log = self.options.workdir / "logs" / self.options.run_id / f"{env.env_id}.build.log"
            state.built = build.build(
                self.backend,
                env,
                engine,
                lockfile=resolved.lockfile if resolved else None,
                lock_hash=resolved.inputs_hash if resolved and resolved.lockfile else None,
                log_path=build_log,
                packages=self.plan.spec.file.packages,
            )
            state.stage_seconds["build"] = round(state.built.seconds, 3)
            if not state.built.ok:
                state.ended = verdict.build_failed(state.built.excerpt, _tail(build_log))
                return state.ended
        return None

    def _import_check(self, state: _EnvState, cell: Cell) -> Verdict | None:
        """The environment's lock installed on this CPU and imported: a failure predicts every cell's."""
        resolved = state.resolved
        if resolved is None or resolved.status != "resolved" or resolved.lockfile is None:
            return None
        self._stage(cell, "import")
        checked = importcheck.import_check(
            resolved.lockfile,
            self.plan.spec.engine,
            python_version=state.env.python,
            cache_dir=self.options.workdir / "cache",
        )
        state.stage_seconds["import"] = round(checked.seconds, 3)
        note = f"import check{' (cached)' if checked.cached else ''}: {checked.outcome}"
        note += f" {checked.klass}" if checked.klass else ""
        note += f": {checked.evidence}" if checked.evidence else ""
        if checked.outcome == "fail":
            return Verdict(kind="predicted-fail", detail=checked.klass, excerpt=checked.excerpt, evidence=(note,))
        state.notes = (note,)
        return None

    def _resolve(self, env: Environment) -> ResolveOutcome:
        request = resolve_request(self.plan, env.env_id)
        return resolve(request, out_dir=self.options.lock_dir or default_lock_dir(self.plan))

    # -- cell stages -----------------------------------------------------------------------------
    def _run_cell(self, state: _EnvState, cell: Cell) -> None:
        if not cell.applicable:
            self._record(cell, state, verdict.skipped("not-applicable", excerpt=cell.reason))
            return
        reused = self._reuse.lookup(cell, this_host_lacks_gpus=not gpu_ready(state.env))
        if reused is not None:  # a published CPU verdict with the same inputs (reuse.py)
            self._stage(cell, reused.note)
            self._record(cell, state, reused.verdict, **reuse.provenance(reused.row))
            return
        ended = self._prepare_env(state, cell)
        if ended is not None:
            self._record(cell, state, ended)
            return
        prediction = self._probe(state, cell) if self._wants("probe") else None
        if prediction is not None and prediction.kind == "fail":
            self._record(cell, state, prediction)  # observed in the wheel: 0 GPU-seconds
            return
        if not gpu_ready(state.env) or (prediction is not None and self.options.trust_probe):
            kind = state.env.gpu
            skipped = Verdict(
                kind="skipped", detail="no-gpu", excerpt=f"needs {kind.count}x {kind.arch}", evidence=state.notes
            )
            self._record(cell, state, prediction or skipped)
            return
        if not (self._wants("serve") and state.built is not None):
            self._record(cell, state, verdict.skipped("stages", excerpt=f"stages run: {','.join(self.options.stages)}"))
            return
        self._serve_and_bench(state, cell, prediction)

    def _probe(self, state: _EnvState, cell: Cell) -> Verdict | None:
        """The engine's CPU pre-flights, in its data's order: the first verdict (a wrong flag is a failure,
        an untraceable FP4 path predicts one) ends the cell. One that cannot run here predicts nothing."""
        engine = self.plan.spec.engine
        preflight = PreflightInput(
            cell=cell,
            engine=engine,
            pins=state.resolved.pins if state.resolved else {},
            cache_dir=self.options.workdir / "cache",
        )
        started = time.monotonic()
        try:
            for name in engine.preflight:
                check = self._hooks.preflights.get(name)
                if check is None:
                    continue  # a generic pre-flight (the import check) runs as its own stage
                try:
                    result = check(preflight)
                except PreflightUnavailable as exc:
                    self.console.print(f"[yellow]{name} pre-flight of {cell.id} could not run: {exc}[/]")
                    continue
                if result is not None:
                    return result
        finally:
            state.stage_seconds["probe"] = round(time.monotonic() - started, 3)
        return None

    def _serve_and_bench(self, state: _EnvState, cell: Cell, prediction: Verdict | None = None) -> None:
        try:
            outcome = self._serve_once(state, cell)
        except ModelBuildError as exc:
            self._record(cell, state, verdict.error("model-build", excerpt=str(exc)))
            return
        if self._starts > 1 and outcome.result.kind == "pass":
            # More starts of this cell follow, interleaved with the environment's other modes (run()).
            state.pending[cell.id] = _Pending(cell=cell, prediction=prediction, starts=[outcome])
            return
        self._finish_served(state, cell, [outcome], prediction)

    def _serve_again(self, state: _EnvState, pending: _Pending) -> None:
        """One more server start of a cell that has passed every start so far."""
        try:
            pending.starts.append(self._serve_once(state, pending.cell))
        except ModelBuildError as exc:
            pending.starts.append(
                _Served(result=verdict.error("model-build", excerpt=str(exc)), metrics=None, stage_seconds={})
            )

    def _finish_served(
        self, state: _EnvState, cell: Cell, starts: Sequence[_Served], prediction: Verdict | None
    ) -> None:
        """The cell's verdict over all its server starts: the first that did not pass, else a pass; the
        benchmark figures pooled over the starts."""
        assert state.built is not None
        failed_start = next((i for i, s in enumerate(starts) if s.result.kind != "pass"), None)
        chosen = starts[failed_start if failed_start is not None else 0]
        result = chosen.result
        evidence = [*result.evidence, *state.built.notes]
        if len(starts) > 1 or self._starts > 1:
            where = f", failed at start {failed_start + 1}" if failed_start is not None else ""
            evidence.append(f"server starts: {len(starts)}, interleaved with the other modes{where}")
        if prediction is not None:
            # The GPU run checks the CPU prediction; the report tells predictions from observations.
            confirmed = result.kind == "fail" and result.detail == prediction.detail
            evidence.append(f"predicted {prediction.detail}: {'confirmed' if confirmed else 'contradicted'}")
        metrics = pooled_metrics([s.metrics for s in starts if s.metrics is not None])
        if metrics is not None and self._ceiling is not None:
            metrics["client_ceiling"] = self._ceiling.to_dict()
        self.store.finish(
            self.options.run_id,
            cell.id,
            verdict=str(result),
            excerpt=result.excerpt,
            evidence=evidence,
            metrics=metrics,
            stages=chosen.stage_seconds,
        )
        self.summary.verdicts[cell.id] = str(result)

    def _serve_once(self, state: _EnvState, cell: Cell) -> _Served:
        """Start the cell's server, wait for it, benchmark it, stop it. Raises ModelBuildError."""
        spec = self.plan.spec
        assert state.built is not None
        model_dir = self._model_dir(state)
        model = self.backend.model_location(model_dir) if model_dir else spec.file.model.path
        run_id = self.options.run_id
        start = len(state.pending[cell.id].starts) if cell.id in state.pending else 0
        log_path = self.options.workdir / "logs" / run_id / f"{cell.id}{f'.start{start + 1}' if start else ''}.log"
        try:
            port = ports.pick_port(spec.engine.port_offsets(cell.env.version), host="127.0.0.1")
        except ports.NoPortError as exc:
            return _Served(result=verdict.error("harness", excerpt=f"port: {exc}"), metrics=None, stage_seconds={})
        planned = build_argv(self.plan, cell, model=model, port=port, host=self.backend.bind_host)
        # `***` values of secret flags come from the environment (check_inputs made sure they are set).
        argv = fill_secrets(planned, self._secret_flags, os.environ)
        workdir = self.options.workdir.resolve()
        env_vars = {k: v.format(workdir=workdir) for k, v in cell.server_env.items()}
        for directory in spec.engine.prepare.directories:
            Path(directory.format(workdir=workdir)).mkdir(parents=True, exist_ok=True)
        launch = self.backend.launch(state.built, argv, env_vars, port, model_dir=model_dir)
        if self._cpu_split is not None and launch.owns_listener:
            # The server on its CPUs, the benchmark client on the others: they must not compete.
            launch = LaunchSpec(argv=tuple(self._cpu_split.pin_server(launch.argv)), env=launch.env, owns_listener=True)
        timeout = spec.file.server.ready_timeout_s or spec.engine.readiness.timeout_s
        # The claimed row gets what resolve and build have learnt since (lock, image) and the argv that runs.
        known = {k: v for k, v in self._base_row(cell, state).items() if k not in ("run_id", "cell_id")}
        self.store.update(
            run_id, cell.id, **{**known, **self._argv_fields(argv)}, log_path=str(log_path), harness_pid=os.getpid()
        )

        def started(pid: int, pgid: int) -> None:
            self.store.update(run_id, cell.id, server_pid=pid, server_pgid=pgid)

        stage_seconds = dict(state.stage_seconds)
        metrics: dict[str, Any] | None = None
        try:
            self._stage(cell, f"serve{f' (start {start + 1})' if self._starts > 1 else ''}")
            with serve.Server(
                launch,
                engine=spec.engine.name,
                port=port,
                log_path=log_path,
                readiness=spec.engine.readiness,
                timeout_s=timeout,
                on_started=started,
                secret_flags=self._secret_flags,
            ) as server:
                ready = server.wait_ready()
                stage_seconds["serve"] = round(ready.seconds, 3)
                if ready.after_ready_line_s is not None:
                    stage_seconds["ready_after_log_line"] = round(ready.after_ready_line_s, 3)
                if not ready.ok:
                    assert ready.verdict is not None
                    result = ready.verdict
                elif self._wants("bench"):
                    self._stage(cell, "bench")
                    started_bench = time.monotonic()
                    result, metrics = self._bench(server, model)
                    stage_seconds["bench"] = round(time.monotonic() - started_bench, 3)
                else:
                    result = verdict.passed()
                if result.kind == "pass":
                    result = mode_check(spec.engine, cell, log_path)
        except KeyboardInterrupt:
            self.store.finish(
                run_id, cell.id, verdict="interrupted", excerpt="interrupted (SIGINT/SIGTERM)", stages=stage_seconds
            )
            self.summary.verdicts[cell.id] = "interrupted"
            raise
        except Exception as exc:  # the harness failed, not the stack: keep going, retry next run
            result = verdict.error("harness", excerpt=f"{type(exc).__name__}: {exc}")
        finally:
            # Killing a `podman run` client only forwards SIGTERM: a hung server would keep its container
            # (and GPUs). Backends that own such resources remove them here.
            self.backend.stop(launch)
        # The harness picked the port: if another process took it first, that is the harness's fault.
        return _Served(
            result=verdict.served(result, harness_picked_port=True), metrics=metrics, stage_seconds=stage_seconds
        )

    def _bench(self, server: serve.Server, model: str) -> tuple[Verdict, dict[str, Any] | None]:
        file = self.plan.spec.file
        smoke = bench.smoke_check_sync(server.base_url, model, api=file.bench.api)
        doomed = server.check()
        if doomed is not None:
            return doomed, None
        if not smoke.ok:
            return verdict.failed("smoke", excerpt=smoke.reason), None
        workload = self._workload()
        if self._ceiling is None and not self._ceiling_tried:
            self._ceiling_tried = True
            self._stage_note("measuring the benchmark client's ceiling on this host (fake server)")
            try:
                self._ceiling = bench.measure_ceiling(
                    workload, server_cpus=self._cpu_split.server if self._cpu_split else ()
                )
            except (RuntimeError, OSError) as exc:
                self.console.print(f"[yellow]the client's ceiling could not be measured: {exc}[/]")
        report = bench.run_workload_sync(server.base_url, model, workload, ceiling=self._ceiling)
        metrics = report.to_dict()
        doomed = server.check()
        if doomed is not None:
            return doomed, metrics
        errors = report.error_count
        if errors:
            return verdict.failed("bench-errors", excerpt=f"{errors} request(s) failed"), metrics
        return verdict.passed(), metrics

    def _workload(self) -> bench.Workload:
        return bench.Workload.from_settings(
            self.plan.spec.file.bench.model_dump(),
            ignore_eos=self.plan.spec.engine.supports_ignore_eos,
            client_cpus=self._cpu_split.client if self._cpu_split else (),
        )

    def _stage_note(self, text: str) -> None:
        print(f"servematrix: {text}", file=self.console.file, flush=True)

    def _model_dir(self, state: _EnvState) -> Path | None:
        """A model servematrix builds (``model.build``), built once with the environment's interpreter."""
        model = self.plan.spec.file.model
        if not model.build:
            return None
        built = state.built
        assert built is not None
        return ensure_model(
            Path(model.path),
            builder=model.build,
            engine=self.plan.spec.engine,
            python=lambda visible: self.backend.python(built, visible=visible),
            roots=model_roots(self.options),
        )


def pooled_metrics(reports: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """One benchmark record from several server starts: each level's repeats pooled (each run keeps its
    start), its spread over all of them; the first start's other fields."""
    if not reports:
        return None
    if len(reports) == 1:
        return reports[0]
    pooled = copy.deepcopy(reports[0])
    pooled["starts"] = len(reports)
    for level in pooled.get("levels", []):
        runs = []
        for start, report in enumerate(reports, 1):
            same = next((lv for lv in report.get("levels", []) if lv["concurrency"] == level["concurrency"]), None)
            runs += [{**run, "start": start} for run in (same or {}).get("runs", [])]
        level["runs"] = runs
        level["output_tok_s"] = asdict(bench.Spread.of([r["output_tok_s"] for r in runs]))
        level["request_s"] = asdict(bench.Spread.of([r["request_s"] for r in runs]))
        level["error_count"] = sum(r.get("error_count", 0) for r in runs)
        level["completion_tokens"] = sum(r.get("completion_tokens", 0) for r in runs)
    pooled["error_count"] = sum(lv["error_count"] for lv in pooled.get("levels", []))
    pooled["completion_tokens"] = sum(lv["completion_tokens"] for lv in pooled.get("levels", []))
    pooled["client_bound"] = any(r.get("client_bound") for r in reports)
    return pooled


def mode_check(engine: Engine, cell: Cell, log_path: Path) -> Verdict:
    """A served cell passes only if its log proves the mode ran as asked (engine data: `mode_evidence`)."""
    rule = engine.evidence_for(cell.mode, cell.env.version)
    if rule is None:
        return verdict.passed()
    lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines() if log_path.is_file() else []
    evidence = ""
    for wanted in rule.applied:
        found = next((line for line in lines if wanted in line), None)
        if found is None:
            return verdict.failed(
                "mode-not-applied",
                excerpt=f"no {wanted!r} line in the server log: {engine.name} {cell.env.version} did not run "
                f"{cell.mode} as asked",
            )
        evidence = f"{cell.mode} applied: {found.strip()[:300]}"
    for unwanted in rule.absent:
        found = next((line for line in lines if unwanted in line), None)
        if found is not None:
            return verdict.failed(
                "mode-not-applied",
                excerpt=f"{cell.mode} cell, yet the server log says: {found.strip()[:300]}",
            )
        evidence = f"{cell.mode}: no {unwanted!r} line in the server log"
    return Verdict(kind="pass", evidence=(evidence,))


def _tail(path: Path, size: int = 65536) -> str:
    """The end of a log, for classifying a failure whose cause may precede the excerpt."""
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - size))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def build_argv(plan: Plan, cell: Cell, *, model: str, port: int, host: str) -> tuple[str, ...]:
    """The cell's planned argv, with the run's real model location, port and bind address."""
    flags = plan.spec.engine.mode_flags_for(cell.mode, cell.env.version)
    return server_command(plan.spec, cell.env, flags.args, port=port, model=model, host=host)
