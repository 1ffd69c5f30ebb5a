"""Is the benchmark client fast enough not to be the bottleneck? A benchmark, not a timed assertion.

* ``test_client_max_tok_s_vs_fake``: the client's maximum output tokens/s against a trivial FAKE streaming
  server (a separate process, one token per SSE chunk, no delay), and its CPU cost per token.
* ``test_client_headroom_vs_real_cpu_server`` (integration, slow): the same, and the tok/s of a real
  `transformers serve` with continuous batching on the CPU, measured in the same run; prints the ratio
  (target >= 10x). It also prints the in-situ headroom: 1 / the fraction of one core the client used while
  the real server streamed. That one counts the real pacing (one network read per token, which costs the
  client ~3x more CPU per token than the fake's coalesced bursts).

Run with ``-s`` to see the numbers; pytest-benchmark also records them in ``extra_info``. On a small machine
other processes change both numbers a lot: the load average is printed with them.
"""

import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from servematrix.stages.bench import Workload, run_workload_sync
from tests.integration.test_tinymodel_and_bench import (
    CB_FLAGS,
    VERSIONS,
    ensure_model,
    ensure_venv,
    transformers_serve,
)

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "fake_openai_server.py"
CONCURRENCY = 16
# The CPU workload of matrix/cpu-smoke.toml: 16 streams of 64 tokens.
REAL = Workload(
    concurrency=(CONCURRENCY,), input_len=32, output_len=64, prompts_per_concurrency=32, warmup=2, repeats=3
)
# Against the fake: longer streams, so the measurement is the steady state of the client's streaming loop.
FAKE_LOAD = Workload(
    concurrency=(CONCURRENCY,), input_len=32, output_len=512, prompts_per_concurrency=64, warmup=4, repeats=3
)


@contextmanager
def fake_server_process() -> Iterator[str]:
    """The fake server in its own process (so it does not share the client's GIL); yields its base URL."""
    proc = subprocess.Popen(
        [sys.executable, str(FAKE), "--port", "0"], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("PORT "), line
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def client_cpu() -> Iterator[dict]:
    """Measures this process's CPU seconds and the wall time of the block (the client runs in-process)."""
    out: dict = {}
    ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    yield out
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    out["wall_s"] = time.perf_counter() - t0
    out["cpu_s"] = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)


def client_max_tok_s() -> tuple[float, dict]:
    with fake_server_process() as base, client_cpu() as cpu:
        report = run_workload_sync(base, "fake", FAKE_LOAD)
    assert report.error_count == 0
    lv = report.levels[0]
    tokens = report.completion_tokens + FAKE_LOAD.warmup * FAKE_LOAD.output_len
    info = {
        "min": lv.output_tok_s.min,
        "max": lv.output_tok_s.max,
        "client_us_per_token": cpu["cpu_s"] / tokens * 1e6,
        "client_core_fraction": cpu["cpu_s"] / cpu["wall_s"],
    }
    return lv.output_tok_s.median, info


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min), {os.cpu_count()} CPUs"


def test_client_max_tok_s_vs_fake(benchmark):
    tok_s, info = benchmark.pedantic(client_max_tok_s, rounds=1, iterations=1)
    benchmark.extra_info.update(client_max_tok_s=tok_s, **info, load=_load())
    print(
        f"\nclient max vs fake server, c={CONCURRENCY}: {tok_s:,.0f} tok/s (min {info['min']:,.0f}, max "
        f"{info['max']:,.0f}); client {info['client_us_per_token']:.0f} us CPU per token, "
        f"{info['client_core_fraction']:.0%} of a core; {_load()}"
    )
    assert tok_s > 0


@pytest.mark.integration
@pytest.mark.slow
def test_client_headroom_vs_real_cpu_server(benchmark):
    version = VERSIONS[-1]
    python = ensure_venv(version)
    model_dir = ensure_model(python)

    def measure() -> tuple[float, dict, float, dict]:
        # client_cpu is entered once the server is ready: it measures the benchmark only.
        with transformers_serve(python, model_dir, CB_FLAGS) as srv, client_cpu() as cpu:
            real = run_workload_sync(srv.base_url, srv.model, REAL)
        assert real.error_count == 0
        fake_tok_s, fake_info = client_max_tok_s()
        return real.output_tok_s(CONCURRENCY), cpu, fake_tok_s, fake_info

    real_tok_s, cpu, fake_tok_s, fake_info = benchmark.pedantic(measure, rounds=1, iterations=1)
    ratio = fake_tok_s / real_tok_s
    # The client's CPU over every token of the real run (warmup included).
    tokens = (REAL.warmup + REAL.repeats * REAL.prompts_per_concurrency) * REAL.output_len
    real_us_per_token = cpu["cpu_s"] / tokens * 1e6
    in_situ = real_tok_s * real_us_per_token / 1e6  # the fraction of one core the client needs at that rate
    benchmark.extra_info.update(
        transformers=version,
        real_tok_s=real_tok_s,
        client_max_tok_s=fake_tok_s,
        ratio=ratio,
        client_us_per_token_real=real_us_per_token,
        client_us_per_token_fake=fake_info["client_us_per_token"],
        in_situ_headroom=1 / in_situ,
        load=_load(),
    )
    verdict = "ok" if ratio >= 10 else "BELOW the 10x target"
    print(
        f"\ntransformers {version} continuous batching, c={CONCURRENCY} x {REAL.output_len} tokens: "
        f"{real_tok_s:,.0f} tok/s; client max vs fake: {fake_tok_s:,.0f} tok/s; "
        f"headroom {ratio:.1f}x ({verdict}). Client CPU per token: {real_us_per_token:.0f} us against the real "
        f"server, {fake_info['client_us_per_token']:.0f} us against the fake; in situ the client needs "
        f"{in_situ:.0%} of a core (headroom {1 / in_situ:.1f}x). {_load()}"
    )
