"""One check of a bisection: one release, one stage, run through the pipeline as a one-environment plan.

The bisected environment is the matrix's, with the bisected axis set to the release: a Spec whose axes hold
one value each (the modes the selection kept), planned and run like any matrix. Each check is therefore a
cell run in the store, and a check whose cells already have a final verdict for these inputs (a killed
bisection, the matrix's own run) is read back instead of run. The import check is cached by lock body too.

Stages, cheapest first, each with the pipeline stages it runs:

    probe   resolve, probe   the flag surface and the FP4 trace probe (or one trace entry, --probe-entry)
    import  resolve, import  the lock installed on this CPU and the engine's entry points imported
    serve   every stage      on a host with the environment's GPUs
"""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from rich.console import Console

from servematrix.backends import Backend
from servematrix.config.spec import PACKAGE_NAME, Spec
from servematrix.engines.hooks import GENERIC_PREFLIGHTS, PreflightInput
from servematrix.engines.plugins import hooks_of
from servematrix.errors import InputError
from servematrix.formats import verdict
from servematrix.planning.cells import content_hash
from servematrix.planning.plan import Plan, plan_spec
from servematrix.records.cell import Cell, Environment
from servematrix.report.markdown import last_line
from servematrix.report.regressions import scrub_host_paths
from servematrix.run import hostinfo
from servematrix.run.pipeline import cell_row, run_plan
from servematrix.run.runplan import RunOptions, gpu_ready, inputs_hash
from servematrix.stages import STAGES, importcheck
from servematrix.stages.locking import resolve_request
from servematrix.stages.resolve import resolve
from servematrix.store.redact import spec_secret_flags
from servematrix.store.store import Row, Store

# The stages a bisection can decide at, cheapest first, and the pipeline stages each one runs.
PIPELINE_STAGES: Mapping[str, tuple[str, ...]] = {
    "probe": ("resolve", "probe"),
    "import": ("resolve", "import"),
    "serve": STAGES,
}
# Verdicts that say nothing about the release: it is skipped, and a neighbour is tried.
UNDECIDED_KINDS = ("unresolvable", "error", "interrupted")
NO_IMPORT_RESULT = "import check: no result for the lock"


@dataclass(frozen=True, kw_only=True)
class Target:
    """The one environment a bisection varies: the matrix's, with `axis` set to each release in turn."""

    spec: Spec
    axis: str  # the axis of the derived matrices (a matrix axis, or a package axis added for the bisection)
    package: str  # the package whose releases are searched, as the index names it
    added: bool  # the axis is not the matrix's: it is added as a package axis
    env: Environment  # the selected environment (its value on `axis` is the matrix's)
    modes: tuple[str, ...]

    @property
    def described(self) -> str:
        axes = " ".join(f"{k}={'*' if k == self.axis else v}" for k, v in self.env.axes.items())
        extra = f" {self.axis}=*" if self.added else ""
        return f"{axes}{extra} mode={','.join(self.modes)}"


def find_target(spec: Spec, select: Sequence[str], name: str) -> Target:
    """The environment `--select` narrows the matrix to (apart from the bisected axis), and what to vary."""
    axis, package, added = _axis(spec, name)
    plan = plan_spec(spec, select)
    others: dict[tuple[tuple[str, str], ...], Environment] = {}
    for cell in plan.cells:
        others.setdefault(tuple((k, v) for k, v in cell.env.axes.items() if k != axis), cell.env)
    if len(others) != 1:
        shown = "; ".join(" ".join(f"{k}={v}" for k, v in key) for key in list(others)[:3])
        more = f"; and {len(others) - 3} more" if len(others) > 3 else ""
        raise InputError(
            f"bisect needs one environment, and the selection leaves {len(others)} (apart from {axis}): "
            f"{shown}{more}. Narrow it with --select (e.g. --select env=ID)"
        )
    modes = tuple(m for m in spec.file.axes["mode"] if any(c.mode == m for c in plan.cells))
    return Target(spec=spec, axis=axis, package=package, added=added, env=next(iter(others.values())), modes=modes)


