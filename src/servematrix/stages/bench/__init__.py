"""The ONE benchmark client used for every cell: OpenAI-compatible streaming, usage-counted tokens.

It runs in the harness (never inside a cell's environment), so every engine and version is measured by the same
code. It guards against the known faults of benchmark clients: a lean hot path (``bench_worker``) in
``Workload.client_processes`` worker processes; its ceiling (:func:`measure_ceiling`) and CPU time stored beside
every figure, a level near the ceiling marked ``client_bound``; :func:`split_cpus` for disjoint CPUs;
``min_level_s`` for stable levels; completion tokens ONLY from the server's ``usage`` (else ``missing_usage``).
:func:`speedup` compares two modes. One module per job: ``workload``, ``pool``, ``run``, ``stats``,
``ceiling``, ``compare``, ``cpus``, ``smoke``.

More, with the measurements behind it: docs/design-notes.md#srcservematrixstagesbench__init__py
"""

from servematrix.stages.bench.ceiling import fake_server, measure_ceiling
from servematrix.stages.bench.compare import METRICS, PHASE_METRICS, Metric, ModeComparison, Speedup, compare, speedup
from servematrix.stages.bench.cpus import CpuSplit, split_cpus
from servematrix.stages.bench.pool import Batch, ClientPool, cell_budget
from servematrix.stages.bench.run import run_workload_sync
from servematrix.stages.bench.smoke import SMOKE_MAX_TOKENS, SMOKE_PROMPT, SmokeResult, smoke_check, smoke_check_sync
from servematrix.stages.bench.stats import (
    CLIENT_BOUND_FRACTION,
    BenchReport,
    Ceiling,
    CeilingLevel,
    LatencyStats,
    LevelRun,
    LevelSummary,
    Spread,
    percentile,
    pool_starts,
)
from servematrix.stages.bench.workload import (
    APIS,
    NESTED_PROFILES,
    PROFILES,
    Workload,
    endpoint,
    make_prompt,
    request_body,
)
from servematrix.stages.bench_worker import RequestResult

__all__ = [
    "APIS",
    "CLIENT_BOUND_FRACTION",
    "METRICS",
    "NESTED_PROFILES",
    "PHASE_METRICS",
    "PROFILES",
    "SMOKE_MAX_TOKENS",
    "SMOKE_PROMPT",
    "Batch",
    "BenchReport",
    "Ceiling",
    "CeilingLevel",
    "ClientPool",
    "CpuSplit",
    "LatencyStats",
    "LevelRun",
    "LevelSummary",
    "Metric",
    "ModeComparison",
    "RequestResult",
    "SmokeResult",
    "Speedup",
    "Spread",
    "Workload",
    "cell_budget",
    "compare",
    "endpoint",
    "fake_server",
    "make_prompt",
    "measure_ceiling",
    "percentile",
    "pool_starts",
    "request_body",
    "run_workload_sync",
    "smoke_check",
    "smoke_check_sync",
    "speedup",
    "split_cpus",
]
