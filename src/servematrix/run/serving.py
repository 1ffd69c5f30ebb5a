"""Serving a cell: one server start, and what it proves.

A start is: the run's argv (the planned one with the real model location, port and bind address, and the
secret values filled in), launched through the backend on a port whose derived ports are valid and free,
waited for (`stages/serve.py`), its log checked for a fallback to another implementation (`served_as_named`),
benchmarked (`stages/bench/`), its log checked for proof that the mode ran (`mode_check`), and always
stopped. The benchmark client's ceiling is measured once per run, on the first cell that is benchmarked. The
runner (`pipeline.py`) decides when a cell is served and how often, and turns what a start raises into a
verdict.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from servematrix.backends import Backend, Built, LaunchSpec
from servematrix.classify import pass_failure
from servematrix.engines import Engine
from servematrix.formats import verdict
from servematrix.formats.verdict import Verdict
from servematrix.planning.cells import server_command
from servematrix.planning.plan import Plan
from servematrix.records.cell import Cell
from servematrix.run import ports
from servematrix.run.models import ensure_model
from servematrix.run.runplan import RunOptions, model_roots
from servematrix.stages import bench, serve
from servematrix.stages.bench import correctness
from servematrix.store.redact import fill_secrets
from servematrix.store.rowschema import Row
from servematrix.store.store import Store


@dataclass(frozen=True, kw_only=True)
class Served:
    """One server start of a cell: its verdict, benchmark and stage times."""

    result: Verdict
    metrics: dict[str, Any] | None
    stage_seconds: dict[str, float]


# In the row of a cell whose starts have not all ended: each passing start's figures, proof and stage times, so a
# later run with the same inputs resumes from them instead of starting the cell again (`CellServer.resumed`).
FINISHED_STARTS = "finished_starts"


def _start_record(served: Served) -> dict[str, Any]:
    return {"metrics": served.metrics, "evidence": list(served.result.evidence), "stage_seconds": served.stage_seconds}


def _start_from_record(record: Mapping[str, Any]) -> Served:
    return Served(
        result=Verdict(kind="pass", evidence=tuple(record["evidence"])),
        metrics=dict(record["metrics"]),
        stage_seconds=dict(record["stage_seconds"]),
    )


@dataclass(kw_only=True)
class CellServer:
    """How this run serves a cell once. It holds what every start shares: the backend, the store row it
    updates, the secret flags, the CPU split between server and client, and the client's ceiling."""

    plan: Plan
    backend: Backend
    options: RunOptions
    store: Store
    console: Console
    secret_flags: frozenset[str]
    stage: Callable[[Cell, str], None]  # the progress display: a cell entered a stage
    note: Callable[[str], None]  # a line of the run's own, between cells
    ceiling: bench.Ceiling | None = None  # the benchmark client's, measured on this host once per run
    _ceiling_tried: bool = False
    # The baseline mode's greedy answers, by what they answer (environment, model, prompt set): this run's.
    answers: dict[correctness.CorrectnessKey, dict[int, list[correctness.Answer]]] = dataclasses.field(
        default_factory=dict
    )
    # Each cell's passing starts as stored in its row until it is decided (FINISHED_STARTS), by cell id.
    finished_starts: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    # The run a cell's first starts were resumed from, and how many, by cell id.
    resumed_from: dict[str, tuple[str, int]] = dataclasses.field(default_factory=dict)

    @property
    def starts(self) -> int:
        return self.plan.spec.file.bench.starts

    @functools.cached_property
    def cpu_split(self) -> bench.CpuSplit | None:
        wanted = self.plan.spec.file.bench.client_cpus
        return bench.split_cpus(wanted) if wanted else None

    def serve_once(
        self,
        cell: Cell,
        built: Built,
        *,
        start: int,
        stage_seconds: Mapping[str, float],
        row: Callable[[tuple[str, ...]], dict[str, Any]],
    ) -> Served:
        """Start the cell's server (its `start`-th start, from 0), wait for it, benchmark it, stop it. `row` is
        the cell's store row for the argv that runs. A fault raises: the runner makes it the start's verdict.
        The port and every port derived from it (its ranks' too) are held for this harness until it ends."""
        model_dir = self.model_dir(built)
        offsets = self.plan.spec.engine.port_offsets(cell.env.version, ranks=cell.env.ranks)
        with ports.reserved_port(offsets, host="127.0.0.1") as port:
            served = self._serve_on(
                cell, built, port, model_dir=model_dir, start=start, stage_seconds=stage_seconds, row=row
            )
        if served.metrics is not None and served.result.kind == "pass":
            # The passing starts stay in the cell's row as they end, their figures pooled: a run stopped before
            # the cell's last start (a job's or a call's time limit) keeps them, and the next run resumes from
            # them. The cell's verdict, when it comes, writes the final record over them.
            passing = self.finished_starts.setdefault(cell.id, [])
            passing.append(_start_record(served))
            interim = bench.pool_starts([record["metrics"] for record in passing]) or {}
            self.store.update(self.options.run_id, cell.id, metrics={**interim, FINISHED_STARTS: passing})
        return served

    def resumed(self, cell: Cell, inputs_hash: str, *, installed: str) -> list[Served]:
        """The passing server starts an earlier run finished for this cell, with these inputs, before it was
        stopped without deciding the cell (a job's or a device call's time limit): this run serves only the
        starts still missing. Their figures, mode proof and, for the baseline mode, greedy answers count as
        this run's. None with --rerun, or when the environment's installed set (`installed`, the build's
        `lock_hash`) is not the one they were served from: `--backend existing` builds nothing, and its
        packages can change between runs with the same inputs."""
        if self.options.rerun:
            return []
        row = self.store.undecided(cell.id, inputs_hash, before_run=self.options.run_id)
        if row is None:
            return []
        records = list((row.metrics or {}).get(FINISHED_STARTS) or [])[: self.starts]
        if not records:
            return []
        if row.lock_hash != installed:
            self.note(
                f"{cell.id}: the starts of the stopped run {row['run_id']} are not resumed: they were served from "
                f"another installed set ({row.get('lock_hash')}, now {installed})"
            )
            return []
        starts = [_start_from_record(record) for record in records]
        self.finished_starts[cell.id] = records
        self.resumed_from[cell.id] = (str(row.run_id), len(starts))
        if cell.mode == self.plan.spec.file.axes["mode"][0]:
            key = self._correctness_key(cell)
            found = correctness.stored_answers(starts[0].metrics, key)
            if found is not None:
                self.answers.setdefault(key, found)
        return starts

    def _serve_on(
        self,
        cell: Cell,
        built: Built,
        port: int,
        *,
        model_dir: Path | None,
        start: int,
        stage_seconds: Mapping[str, float],
        row: Callable[[tuple[str, ...]], dict[str, Any]],
    ) -> Served:
        spec = self.plan.spec
        model = self.backend.model_location(model_dir) if model_dir else spec.file.model.path
        run_id = self.options.run_id
        log_path = self.options.workdir / "logs" / run_id / f"{cell.id}{f'.start{start + 1}' if start else ''}.log"
        planned = build_argv(self.plan, cell, model=model, port=port, host=self.backend.bind_host)
        # `***` values of secret flags come from the environment (check_inputs made sure they are set).
        argv = fill_secrets(planned, self.secret_flags, os.environ)
        workdir = self.options.workdir.resolve()
        env_vars = {k: v.format(workdir=workdir) for k, v in cell.server_env.items()}
        for directory in spec.engine.prepare.directories:
            Path(directory.format(workdir=workdir)).mkdir(parents=True, exist_ok=True)
        launch = self.backend.launch(built, argv, env_vars, port, model_dir=model_dir)
        if self.cpu_split is not None and launch.owns_listener:
            # The server on its CPUs, the benchmark client on the others: they must not compete.
            launch = LaunchSpec(argv=tuple(self.cpu_split.pin_server(launch.argv)), env=launch.env, owns_listener=True)
        timeout = spec.file.server.ready_timeout_s or spec.engine.readiness.timeout_s
        # The claimed row gets what resolve and build have learnt since (lock, image) and the argv that runs.
        known = {k: v for k, v in row(argv).items() if k not in ("run_id", "cell_id")}
        self.store.update(run_id, cell.id, **known, log_path=str(log_path), harness_pid=os.getpid())

        def started(pid: int, pgid: int) -> None:
            self.store.update(run_id, cell.id, server_pid=pid, server_pgid=pgid)

        seconds = dict(stage_seconds)
        metrics: dict[str, Any] | None = None
        try:
            self.stage(cell, f"serve{f' (start {start + 1})' if self.starts > 1 else ''}")
            with serve.Server(
                launch,
                engine=spec.engine.name,
                port=port,
                log_path=log_path,
                readiness=spec.engine.readiness,
                timeout_s=timeout,
                on_started=started,
                secret_flags=self.secret_flags,
                public_env=spec.engine.public_env,
                passed_env=tuple(env_vars),
                marker=serve.harness_marker(run_id, cell.id),
            ) as server:
                ready = server.wait_ready()
                seconds["serve"] = round(ready.seconds, 3)
                if ready.after_ready_line_s is not None:
                    seconds["ready_after_log_line"] = round(ready.after_ready_line_s, 3)
                if not ready.ok:
                    assert ready.verdict is not None
                    result = ready.verdict
                elif (named := served_as_named(spec.engine, log_path)).kind != "pass":
                    result = named  # it fell back to another implementation while it loaded: no benchmark
                elif "bench" in self.options.stages:
                    self.stage(cell, "bench")
                    started_bench = time.monotonic()
                    result, metrics = self.run_bench(
                        server, model, budget_s=cell.env.gpu.timeout_minutes * 60, cell=cell
                    )
                    seconds["bench"] = round(time.monotonic() - started_bench, 3)
                else:
                    result = verdict.passed()
                if result.kind == "pass":
                    result = mode_check(spec.engine, cell, log_path)
                    checked = (metrics or {}).get("correctness") or {}
                    if result.kind == "pass" and checked.get("summary"):
                        result = dataclasses.replace(result, evidence=(*result.evidence, checked["summary"]))
                if metrics is not None:
                    # The start-up cost a user pays for the mode, beside its figures.
                    metrics["capture_s"] = capture_seconds(log_path)
        finally:
            # Killing a `podman run` client only forwards SIGTERM: a hung server would keep its container
            # (and GPUs). Backends that own such resources remove them here.
            self.backend.stop(launch)
        # The harness picked the port: if another process took it first, that is the harness's fault.
        return Served(result=verdict.served(result, harness_picked_port=True), metrics=metrics, stage_seconds=seconds)

    def run_bench(
        self, server: serve.Server, model: str, *, budget_s: float, cell: Cell
    ) -> tuple[Verdict, dict[str, Any] | None]:
        file = self.plan.spec.file
        smoke = bench.smoke_check_sync(server.base_url, model, api=file.bench.api)
        doomed = server.check()
        if doomed is not None:
            return doomed, None
        if not smoke.ok:
            return verdict.failed("smoke", excerpt=smoke.reason), None
        # Right answers before any figure: a mode that fails gets no figures.
        wrong, checked = self.check_correctness(cell, server.base_url, model)
        doomed = server.check()
        if doomed is not None:
            return doomed, None
        if wrong is not None:
            return wrong, None
        workloads = self.workloads()
        if self.ceiling is None and not self._ceiling_tried:
            self._ceiling_tried = True
            self.note("measuring the benchmark client's ceiling on this host (fake server)")
            try:
                self.ceiling = bench.measure_ceiling(
                    workloads[-1], server_cpus=self.cpu_split.server if self.cpu_split else ()
                )
            except (RuntimeError, OSError) as exc:
                self.console.print(f"[yellow]the client's ceiling could not be measured: {exc}[/]")
        with bench.cell_budget(budget_s):  # a server that hangs mid-bench costs at most its GPU kind's job limit
            reports = [bench.run_workload_sync(server.base_url, model, w, ceiling=self.ceiling) for w in workloads]
        # The decode profile's report is the record; another profile's is stored inside it, under its name.
        metrics = reports[-1].to_dict()
        metrics.update({r.workload.profile: r.to_dict() for r in reports[:-1]})
        if checked:
            metrics["correctness"] = checked
        doomed = server.check()
        if doomed is not None:
            return doomed, metrics
        errors = sum(r.error_count for r in reports)
        if errors:
            return verdict.failed("bench-errors", excerpt=f"{errors} request(s) failed"), metrics
        return verdict.passed(), metrics

    def check_correctness(self, cell: Cell, base_url: str, model: str) -> tuple[Verdict | None, dict[str, Any]]:
        """The mode's greedy answers against the baseline's (`stages/bench/correctness.py`): a failing verdict,
        or None, and the record stored beside the figures (the baseline's holds its answers, for later runs
        and other runners of the same kind)."""
        spec = self.plan.spec
        settings = spec.file.bench.correctness
        if not settings.enabled:
            return None, {}
        key = self._correctness_key(cell)
        levels = (1, correctness.batch_concurrency(spec.file.bench.concurrency))
        try:
            got = correctness.collect(
                base_url,
                model,
                api=key.api,
                concurrency=levels,
                max_tokens=key.max_tokens,
                top_k=key.top_k,
                ignore_eos=spec.engine.supports_ignore_eos,
            )
        except (RuntimeError, httpx.HTTPError, ValueError, KeyError, TypeError, IndexError) as exc:
            return verdict.failed("smoke", excerpt=f"the correctness check's greedy requests failed: {exc}"), {}
        record: dict[str, Any] = {"key": key.to_dict(), "concurrency": list(levels)}
        record.update(self._accuracy(base_url, model, key, cell))
        baseline_mode = spec.file.axes["mode"][0]
        if cell.mode == baseline_mode:
            self.answers.setdefault(key, got)
            record["answers"] = correctness.answers_to_dict(got)
            logprobs = all(a.has_logprobs for answers in got.values() for a in answers)
            record["summary"] = (
                f"correctness: the baseline's {sum(map(len, got.values()))} greedy answers stored "
                f"({'with top-k logprobs' if logprobs else 'text only: the API gave no logprobs'})"
            )
        else:
            base = self.answers.get(key) or self._stored_baseline(cell, baseline_mode, key)
            if base is None:
                record["summary"] = (
                    f"correctness: unchecked, no {baseline_mode} answers for this environment, model and prompt set"
                )
            else:
                result = correctness.check(base, got)
                record["result"] = result.to_dict()
                record["summary"] = result.summary()
                if not result.ok:
                    return verdict.failed("wrong-output", excerpt=result.excerpt()), record
        floor = settings.accuracy_floor
        if floor is not None and record.get("accuracy", {}).get("score", 1.0) < floor:
            return verdict.failed("wrong-output", excerpt=f"accuracy probe: {record['accuracy']['summary']}"), record
        return None, record

    def _correctness_key(self, cell: Cell) -> correctness.CorrectnessKey:
        """What a mode's greedy answers answer: the environment, the model, the API and the prompt settings."""
        file = self.plan.spec.file
        return correctness.CorrectnessKey(
            env_id=cell.env_id,
            model=file.model.name,
            api=file.bench.api,
            max_tokens=file.bench.correctness.max_tokens,
            top_k=file.bench.correctness.top_k,
        )

    def _accuracy(self, base_url: str, model: str, key: correctness.CorrectnessKey, cell: Cell) -> dict[str, Any]:
        """The arithmetic probe, where the matrix sets a floor (real weights only; on random ones it is 0)."""
        settings = self.plan.spec.file.bench.correctness
        if settings.accuracy_floor is None:
            return {}
        score, _texts = correctness.accuracy(base_url, model, api=key.api, count=settings.accuracy_problems)
        baseline = self._stored_accuracy(cell, key)
        result = correctness.AccuracyResult(
            score=score, baseline_score=baseline, floor=settings.accuracy_floor, problems=settings.accuracy_problems
        )
        return {
            "accuracy": {"score": score, "baseline_score": baseline, "floor": result.floor, "summary": result.summary()}
        }

    def _baseline_rows(self, cell: Cell) -> list[Row]:
        baseline_mode = self.plan.spec.file.axes["mode"][0]
        return [
            row
            for row in self.store.latest()
            if row.env_id == cell.env_id and row.mode == baseline_mode and row.verdict == "pass"
        ]

    def _stored_baseline(
        self, cell: Cell, baseline_mode: str, key: correctness.CorrectnessKey
    ) -> dict[int, list[correctness.Answer]] | None:
        """The baseline's answers from the store (another run, or another runner of the same kind merged in)."""
        for row in self._baseline_rows(cell):
            found = correctness.stored_answers(row.metrics, key)
            if found is not None:
                return found
        return None

    def _stored_accuracy(self, cell: Cell, key: correctness.CorrectnessKey) -> float | None:
        for row in self._baseline_rows(cell):
            record = (row.metrics or {}).get("correctness") or {}
            if record.get("key") == key.to_dict() and isinstance(record.get("accuracy"), dict):
                return record["accuracy"].get("score")
        return None

    def workloads(self) -> tuple[bench.Workload, ...]:
        """What each served cell runs, the decode profile last: first the prefill profile, when a mode of the
        matrix changes prefill (every cell runs it, the baseline included, so the modes can be compared)."""
        spec = self.plan.spec
        settings = spec.file.bench.model_dump()
        given = {
            "ignore_eos": spec.engine.supports_ignore_eos,
            "client_cpus": self.cpu_split.client if self.cpu_split else (),
        }
        decode = bench.Workload.from_settings(settings, profile="decode", **given)
        if not any(spec.engine.phase_of(mode) == "prefill" for mode in spec.file.axes.get("mode", ())):
            return (decode,)
        prefill = bench.Workload.from_settings({**settings, **settings["prefill"]}, profile="prefill", **given)
        return (prefill, decode)

    def pooled_metrics(self, starts: list[Served]) -> dict[str, Any] | None:
        """The benchmark figures of a cell's starts pooled into one record, with the client's ceiling."""
        metrics = bench.pool_starts([s.metrics for s in starts if s.metrics is not None])
        if metrics is not None and self.ceiling is not None:
            metrics["client_ceiling"] = self.ceiling.to_dict()
        return metrics

    def model_dir(self, built: Built) -> Path | None:
        """A model servematrix builds (``model.build``), built once with the environment's interpreter."""
        model = self.plan.spec.file.model
        if not model.build:
            return None
        return ensure_model(
            Path(model.path),
            builder=model.build,
            engine=self.plan.spec.engine,
            python=lambda visible: self.backend.python(built, visible=visible),
            roots=model_roots(self.options),
        )