def _axis(spec: Spec, name: str) -> tuple[str, str, bool]:
    """(axis, package, added) for `--axis NAME`: a matrix axis, the package an engine axis installs, or any
    other package (added to the derived matrices as a package axis)."""
    engine = spec.engine
    if name in ("gpu", "mode"):
        raise InputError(f"--axis {name}: bisect searches a package's releases; {name} is not a package")
    if name in spec.file.packages:
        return name, name, False
    installs = {axis: engine.axis_package(axis) for axis in engine.axes if engine.requirements.for_axis(axis)}
    if name in engine.axes:
        if name not in installs:
            raise InputError(f"--axis {name}: the {name} axis names a {name} kind, not a package version")
        return name, installs[name], False
    package = canonicalize_name(name)
    for axis, installed in installs.items():
        if installed == package:
            return axis, package, False
    if not PACKAGE_NAME.match(package):
        raise InputError(f"--axis {name!r}: neither an axis of {spec.path} nor a package name")
    return package, package, True


def derived_plan(target: Target, version: str) -> Plan:
    """The plan of the target environment with its axis at `version`: one environment, the selected modes."""
    spec = target.spec
    axes = {axis: [value] for axis, value in target.env.axes.items()}
    axes[target.axis] = [version]
    axes["mode"] = list(target.modes)
    packages = [*spec.file.packages, target.axis] if target.added else list(spec.file.packages)
    file = spec.file.model_copy(update={"axes": axes, "packages": packages, "include": [], "exclude": []})
    return plan_spec(spec.model_copy(update={"file": file, "include": (), "exclude": ()}))


@dataclass(frozen=True, kw_only=True)
class CellResult:
    mode: str
    cell_id: str
    verdict: str
    excerpt: str = ""
    evidence: tuple[str, ...] = ()
    run_id: str = ""
    lock_file: str | None = None


@dataclass(frozen=True, kw_only=True)
class Check:
    """One release at one stage: the verdict of each selected cell."""

    version: str
    stage: str
    cells: tuple[CellResult, ...]
    reused: bool  # read from the store (or the import check's cache), not run now
    seconds: float
    # Why an import check that left its cells `skipped:no-gpu` decided nothing (it needs a GPU to load a
    # library, or has no result for the lock), from the import check's own record; None when it decided.
    import_undecided: str | None = None

    @property
    def verdict(self) -> str:
        """What two checks are compared by: each mode's verdict."""
        return ", ".join(f"{c.mode} {c.verdict}" for c in self.cells)

    @property
    def undecided(self) -> str | None:
        """Why this check says nothing about the release (unresolvable, a fault), or None."""
        for cell in self.cells:
            if cell.verdict.startswith(UNDECIDED_KINDS):
                return f"{cell.verdict}: {last_line(cell.excerpt)}".rstrip(": ")
        return self.import_undecided

    @property
    def evidence(self) -> str:
        """The deciding line: a failing cell's last excerpt line, else what the stage noted."""
        cell = next((c for c in self.cells if c.verdict.startswith(("fail", "predicted-fail"))), self.cells[0])
        line = last_line(cell.excerpt) if cell.verdict.startswith(("fail", "predicted-fail", *UNDECIDED_KINDS)) else ""
        line = line or (cell.evidence[0] if cell.evidence else last_line(cell.excerpt))
        return f"{cell.verdict}: {scrub_host_paths(line)}" if line else cell.verdict

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "stage": self.stage,
            "verdicts": {c.mode: c.verdict for c in self.cells},
            "evidence": self.evidence,
            "reused": self.reused,
            "seconds": round(self.seconds, 1),
        }


@dataclass(frozen=True, kw_only=True)
class CheckOptions:
    store: Path
    workdir: Path
    lock_dir: Path
    probe_entry: str | None = None  # the engine's probe of this entry alone decides the probe stage
    run_id: str = field(default_factory=lambda: time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6])


