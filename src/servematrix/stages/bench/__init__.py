"""The ONE benchmark client used for every cell: OpenAI-compatible streaming, usage-counted tokens.

It runs in the harness (never inside a cell's environment), so every engine and version is measured by the same
code. Known faults of benchmark clients, and what this one does about them:

* The client becomes the bottleneck (on the H200, a one-process httpx client topped out near 32 k tok/s against
  a fake server while the server made 10-15 k tok/s, and its jitter was the spread). So:

  - the hot path is lean (``bench_worker``: a raw asyncio HTTP/1.1 reader that parses bytes as they arrive and
    fully decodes only the last events of a stream);
  - it runs in ``Workload.client_processes`` worker processes, each with its own event loop and its share of the
    streams, started together (one start barrier) and merged;
  - its ceiling on the benchmark host is measured (:func:`measure_ceiling`, against the fake server with no
    per-token delay) and stored beside every figure; a level at 1/3 of the ceiling or more, or whose client
    processes were busy 1/3 of the time or more, is ``client_bound``;
  - its CPU time (user+sys, summed over the worker processes) is stored beside every figure;
  - :func:`split_cpus` gives the server and the client disjoint CPUs on a shared host.
* Levels too short to be stable: ``min_level_s`` sizes each level from the throughput measured in its warmup; a
  repeat that still ends under the floor is discarded (counted as calibration) and the level resized.
* Read buffers. aiohttp's default 64 KB line limit truncates long SSE lines at long contexts (a known vLLM
  benchmark issue). ``bench_worker`` splits lines itself, with no such limit.
* Re-tokenized output counts drift from what the server generated. Completion tokens come ONLY from the
  server's ``usage.completion_tokens``; a stream without usage is an error (``missing_usage``), never guessed.
  ``ignore_eos`` (opt-in; sglang and vLLM know it) makes every repeat produce the same number of tokens.

Usage placement differs by server and is handled the same way: transformers puts ``usage`` on the final chunk
(the one carrying ``finish_reason``) and sends no ``data: [DONE]``; sglang and vLLM send a separate last chunk
with ``choices: []`` and ``usage``, then ``data: [DONE]``.

Comparing two modes: :func:`speedup` gives the ratio of per-start medians, its 95 % t-interval over server
starts (`interval`), and a verdict: faster, slower or indeterminate.

The package, one module per job: ``workload`` (what is sent), ``pool`` (the client's worker processes), ``run``
(levels, sized and repeated), ``stats`` (the figures of a repeat, a level and a run, and the pooling of server
starts), ``ceiling`` (the client's ceiling on this host), ``compare`` (a mode against the baseline, on the
metric of the phase it changes), ``cpus`` (disjoint CPU sets) and ``smoke`` (one request first).
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