# sglang's graph capture lines: "Capture cuda graph end. Time elapsed: 2.45 s." (to 0.5.13),
# "Capture target prefill CUDA graph end. elapsed=1.23 s," (0.5.14 on).
_CAPTURE = re.compile(r"Capture (?P<what>[^\n]*?) end\.? (?:Time elapsed: |elapsed=)(?P<s>[0-9.]+) ?s")


def capture_seconds(log_path: Path) -> dict[str, float]:
    """Each graph capture's time, from the server log: {"piecewise CUDA graph": 6.26, "cuda graph": 2.45}
    (a capture logged twice, e.g. by two ranks, is their median)."""
    if not log_path.is_file():
        return {}
    found: dict[str, list[float]] = {}
    for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        if (m := _CAPTURE.search(line)) is not None:
            found.setdefault(m.group("what"), []).append(float(m.group("s")))
    return {what: statistics.median(values) for what, values in found.items()}


def served_as_named(engine: Engine, log_path: Path) -> Verdict:
    """A served cell passes only if its log shows no signature that fails a pass (signature data
    `fails_a_pass`): a server that answered through another implementation than the release's own (sglang's
    Transformers fallback) says nothing about the stack the cell names."""
    found = pass_failure(log_path, engine.name) if log_path.is_file() else None
    if found is None:
        return verdict.passed()
    excerpt = f"the server answered, but: {found.title}\n{found.excerpt}"
    return verdict.failed(found.cls, excerpt=excerpt, evidence=found.evidence)


