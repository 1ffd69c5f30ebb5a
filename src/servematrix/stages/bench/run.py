"""A workload run against a server, level by level, each level sized to last at least ``min_level_s``."""

import math
import sys
import time
from collections.abc import Callable

from servematrix.stages.bench.pool import Batch, ClientPool
from servematrix.stages.bench.stats import BenchReport, Ceiling, LevelRun, LevelSummary, drift, level_figure
from servematrix.stages.bench.workload import Prompts, Workload, endpoint
from servematrix.stages.bench_worker import (
    RequestResult,
    Target,
    format_cpus,
)

# Level sizing: requests for min_level_s at the measured rate, times this margin (rates drift between batches).
SIZE_MARGIN = 1.5
# At most this many short repeats are discarded per level before the floor is given up (floor_met: false).
MAX_RESIZES = 4


def _size(workload: Workload, request_s: float | None, at_least: int) -> int:
    """Requests per repeat: enough for ``min_level_s`` at ``request_s`` (with a margin), within the bounds."""
    n = max(workload.prompts_per_concurrency, at_least)
    if workload.min_level_s > 0 and request_s:
        n = max(n, math.ceil(workload.min_level_s * request_s * SIZE_MARGIN))
    return min(n, workload.max_level_requests)


def _run_level(
    pool: ClientPool,
    url: str,
    prompts: Prompts,
    c: int,
    workload: Workload,
    ceiling: Ceiling | None,
    say: Callable[[str], None],
) -> LevelSummary:
    w = workload

    def batch(n: int) -> Batch:
        return pool.run_batch(url, prompts.take(n), c, api=w.api, timeout_s=w.timeout_s)

    if w.prompts_per_concurrency < c:
        say(f"c={c}: only {w.prompts_per_concurrency} requests, fewer than the concurrency")
    warm: list[RequestResult] = []
    rate = None
    if w.warmup:
        wb = batch(w.warmup)
        warm = wb.results
        completed = sum(r.ok for r in warm)
        say(f"c={c}: warmup {w.warmup} requests, {len(warm) - completed} errors")
        if completed == len(warm) and wb.wall_s > 0:
            # A warmup with fewer requests than streams underestimates the level's rate: scale it up (erring
            # towards longer levels; a repeat that still ends short is redone).
            rate = completed / wb.wall_s * c / min(c, w.warmup)
    n = _size(w, rate, 0)
    runs: list[LevelRun] = []
    discarded: list[float | None] = []
    calibration = resizes = measured = 0
    stable: dict = {}
    while len(runs) < w.repeats:
        b = batch(n)
        run = LevelRun.aggregate(c, measured, b.results, b.wall_s, client_cpu_s=b.cpu_s, client_processes=b.processes)
        short = run.wall_s < w.min_level_s
        if short and run.completed and run.error_count == 0 and n < w.max_level_requests and resizes < MAX_RESIZES:
            resizes += 1
            calibration += n
            n = _size(w, run.completed / run.wall_s, n + 1)
            say(f"c={c}: {run.wall_s:.2f} s, under the {w.min_level_s} s floor: discarded; {n} requests per repeat")
            continue
        runs.append(run)
        measured += 1
        if w.min_level_s > 0 and run.completed and run.error_count == 0:
            n = _size(w, run.completed / run.wall_s, 0)  # the next repeat, sized at this one's rate (up or down)
        say(
            f"c={c} repeat {len(runs)}/{w.repeats}: {run.output_tok_s:.1f} tok/s, {run.request_s:.2f} req/s, "
            f"{run.completion_tokens} tokens, {run.error_count} errors, {run.wall_s:.2f} s, "
            f"client {run.client_cpu_s or 0:.2f} CPU s"
        )
        if len(runs) == w.repeats:
            # Warm-up until stable: while the repeats still drift, the oldest becomes warm-up and one more runs.
            figures = [level_figure(r, w.profile) for r in runs]
            stable = drift([f for f in figures if f is not None], w.drift_bound)
            if stable["drifting"] and len(discarded) < w.max_warmup_repeats:
                discarded.append(figures[0])
                runs.pop(0)
                say(f"c={c}: drifting ({stable['change']:+.1%} first half to second), one more warm-up repeat")
    stable = {
        **stable,
        "figure": "ttft_mean_s" if w.profile == "prefill" else "output_tok_s",
        "discarded": discarded,
        "stable": stable.get("drifting") is False,
    }
    return LevelSummary.of(
        c,
        runs,
        warmup=warm,
        calibration_requests=calibration,
        min_level_s=w.min_level_s,
        ceiling_tok_s=ceiling.tok_s(c) if ceiling is not None else None,
        warmup_repeats=len(discarded),
        stability=[stable],
    )


def run_workload_sync(
    base_url: str,
    model: str,
    workload: Workload,
    *,
    progress: Callable[[str], None] | None = None,
    ceiling: Ceiling | None = None,
) -> BenchReport:
    """Run every concurrency level of ``workload`` against an OpenAI-compatible server at ``base_url``.

    ``model`` is sent as the request's ``model`` field (for ``transformers serve``: exactly the model argument
    it was started with). Server and network faults are counted as errors, never raised. ``ceiling`` (from
    :func:`measure_ceiling` on this host) is recorded beside every level and sets its ``client_bound`` flag.
    """
    say = progress or (lambda _msg: None)
    url = endpoint(base_url, workload.api)
    Target.of(url)  # a bad URL is the caller's mistake: raise before starting anything
    started_at = time.time()
    t_start = time.perf_counter()
    prompts = Prompts(model, workload)
    with ClientPool(workload.client_processes, workload.client_cpus) as pool:
        levels = [_run_level(pool, url, prompts, c, workload, ceiling, say) for c in workload.concurrency]
    return BenchReport(
        base_url=base_url,
        model=model,
        workload=workload,
        levels=levels,
        started_at=started_at,
        duration_s=time.perf_counter() - t_start,
        client={
            "name": "servematrix.stages.bench",
            "transport": "asyncio HTTP/1.1 (servematrix.stages.bench_worker)",
            "processes": workload.client_processes,
            "cpus": format_cpus(workload.client_cpus) if workload.client_cpus else "any",
            "python": sys.version.split()[0],
        },
        client_ceiling=ceiling,
    )