class Checker:
    """Runs checks of one target through the pipeline (or the trace probe of one entry), one at a time."""

    def __init__(
        self,
        target: Target,
        options: CheckOptions,
        backend: Callable[[Plan, tuple[str, ...]], Backend],
        say: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.target = target
        self.options = options
        self.backend = backend
        self.say = say
        self._runs = 0
        self._hooks = hooks_of(target.spec.engine)

    def stages_here(self) -> tuple[str, ...]:
        """The stages this host can decide at, cheapest first."""
        engine = self.target.spec.engine
        stages = []
        if self.options.probe_entry or set(engine.preflight) - set(GENERIC_PREFLIGHTS):  # the engine's hooks
            stages.append("probe")
        if not gpu_ready(self.target.env):
            if "import" in engine.preflight:
                stages.append("import")
        else:
            stages.append("serve")
        return tuple(stages)

    def check(self, version: str, stage: str) -> Check:
        plan = derived_plan(self.target, version)
        if stage == "probe" and self.options.probe_entry:
            return self._entry_probe(plan, version)
        stages = PIPELINE_STAGES[stage]
        cells = list(plan.cells)
        with Store(self.options.store) as store:
            stored = [store.finished(c.id, inputs_hash(plan, c, stages)) for c in cells]
        rerun = False
        if all(row is not None for row in stored):
            results = tuple(_result(r) for r in stored if r)
            undecided = self._import_undecided(stage, results)
            # A stored `skipped:no-gpu` whose lock has no import result (a store from before an import check's
            # fault became `error:import-check`) is run again; an inconclusive one would only say so again.
            if undecided is None or not undecided.startswith(NO_IMPORT_RESULT):
                return Check(
                    version=version,
                    stage=stage,
                    cells=results,
                    reused=True,
                    seconds=0.0,
                    import_undecided=undecided,
                )
            rerun = True
        known_before = stage == "import" and self._import_known(plan)
        self.say(f"{self.target.package} {version}: running {','.join(stages)}")
        started = time.monotonic()
        run_id = self._next_run_id()
        options = RunOptions(
            stages=stages,
            store=self.options.store,
            workdir=self.options.workdir,
            lock_dir=self.options.lock_dir,
            rerun=rerun,
            run_id=run_id,
        )
        # The pipeline's own progress would interleave with the bisection's: its lines go nowhere.
        run_plan(plan, self.backend(plan, stages), options, console=Console(file=io.StringIO()))
        with Store(self.options.store) as store:
            mine = {r.cell_id: r for r in store.all_rows() if r.run_id == run_id}
        results = tuple(
            _result(mine[c.id]) if c.id in mine else CellResult(mode=c.mode, cell_id=c.id, verdict="error:owned")
            for c in cells
        )
        return Check(
            version=version,
            stage=stage,
            cells=results,
            reused=known_before,
            seconds=time.monotonic() - started,
            import_undecided=self._import_undecided(stage, results),
        )

    def _import_result(self, lock_file: str | None) -> importcheck.ImportCheck | None:
        if not lock_file or not Path(lock_file).is_file():
            return None
        return importcheck.recorded(Path(lock_file), self.target.spec.engine, cache_dir=self.options.workdir / "cache")

    def _import_known(self, plan: Plan) -> bool:
        """Whether the import check already has a result for the environment's lock as it stands (so this
        check installs nothing: it counts as reused)."""
        return self._import_result(str(self.options.lock_dir / f"{plan.cells[0].env_id}.lock.txt")) is not None

    def _import_undecided(self, stage: str, results: Sequence[CellResult]) -> str | None:
        """Why the import stage decided nothing for cells it left `skipped:no-gpu`, asked of the import check's
        record of their lock (the runner's notes are for people), or None."""
        if stage != "import":
            return None
        for cell in results:
            if not cell.verdict.startswith("skipped:"):
                continue  # it predicted a failure, or the verdict's kind says it is undecided
            known = self._import_result(cell.lock_file)
            if known is None:
                return f"{NO_IMPORT_RESULT} {cell.lock_file or '(no lock)'}"
            if known.outcome == "inconclusive":
                return f"import check: inconclusive {known.klass}: {known.evidence}".rstrip(": ")
        return None

    def _next_run_id(self) -> str:
        self._runs += 1
        return f"{self.options.run_id}.{self._runs}"

    # -- the trace probe of one entry ------------------------------------------------------------------
    def _entry_probe(self, plan: Plan, version: str) -> Check:
        """The probe stage as the engine's probe of `--probe-entry` alone (its `probe_entry` hook), on the cells
        of its trace modes. Stored like the pipeline's probe rows, by the pipeline's row builder."""
        entry = self.options.probe_entry
        assert entry is not None
        spec = plan.spec
        cells = [c for c in plan.cells if c.applicable and c.mode in spec.engine.trace_modes]
        if not cells:
            raise InputError(
                f"--probe-entry probes the cells of a trace mode ({', '.join(spec.engine.trace_modes) or 'none'}); "
                f"the selection keeps {', '.join(self.target.modes)}"
            )
        hashes = {c.id: entry_inputs_hash(plan, c, entry) for c in cells}
        with Store(self.options.store) as store:
            stored = [store.finished(c.id, hashes[c.id]) for c in cells]
        if all(row is not None for row in stored):
            return Check(
                version=version, stage="probe", cells=tuple(_result(r) for r in stored if r), reused=True, seconds=0.0
            )
        self.say(f"{self.target.package} {version}: running resolve, the {entry} probe")
        started = time.monotonic()
        env = cells[0].env
        resolved = resolve(resolve_request(plan, env.env_id), out_dir=self.options.lock_dir)
        resolve_s = time.monotonic() - started
        cached = False
        result = verdict.resolve_ended(resolved.status, resolved.reason)
        if result is None:
            locked = PreflightInput(
                cell=cells[0], engine=spec.engine, pins=resolved.pins, cache_dir=self.options.workdir / "cache"
            )
            assert self._hooks.probe_entry is not None  # the command checked it
            result, cached = self._hooks.probe_entry(locked, entry, needs_gpu=not gpu_ready(env))
        seconds = {"resolve": round(resolve_s, 3), "probe": round(time.monotonic() - started - resolve_s, 3)}
        run_id = self._next_run_id()
        flags = spec_secret_flags(spec)
        host = hostinfo.host().to_dict()
        backend = self.backend(plan, PIPELINE_STAGES["probe"]).name
        with Store(self.options.store) as store:
            for cell in cells:
                row = cell_row(
                    plan,
                    cell,
                    run_id=run_id,
                    inputs=hashes[cell.id],
                    host=host,
                    backend=backend,
                    secret_flags=flags,
                    resolved=resolved,
                )
                store.record(
                    **row, verdict=str(result), excerpt=result.excerpt, evidence=list(result.evidence), stages=seconds
                )
        results = tuple(
            CellResult(
                mode=c.mode,
                cell_id=c.id,
                verdict=str(result),
                excerpt=result.excerpt,
                evidence=result.evidence,
                run_id=run_id,
            )
            for c in cells
        )
        return Check(version=version, stage="probe", cells=results, reused=cached, seconds=time.monotonic() - started)


def entry_inputs_hash(plan: Plan, cell: Cell, entry: str) -> str:
    """A probe row's inputs, with the entry that was probed: not the pipeline's probe, so not its rows."""
    return content_hash({"probe": inputs_hash(plan, cell, PIPELINE_STAGES["probe"]), "probe_entry": entry})


def _result(row: Row) -> CellResult:
    return CellResult(
        mode=row.mode,
        cell_id=row.cell_id,
        verdict=str(row.verdict or ""),
        excerpt=str(row.excerpt or ""),
        evidence=tuple(str(e) for e in row.evidence or ()),
        run_id=row.run_id,
        lock_file=row.lock_file,
    )
