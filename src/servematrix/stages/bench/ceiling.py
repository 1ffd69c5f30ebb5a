"""The client's ceiling on this host: the same workload against the fake server, which costs no time per
token."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence

from servematrix.stages.bench.pool import child_env
from servematrix.stages.bench.run import run_workload_sync
from servematrix.stages.bench.stats import Ceiling, CeilingLevel
from servematrix.stages.bench.workload import Workload
from servematrix.stages.bench_worker import (
    format_cpus,
)


@contextlib.contextmanager
def fake_server(*, processes: int = 1, cpus: Sequence[int] = (), extra: Sequence[str] = ()) -> Iterator[str]:
    """The fake server (``servematrix.stages.bench_fake``) as its own process group; yields its base URL."""
    argv = [sys.executable, "-m", "servematrix.stages.bench_fake", "--port", "0", "--processes", str(processes)]
    if cpus:
        argv += ["--cpus", format_cpus(cpus)]
    proc = subprocess.Popen([*argv, *extra], stdout=subprocess.PIPE, text=True, start_new_session=True, env=child_env())
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"the fake server did not start (exit {proc.wait(10)}): {line!r}")
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def measure_ceiling(
    workload: Workload,
    *,
    server_cpus: Sequence[int] = (),
    fake_processes: int | None = None,
    level_s: float = 1.0,
    repeats: int = 2,
    progress: Callable[[str], None] | None = None,
) -> Ceiling:
    """The client's ceiling on this host for ``workload``'s shape: its best tok/s per concurrency level against
    the fake server with no per-token delay (sglang-shaped chunks, usage in a last chunk, ``[DONE]``), with the
    same client processes and CPUs, and the fake on ``server_cpus``; and its CPU seconds per 1000 tokens.

    Each level runs a warmup of ``max(concurrency)`` requests, then ``repeats`` repeats of at least ``level_s``.
    ``fake_processes`` defaults to one per server CPU (at most 8), or half this host's CPUs (at most 4).
    """
    if fake_processes is None:
        fake_processes = min(8, len(server_cpus)) if server_cpus else max(1, min(4, (os.cpu_count() or 2) // 2))
    widest = max(workload.concurrency)
    shape = Workload(
        concurrency=workload.concurrency,
        input_len=workload.input_len,
        output_len=workload.output_len,
        prompts_per_concurrency=widest,
        warmup=widest,
        repeats=repeats,
        api=workload.api,
        timeout_s=60.0,
        ignore_eos=workload.ignore_eos,
        min_level_s=level_s,
        max_level_requests=workload.max_level_requests,
        client_processes=workload.client_processes,
        client_cpus=workload.client_cpus,
    )
    fake_flags = ("--usage", "separate_chunk", "--send-done", "--null-fields")
    with fake_server(processes=fake_processes, cpus=server_cpus, extra=fake_flags) as url:
        report = run_workload_sync(url, "fake", shape, progress=progress)
    if report.error_count:
        samples = [s for lv in report.levels for r in lv.runs for s in r.error_samples]
        raise RuntimeError(f"measuring the client's ceiling: {report.error_count} failed requests: {samples[:3]}")
    levels = []
    for lv in report.levels:
        best = max(lv.runs, key=lambda r: r.output_tok_s)
        levels.append(
            CeilingLevel(
                concurrency=lv.concurrency,
                tok_s=best.output_tok_s,
                cpu_s_per_1k_tokens=lv.client_cpu_s_per_1k_tokens,
                client_busy=best.client_busy,
            )
        )
    return Ceiling(
        levels=tuple(levels),
        client_processes=workload.client_processes,
        client_cpus=tuple(workload.client_cpus),
        server_cpus=tuple(server_cpus),
        fake_processes=fake_processes,
        api=workload.api,
        output_len=workload.output_len,
        measured_at=time.time(),
    )
