"""Is the benchmark client fast enough not to be the bottleneck? A benchmark, not a timed assertion.

* ``test_client_max_tok_s_vs_fake``: the client's maximum output tokens/s against a trivial FAKE streaming
  server (a separate process, one token per SSE chunk, no delay).
* ``test_client_headroom_vs_real_cpu_server`` (integration, slow): the same, and the tok/s of a real
  `transformers serve` with continuous batching on the CPU, measured in the same run; prints the ratio
  (target >= 10x). Both numbers share the machine's cores with the client, as in a real CPU cell.

Run with ``-s`` to see the numbers; pytest-benchmark also records them in ``extra_info``.
"""

import os
import subprocess
import sys
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


def client_max_tok_s() -> tuple[float, dict]:
    with fake_server_process() as base:
        report = run_workload_sync(base, "fake", FAKE_LOAD)
    assert report.error_count == 0
    lv = report.levels[0]
    return lv.output_tok_s.median, {"min": lv.output_tok_s.min, "max": lv.output_tok_s.max}


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min), {os.cpu_count()} CPUs"


def test_client_max_tok_s_vs_fake(benchmark):
    tok_s, spread = benchmark.pedantic(client_max_tok_s, rounds=1, iterations=1)
    benchmark.extra_info.update(client_max_tok_s=tok_s, spread=spread, load=_load())
    print(f"\nclient max vs fake server, c={CONCURRENCY}: {tok_s:,.0f} tok/s (spread {spread}); {_load()}")
    assert tok_s > 0


@pytest.mark.integration
@pytest.mark.slow
def test_client_headroom_vs_real_cpu_server(benchmark):
    version = VERSIONS[-1]
    python = ensure_venv(version)
    model_dir = ensure_model(python)

    def measure() -> tuple[float, float]:
        with transformers_serve(python, model_dir, CB_FLAGS) as srv:
            real = run_workload_sync(srv.base_url, srv.model, REAL)
        assert real.error_count == 0
        fake_tok_s, _ = client_max_tok_s()
        return real.output_tok_s(CONCURRENCY), fake_tok_s

    real_tok_s, fake_tok_s = benchmark.pedantic(measure, rounds=1, iterations=1)
    ratio = fake_tok_s / real_tok_s
    benchmark.extra_info.update(
        transformers=version, real_tok_s=real_tok_s, client_max_tok_s=fake_tok_s, ratio=ratio, load=_load()
    )
    verdict = "ok" if ratio >= 10 else "BELOW the 10x target"
    print(
        f"\ntransformers {version} continuous batching, c={CONCURRENCY} x {REAL.output_len} tokens: "
        f"{real_tok_s:,.0f} tok/s; client max vs fake: {fake_tok_s:,.0f} tok/s; "
        f"headroom {ratio:.1f}x ({verdict}); {_load()}"
    )