def mode_check(engine: Engine, cell: Cell, log_path: Path) -> Verdict:
    """A served cell passes only if its log proves the mode ran as asked (engine data: `mode_evidence`)."""
    rule = engine.evidence_for(cell.mode, cell.env.version)
    if rule is None:
        return verdict.passed()
    lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines() if log_path.is_file() else []
    proof: list[str] = []  # the first applied line decides (it names the backend where the release says it)
    for wanted in rule.applied:
        found = next((line for line in lines if wanted in line), None)
        if found is None:
            return verdict.failed(
                "mode-not-applied",
                excerpt=f"no {wanted!r} line in the server log: {engine.name} {cell.env.version} did not run "
                f"{cell.mode} as asked",
            )
        proof.append(found)
    for unwanted in rule.absent:
        found = next((line for line in lines if unwanted in line), None)
        if found is not None:
            return verdict.failed(
                "mode-not-applied",
                excerpt=f"{cell.mode} cell, yet the server log says: {found.strip()[:300]}",
            )
    if proof:
        evidence = f"{cell.mode} applied: {proof[0].strip()[:300]}"
    else:
        evidence = f"{cell.mode}: no {' or '.join(repr(u) for u in rule.absent)} line in the server log"
    return Verdict(kind="pass", evidence=(evidence,))


def build_argv(plan: Plan, cell: Cell, *, model: str, port: int, host: str) -> tuple[str, ...]:
    """The cell's planned argv, with the run's real model location, port and bind address."""
    flags = plan.spec.engine.mode_flags_for(cell.mode, cell.env.version)
    return server_command(plan.spec, cell.env, flags.args, port=port, model=model, host=host)
