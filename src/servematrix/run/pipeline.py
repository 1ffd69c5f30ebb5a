"""`servematrix run`: each environment, then each of its cells, through the stages in order.

    resolve (uv lock) → build (venv | image) → probe (CPU checks) → serve (launch, ready, early abort) → bench

Each stage is a small named function that may end the cell with a verdict. Environment-level stages
(resolve, build) run once and are shared by every mode. Every finished cell is written to the store at
once, so a crash loses nothing finished; a row is opened before a server starts, with its process
group, so the next run can reap a server orphaned by a killed harness.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from servematrix.backends import Backend, Built
from servematrix.config.spec import model_config_dir
from servematrix.engines.hooks import Hooks, Preflight, PreflightInput, PreflightUnavailable, hookspec, multicall
from servematrix.engines.plugins import hooks_of
from servematrix.errors import InputError
from servematrix.formats import verdict
from servematrix.formats.verdict import Verdict
from servematrix.planning.plan import Plan
from servematrix.records.cell import Cell, Environment
from servematrix.report.history import track
from servematrix.run import hostinfo, pool, ports, reuse, selfcheck
from servematrix.run.models import ModelBuildError, StackImportError
from servematrix.run.packing import Packed, jobs_to_pack, run_packed
from servematrix.run.progress import RunProgress, print_summary, skip_message, wrap_free
from servematrix.run.reaper import reap_orphans
from servematrix.run.runplan import (  # re-exported: what a run will do is decided there
    RunOptions,
    Summary,
    cell_stages,
    check_imports_ahead,
    check_inputs,
    gpu_ready,
    inputs_hash,
    reuse_for,
    unchanged,
)
from servematrix.run.serving import CellServer, Served
from servematrix.stages import build, importcheck
from servematrix.stages.locking import default_lock_dir, resolve_request
from servematrix.stages.resolve import ResolveOutcome, resolve
from servematrix.store.redact import masked_flags, redact_argv, spec_secret_flags
from servematrix.store.store import Store
from servematrix.store.store import now as store_now
from servematrix.util import log_tail


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


@dataclass
class _Pending:
    cell: Cell
    prediction: Verdict | None
    starts: list[Served]


@dataclass
class _EnvState:
    env: Environment
    resolved: ResolveOutcome | None = None
    built: Built | None = None
    ended: Verdict | None = None  # an environment-level verdict that ends every cell
    notes: tuple[str, ...] = ()  # environment-level evidence for every cell (e.g. the import check)
    pending: dict[str, _Pending] = field(default_factory=dict)  # served cells with more starts to come
    imported: bool = False  # the import check ran (its verdict, if any, is in `ended`)
    venv: importcheck.LockVenv | None = None  # the lock installed for the pre-flights that run the engine's code
    stage_seconds: dict[str, float] = field(default_factory=dict)
    # Each environment stage's outcome (resolve, import), stored with every cell's row (reuse.outcome).
    outcomes: dict[str, tuple[Verdict | None, tuple[str, ...], str]] = field(default_factory=dict)
    kept_import: reuse.Kept | None = None  # a published import check of the same key, replayed (reuse.py)


@dataclass
class _CellRun:
    """One cell on its way through the cell stages: what an earlier stage tells a later one."""

    state: _EnvState
    cell: Cell
    prediction: Verdict | None = None  # the CPU pre-flights' verdict, checked by serving the cell
    probed: tuple[str, ...] = ()  # what the pre-flights that passed found (evidence)
    extra: dict[str, Any] = field(default_factory=dict)  # fields its row takes besides the verdict's
    replay: reuse.Replay | None = None  # the published row's stages whose keys are today's (reuse.py)
    outcomes: dict[str, tuple[Verdict | None, tuple[str, ...], str]] = field(default_factory=dict)  # hooks'


@dataclass
class _Runner:
    plan: Plan
    backend: Backend
    options: RunOptions
    store: Store
    console: Console
    summary: Summary
    _unavailable_said: set[tuple[str, str]] = field(default_factory=set)  # (pre-flight, reason) said this run
    _stages: dict[str, tuple[str, ...]] = field(default_factory=dict)  # by cell id: `_wants`
    # A served cell's own CPU prediction and its stages' outcomes, stored with its row when it is decided.
    _predicted: dict[str, tuple[str, dict[str, Any] | None]] = field(default_factory=dict)
    host: dict[str, Any] = field(init=False)  # this host's facts, in every row
    _started: str = field(init=False)  # when the run began: a claim older than this is a dead run's
    _secret_flags: frozenset[str] = field(init=False)
    _progress: RunProgress = field(init=False)  # made by run(), once it knows how many cells it runs
    _server: CellServer = field(init=False)  # serves a cell once (serving.py)

    def __post_init__(self) -> None:
        self.host = hostinfo.host().to_dict()
        self._started = store_now()
        self._secret_flags = spec_secret_flags(self.plan.spec)
        self._server = CellServer(
            plan=self.plan,
            backend=self.backend,
            options=self.options,
            store=self.store,
            console=self.console,
            secret_flags=self._secret_flags,
            stage=self._stage,
            note=self._stage_note,
        )

    @functools.cached_property
    def _hooks(self) -> Hooks:
        return hooks_of(self.plan.spec.engine)

    @functools.cached_property
    def _reuse(self) -> reuse.Reuse:
        return reuse_for(self.plan, self.options)

    def run(self) -> None:
        spec = self.plan.spec
        todo: dict[str, list[Cell]] = {}
        for cell in self.plan.cells:
            if unchanged(self.store, self.plan, cell, self.options):
                self.summary.skipped_unchanged += 1
                continue
            todo.setdefault(cell.env_id, []).append(cell)
        total = sum(len(c) for c in todo.values())
        if self.summary.skipped_unchanged:
            wrap_free(self.console, skip_message(self.summary.skipped_unchanged))
        packed = jobs_to_pack(self.plan, todo)
        # Pre-flights side by side (pool.py): each job checks its own imports, as many at once as the pool runs.
        pooled = pool.envs_to_pool(self.plan, self.options, todo, self._reuse, but=packed)
        alone = {env_id: cells for env_id, cells in todo.items() if env_id not in pooled}
        check_imports_ahead(self.plan, self.options, alone, self._reuse, self._stage_note)
        self._progress = RunProgress(self.console, title=spec.path.name, total=total)
        with self._progress.shown():
            by_id = {c.id: c for c in self.plan.cells}
            for env_id, cells in alone.items():
                if env_id in packed:
                    continue  # run below, at the same time as the others on this host's GPUs
                state = _EnvState(env=cells[0].env)
                for cell in cells:
                    self._claimed_cell(state, cell)
                    if cell.id in state.pending:
                        continue  # more server starts follow: counted when the cell is finished
                    self._progress.finished(cell, self.summary.verdicts.get(cell.id, "?"))
                for cell_id in self._more_starts(state):
                    self._progress.finished(by_id[cell_id], self.summary.verdicts.get(cell_id, "?"))
                if state.venv is not None:
                    state.venv.close()
            if pooled:
                self._run_jobs(pooled, pool.run_pooled)
            packing = self._run_jobs(packed, run_packed) if packed else None
        if self.summary.skipped_owned:
            owners = sorted(set(self.summary.skipped_owned.values()))
            self.console.print(
                f"{len(self.summary.skipped_owned)} cell(s) skipped: another live run on this store (pid "
                f"{', '.join(map(str, owners))}) was running them"
            )
        print_summary(self.console, self.options.run_id, {c.id: c for c in self.plan.cells}, self.summary.verdicts)
        if packing is not None:
            wrap_free(self.console, packing.line())

    def _run_jobs(self, envs: Mapping[str, Sequence[Cell]], run: Callable[..., Packed]) -> Packed:
        """Environments in jobs of their own: packed onto this host's GPUs (packing.py), or pre-flights side by
        side (pool.py). A cell whose job died before deciding it is the harness's fault."""
        packed = run(
            self.plan, self.backend, self.options, envs, store=self.store, console=self.console, progress=self._progress
        )
        packed.add_to(self.summary)
        for env_id, why in packed.failed.items():
            for cell in envs[env_id]:
                if cell.id not in packed.verdicts:
                    self._record(cell, _EnvState(env=cell.env), verdict.error("harness", excerpt=why))
                    self._progress.finished(cell, self.summary.verdicts[cell.id])
        return packed

    def _claimed_cell(self, state: _EnvState, cell: Cell) -> None:
        """Run a cell under its lock (the claimed `running` row); a harness fault is `error:harness`."""
        claim = self.store.claim(
            **self._row(cell, state),
            harness_pid=os.getpid(),
            hostname=hostinfo.host().hostname,
            rerun=self.options.rerun,
            since=self._started,
            counts=(lambda row: not reuse.was_reused(row)) if self.options.fresh else None,
        )
        if claim.owner_pid is not None:
            self.summary.skipped_owned[cell.id] = claim.owner_pid
            self.console.print(f"{cell.id}: another run (pid {claim.owner_pid}) is running this cell: skipped")
            return
        if claim.unchanged:
            self.summary.skipped_unchanged += 1
            return
        self._guarded(
            cell, state, lambda: self._run_cell(state, cell), lambda result: self._record(cell, state, result)
        )

    def _guarded(
        self, cell: Cell, state: _EnvState, work: Callable[[], None], on_fault: Callable[[Verdict], None]
    ) -> None:
        """The one place where an exception becomes a verdict (as nox's SessionRunner.execute), for a cell or
        one server start of it: SIGINT and bad input stop the run, the cell's claim ended `interrupted`; any
        other exception is a verdict (`_verdict_of`) handed to `on_fault`, and the run goes on."""
        try:
            work()
        except KeyboardInterrupt:
            self._end_claim(cell, "interrupted", "interrupted (SIGINT/SIGTERM)")
            raise
        except InputError:
            self._end_claim(cell, "interrupted", "the run stopped on bad input")
            raise
        except Exception as exc:
            on_fault(self._verdict_of(exc, state))

    def _verdict_of(self, exc: Exception, state: _EnvState) -> Verdict:
        """What an exception says. A model the cell's environment could not build: the stack's failure when
        the stack itself did not import there (then every cell of the environment shares it), else the
        harness's. Anything else is the harness's (no free port, a crash of servematrix): retried next run."""
        if isinstance(exc, ModelBuildError):
            result = self._model_build_verdict(exc)
            if result.final:
                state.ended = result
            return result
        if isinstance(exc, ports.NoPortError):
            return verdict.error("harness", excerpt=f"port: {exc}")
        return verdict.error("harness", excerpt=f"{type(exc).__name__}: {exc}")

    def _more_starts(self, state: _EnvState) -> list[str]:
        """The further server starts of the environment's served cells, interleaved across its modes
        (baseline, piecewise, baseline, piecewise, ...); a cell stops at its first start that does not pass.
        Returns the cells finished here."""
        for _ in range(1, self._server.starts):
            for pending in state.pending.values():
                # A cell resumed from a stopped run has fewer starts to go.
                if len(pending.starts) < self._server.starts and pending.starts[-1].result.kind == "pass":
                    pending.starts.append(self._start(state, pending.cell))
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

    def _wants(self, cell: Cell, stage: str) -> bool:
        """Whether the cell goes through `stage` here, as `runplan.cell_stages` decided (and the run announced)."""
        if cell.id not in self._stages:
            self._stages[cell.id] = cell_stages(self.plan, cell, self.options.stages)
        return stage in self._stages[cell.id]

    def _row(self, cell: Cell, state: _EnvState, argv: Sequence[str] | None = None) -> dict[str, Any]:
        return cell_row(
            self.plan,
            cell,
            run_id=self.options.run_id,
            inputs=self._inputs(cell),
            host=self.host,
            backend=self.backend.name,
            secret_flags=self._secret_flags,
            resolved=state.resolved,
            built=state.built,
            argv=argv,
        ) | {"preflight_hash": self._reuse.hash_for(cell)}

    def _outcomes(self, cell: Cell, state: _EnvState, run: _CellRun | None = None) -> dict[str, Any]:
        """Each pre-flight stage's outcome with today's key (reuse.py), for the cell's row."""
        keys = self._reuse.keys_for(cell)
        found = {**state.outcomes, **(run.outcomes if run is not None else {})}
        return {
            stage: reuse.outcome(keys[stage], result, evidence, state=how)
            for stage, (result, evidence, how) in found.items()
            if stage in keys
        }

    def _record(self, cell: Cell, state: _EnvState, result: Verdict, **extra: Any) -> None:
        extra.setdefault("preflight", self._outcomes(cell, state) or None)
        self.store.record(
            **{**self._row(cell, state), **extra},
            verdict=str(result),
            excerpt=result.excerpt,
            evidence=list(result.evidence),
            stages=state.stage_seconds,
        )
        self.summary.verdicts[cell.id] = str(result)

    # -- environment stages: run once, shared by every cell of the environment ----------------------
    def _prepare_env(self, state: _EnvState, cell: Cell) -> Verdict | None:
        """The environment's stages in order (`ENV_STAGES`); the first verdict ends every cell of it."""
        if state.ended is None:
            for stage in self.ENV_STAGES:
                state.ended = stage(self, state, cell)
                if state.ended is not None:
                    break
        return state.ended

    def _resolve_env(self, state: _EnvState, cell: Cell) -> Verdict | None:
        if not self._wants(cell, "resolve") or state.resolved is not None:
            return None
        self._stage(cell, "resolve")
        started = time.monotonic()
        state.resolved = self._resolve(state.env)
        state.stage_seconds["resolve"] = round(time.monotonic() - started, 3)
        ended = verdict.resolve_ended(state.resolved.status, state.resolved.reason)
        how = "resolved" if ended is None else ("error" if ended.kind == "error" else "")
        state.outcomes["resolve"] = (ended, (), how)
        return ended

    def _import_env(self, state: _EnvState, cell: Cell) -> Verdict | None:
        """On a host without the environment's GPUs (nothing is built there), the import check, once."""
        if state.imported or not self._wants(cell, "import"):
            return None
        state.imported = True  # once per environment: its cells share the lock
        if state.kept_import is not None:  # the published check of this lock, check data and code (reuse.py)
            state.notes = state.kept_import.evidence
            state.outcomes["import"] = (None, state.notes, "")
            return None
        ended = self._import_check(state, cell)
        how = "error" if ended is not None and ended.kind == "error" else ""
        state.outcomes["import"] = (ended, () if ended is not None else state.notes, how)
        return ended

    def _build_env(self, state: _EnvState, cell: Cell) -> Verdict | None:
        if not self._wants(cell, "build") or state.built is not None:
            return None  # GPU stages: never on a host without the GPUs
        self._stage(cell, "build")
        env = state.env
        resolved = state.resolved if state.resolved and state.resolved.status == "resolved" else None
        build_log = self.options.workdir / "logs" / self.options.run_id / f"{env.env_id}.build.log"
        state.built = build.build(
            self.backend,
            env,
            self.plan.spec.engine,
            lockfile=resolved.lockfile if resolved else None,
            lock_hash=resolved.inputs_hash if resolved and resolved.lockfile else None,
            log_path=build_log,
            packages=self.plan.spec.file.packages,
        )
        state.stage_seconds["build"] = round(state.built.seconds, 3)
        if not state.built.ok and state.built.unavailable:  # not the stack's failure (an image backend's)
            return verdict.unavailable(state.built.unavailable, state.built.excerpt, state.built.notes)
        if not state.built.ok:
            return verdict.build_failed(state.built.excerpt, log_tail(build_log, 1000))
        return None

    ENV_STAGES = (_resolve_env, _import_env, _build_env)

    def _import_check(self, state: _EnvState, cell: Cell) -> Verdict | None:
        """The environment's lock installed on this CPU and imported: a failure predicts every cell's."""
        resolved = state.resolved
        if resolved is None or resolved.status != "resolved" or resolved.lockfile is None:
            return None
        self._stage(cell, "import")
        checked = pool.import_check(  # one process at a time per lock key (pool.py)
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
        if checked.outcome == "error":
            # The check could not run here (an install fault, no interpreter): says nothing about the stack,
            # and is retried next run rather than left as a final skipped:no-gpu.
            excerpt = "\n".join(filter(None, (checked.excerpt, checked.evidence)))  # the reason last
            return Verdict(kind="error", detail="import-check", excerpt=excerpt, evidence=(note,))
        state.notes = (note,)
        return None

    def _resolve(self, env: Environment) -> ResolveOutcome:
        request = resolve_request(self.plan, env.env_id)
        return resolve(request, out_dir=self.options.lock_dir or default_lock_dir(self.plan))

    # -- cell stages -----------------------------------------------------------------------------
    def _run_cell(self, state: _EnvState, cell: Cell) -> None:
        """A cell through its stages in order (`CELL_STAGES`): the first verdict ends the cell and is
        recorded. The last stage, serving, records its own (more server starts may follow)."""
        run = _CellRun(state=state, cell=cell)
        for stage in self.CELL_STAGES:
            ended = stage(self, run)
            if ended is not None:
                self._record(cell, state, ended, **{"preflight": self._outcomes(cell, state, run) or None, **run.extra})
                return

    def _applicable(self, run: _CellRun) -> Verdict | None:
        cell = run.cell
        return None if cell.applicable else verdict.skipped("not-applicable", excerpt=cell.reason)

    def _reused(self, run: _CellRun) -> Verdict | None:
        """A published CPU verdict with the same inputs (reuse.py) ends the cell as it was decided."""
        reused = self._reuse.replay(run.cell, this_host_lacks_gpus=not gpu_ready(run.state.env))
        if reused is None:
            return None
        if reused.verdict is None:  # some stages changed: they run again, the others give their stored outcome
            run.replay = reused
            if "import" in reused.kept and run.state.kept_import is None:
                run.state.kept_import = reused.kept["import"]
            return None
        self._stage(run.cell, reused.note)
        self.summary.reused += 1
        run.extra = reuse.provenance(reused.row) | {"preflight": reused.row.get("preflight")}
        return reused.verdict

    def _environment(self, run: _CellRun) -> Verdict | None:
        return self._prepare_env(run.state, run.cell)

    def _preflights(self, run: _CellRun) -> Verdict | None:
        if not self._wants(run.cell, "probe"):
            return None
        if self._served_here(run.state):
            # Issue 47: a GPU run first pre-flights itself on the interpreter and packages it serves with, so
            # its prediction and its observation share their inputs (the track record scores the pair).
            assert run.state.built is not None
            found = selfcheck.import_on_built(self.backend.python(run.state.built), self.plan.spec.engine)
            if found is not None:
                run.outcomes["import"] = found
            if found is not None and found[0] is not None:
                run.prediction = found[0]
                return None
        run.prediction, run.probed = self._probe(run.state, run.cell, run)
        if run.prediction is not None and run.prediction.kind == "fail":
            return run.prediction  # observed in the wheel: 0 GPU-seconds
        return None

    def _gpus_here(self, run: _CellRun) -> Verdict | None:
        """A host without the cell's GPUs (or a trusted prediction) ends the cell with what the CPU found."""
        state = run.state
        if gpu_ready(state.env) and not (run.prediction is not None and self.options.trust_probe):
            return None
        kind = state.env.gpu
        # What the pre-flights found and let pass comes first: it is why a cell was not ruled out here.
        skipped = Verdict(
            kind="skipped",
            detail="no-gpu",
            excerpt=f"needs {kind.count}x {kind.arch}",
            evidence=(*run.probed, *state.notes),
        )
        return run.prediction or skipped

    def _serving_asked(self, run: _CellRun) -> Verdict | None:
        if self._wants(run.cell, "serve") and run.state.built is not None:
            return None
        return verdict.skipped("stages", excerpt=f"stages run: {','.join(self.options.stages)}")

    def _serving(self, run: _CellRun) -> Verdict | None:
        if self._wants(run.cell, "probe") and run.outcomes:  # its own pre-flights' prediction (none ran: it has none)
            self._predicted[run.cell.id] = (
                str(run.prediction) if run.prediction is not None else "pass",
                self._outcomes(run.cell, run.state, run) or None,
            )
        self._serve_and_bench(run.state, run.cell, run.prediction)
        return None

    CELL_STAGES = (_applicable, _reused, _environment, _preflights, _gpus_here, _serving_asked, _serving)

    def _probe(
        self, state: _EnvState, cell: Cell, run: _CellRun | None = None
    ) -> tuple[Verdict | None, tuple[str, ...]]:
        """The engine's CPU pre-flights in its data's order; the first verdict ends the cell (the spec's
        firstresult, `multicall`). One that cannot run predicts nothing; a pass's evidence is returned too."""
        passed: list[str] = []
        engine = self.plan.spec.engine
        preflight = PreflightInput(
            cell=cell,
            engine=engine,
            pins=state.resolved.pins if state.resolved else {},
            cache_dir=self.options.workdir / "cache",
            python=self._interpreter(state, cell),
            model_config=model_config_dir(self.plan.spec),
        )
        started = time.monotonic()
        kept = run.replay.kept if run is not None and run.replay is not None else {}
        outcomes = run.outcomes if run is not None else {}

        def call(name: str, check: Preflight) -> Verdict | None:
            """One pre-flight: its verdict, or None to let the next one run (a pass's evidence is kept)."""
            result: Verdict | None
            if name in kept and kept[name].state:  # could not run, for a reason of its inputs: nor can it now
                outcomes[name] = (None, kept[name].evidence, kept[name].state)
                return None
            if name in kept:  # its key is today's: its published outcome, without running it (reuse.py)
                result = kept[name].verdict or Verdict(kind="pass", evidence=kept[name].evidence)
            else:
                try:
                    result = check(preflight)
                except PreflightUnavailable as exc:
                    self._say_unavailable(name, cell, str(exc))
                    outcomes[name] = (None, (str(exc),), "unavailable")
                    return None
            outcomes[name] = (result, (), "")
            passed.extend(result.evidence if result is not None and result.kind == "pass" else ())
            return None if result is None or result.kind == "pass" else result

        checks = [(name, self._hooks.preflights.get(name)) for name in engine.preflight]  # import: no hook, a stage
        try:
            verdicts = multicall(hookspec("PREFLIGHTS"), [functools.partial(call, n, c) for n, c in checks if c])
        finally:
            state.stage_seconds["probe"] = round(time.monotonic() - started, 3)
        return (verdicts[0] if verdicts else None), tuple(passed)

    def _served_here(self, state: _EnvState) -> bool:
        return gpu_ready(state.env) and state.built is not None and state.built.ok

    def _interpreter(self, state: _EnvState, cell: Cell) -> Callable[[], Path | None] | None:
        """Where the import check runs (a host without the environment's GPUs), the environment's lock
        installed for a pre-flight that runs the engine's own code, on its first call; on a host that serves
        the cell, the interpreter it is served with (not in a container); None elsewhere."""
        if self._served_here(state):
            assert state.built is not None
            python = selfcheck.host_python(self.backend.python(state.built))
            return (lambda: python) if python is not None else None
        resolved = state.resolved
        if (
            not self._wants(cell, "import")
            or resolved is None
            or resolved.status != "resolved"
            or resolved.lockfile is None
        ):
            return None
        if state.venv is None:
            state.venv = importcheck.LockVenv(
                resolved.lockfile, python_version=state.env.python, cache_dir=self.options.workdir / "cache"
            )
        return state.venv.python

    def _say_unavailable(self, name: str, cell: Cell, reason: str) -> None:
        """A pre-flight that cannot run, said once per reason (a host without an index: not once a cell)."""
        if (name, reason) in self._unavailable_said:
            return
        self._unavailable_said.add((name, reason))
        self.console.print(
            f"[yellow]{name} pre-flight could not run ({cell.id}, and later cells alike): {reason}[/]", soft_wrap=True
        )

    def _serve_and_bench(self, state: _EnvState, cell: Cell, prediction: Verdict | None = None) -> None:
        assert state.built is not None
        starts = self._server.resumed(cell, self._inputs(cell), installed=state.built.lock_hash)
        if starts:
            run_id, count = self._server.resumed_from[cell.id]
            self._stage_note(f"{cell.id}: {count} server start(s) resumed from the stopped run {run_id}")
        if len(starts) < self._server.starts:
            # `_serve_once` numbers the start from the pending ones.
            state.pending[cell.id] = _Pending(cell=cell, prediction=prediction, starts=starts)
            starts.append(self._start(state, cell))
            if len(starts) < self._server.starts and starts[-1].result.kind == "pass":
                return  # more starts of this cell follow, interleaved with the environment's other modes (run())
            del state.pending[cell.id]
        self._finish_served(state, cell, starts, prediction)

    def _start(self, state: _EnvState, cell: Cell) -> Served:
        """One server start of the cell; an exception is that start's verdict (`_guarded`)."""
        served: list[Served] = []

        def fault(result: Verdict) -> None:
            served.append(Served(result=result, metrics=None, stage_seconds=dict(state.stage_seconds)))

        self._guarded(cell, state, lambda: served.append(self._serve_once(state, cell)), fault)
        return served[0]

    def _model_build_verdict(self, exc: ModelBuildError) -> Verdict:
        """A model that could not be built in the cell's environment. When the environment's own stack did
        not import there, that is the stack's failure, classified as the import check classifies one (the
        server would die at the same import); anything else is the harness's, retried next run."""
        if isinstance(exc, StackImportError):
            outcome, klass, deciding = importcheck.import_failure(
                exc.output, self.plan.spec.engine, returncode=exc.returncode
            )
            if outcome == "fail":
                note = f"the stack did not import in this environment (while the model was built in it): {deciding}"
                return verdict.failed(klass, excerpt=exc.output[-3000:], evidence=(note,))
        return verdict.error("model-build", excerpt=str(exc))

    def _finish_served(
        self, state: _EnvState, cell: Cell, starts: Sequence[Served], prediction: Verdict | None
    ) -> None:
        """The cell's verdict over all its server starts: the first that did not pass, else a pass; the
        benchmark figures pooled over the starts."""
        assert state.built is not None
        failed_start = next((i for i, s in enumerate(starts) if s.result.kind != "pass"), None)
        chosen = starts[failed_start if failed_start is not None else 0]
        result = chosen.result
        evidence = [*result.evidence, *state.built.notes]
        if len(starts) > 1 or self._server.starts > 1:
            where = f", failed at start {failed_start + 1}" if failed_start is not None else ""
            evidence.append(f"server starts: {len(starts)}, interleaved with the other modes{where}")
        if cell.id in self._server.resumed_from:
            run_id, count = self._server.resumed_from[cell.id]
            evidence.append(f"{count} server start(s) resumed from run {run_id}, stopped before it decided the cell")
        predicted, outcomes = self._predicted.pop(cell.id, (None, None))
        if predicted is not None:
            # The GPU run checks its own CPU prediction (track record: report/history/track.py).
            evidence.append(f"predicted {predicted} on this interpreter: {track.score(predicted, str(result))}")
        metrics = self._server.pooled_metrics(list(starts))
        self.store.finish(
            self.options.run_id,
            cell.id,
            prediction=predicted,
            preflight=outcomes,
            verdict=str(result),
            excerpt=result.excerpt,
            evidence=evidence,
            metrics=metrics,
            stages=chosen.stage_seconds,
        )
        self.summary.verdicts[cell.id] = str(result)

    def _serve_once(self, state: _EnvState, cell: Cell) -> Served:
        """Start the cell's server, wait for it, benchmark it, stop it. A fault raises (see `_start`)."""
        assert state.built is not None
        start = len(state.pending[cell.id].starts) if cell.id in state.pending else 0
        row = functools.partial(self._row, cell, state)  # given the argv that runs
        return self._server.serve_once(cell, state.built, start=start, stage_seconds=state.stage_seconds, row=row)

    def _stage_note(self, text: str) -> None:
        print(f"servematrix: {text}", file=self.console.file, flush=True)


def cell_row(
    plan: Plan,
    cell: Cell,
    *,
    run_id: str,
    inputs: str,
    host: dict[str, Any],
    backend: str | None,
    secret_flags: frozenset[str],
    resolved: ResolveOutcome | None = None,
    built: Built | None = None,
    argv: Sequence[str] | None = None,
) -> dict[str, Any]:
    """A cell run's store row, as far as the run knows it: the one builder of rows (the runner's, and the
    bisection's own probe rows). `argv` is what ran (default: the planned command), stored with secret values
    masked and the masked flags named (the reproduce block names them)."""
    shown = cell.command if argv is None else argv
    return {
        "run_id": run_id,
        "cell_id": cell.id,
        "env_id": cell.env_id,
        "engine": cell.env.engine,
        "mode": cell.mode,
        "matrix": str(plan.spec.path),
        "axes": dict(cell.env.axes),
        "inputs_hash": inputs,
        "host": host,
        "argv": redact_argv(shown, secret_flags),
        "redacted_flags": masked_flags(shown, secret_flags),
        "lock_hash": built.lock_hash if built else (resolved.inputs_hash if resolved else None),
        "lock_file": str(resolved.lockfile) if resolved and resolved.lockfile else None,
        "crossed_pins": resolved.crossed if resolved else None,
        "image_digest": built.image_digest if built else None,
        "backend": backend,
    }
