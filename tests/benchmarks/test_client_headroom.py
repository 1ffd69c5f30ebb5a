"""Is the benchmark client lean enough, and how far is its ceiling? Benchmarks that print ratios against a
baseline measured in the same run (the old one-process httpx client, frozen in ``httpx_reference_client.py``;
and, where aiohttp is installed, a client in the style of sglang's bench_serving). No timed assertions.

* ``test_client_cpu_per_batch``: the client's CPU seconds per batch of 16 requests at 16 streams x 64 tokens
  (the CPU smoke workload) against the fake server pacing tokens 2 ms apart, so that, as with a real server,
  events arrive a few per network read. The clients take turns, so drifting load hits them all.
* ``test_client_ceiling``: the best tok/s against the fake server with no per-token delay at 32 streams x 128
  tokens (the H200 workload), old client vs :func:`bench.measure_ceiling` with one worker process and with
  more where the host has the CPUs; server and client pinned to disjoint CPUs (:func:`bench.split_cpus`).
* ``test_client_headroom_vs_real_cpu_server`` (integration, slow): the new client against a real
  `transformers serve` on the CPU, its ceiling measured in the same run; prints the headroom (target >= 10x).

Run with ``-s`` to see the numbers; pytest-benchmark also records them in ``extra_info``. On a small shared
machine other processes change every number: the load average is printed with them. ``python
tests/benchmarks/test_client_headroom.py`` prints the first two without pytest-benchmark.
"""

import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

if __name__ == "__main__":  # run as a script: the repository's src and tests importable
    sys.path[:0] = [str(Path(__file__).resolve().parents[2] / "src"), str(Path(__file__).resolve().parents[2])]

from servematrix.stages import bench
from servematrix.stages.bench import Workload
from tests.benchmarks import httpx_reference_client as reference

try:
    from tests.benchmarks import aiohttp_reference_client as aiohttp_reference
except ImportError:  # aiohttp is not a dependency
    aiohttp_reference = None  # type: ignore[assignment]

PACED_DELAY_S = 0.002
FAKE_FLAGS = ("--usage", "separate_chunk", "--send-done", "--null-fields")  # sglang-shaped streams
SMOKE = dict(concurrency=16, input_len=32, output_len=64)  # matrix/cpu-smoke.toml
H200 = dict(concurrency=32, input_len=256, output_len=128)  # the H200 runs of issue 16


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min), {len(os.sched_getaffinity(0))} CPUs"


def _bodies(start: int, n: int, shape: dict) -> list[dict]:
    return [
        bench.request_body(
            "fake", bench.make_prompt(i, shape["input_len"]), api="chat", max_tokens=shape["output_len"], temperature=0
        )
        for i in range(start, start + n)
    ]


@contextlib.contextmanager
def _pinned(cpus: tuple[int, ...]) -> Iterator[None]:
    """This thread (the in-process reference clients run on it) pinned to ``cpus`` for the block."""
    before = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


# ---------------------------------------------------------------------------------------- CPU per batch


def cpu_per_batch(rounds: int = 2, batches: int = 6) -> dict[str, list[float]]:
    """CPU seconds per batch (16 requests, 16 streams, 64 tokens) of each client, against the paced fake."""
    c = SMOKE["concurrency"]
    cpu: dict[str, list[float]] = {"old httpx": [], "new": []}
    if aiohttp_reference is not None:
        cpu["aiohttp (bench_serving style)"] = []
    flags = ("--token-delay", str(PACED_DELAY_S), *FAKE_FLAGS)
    with bench.fake_server(extra=flags) as base, bench.ClientPool(1) as pool:
        url = bench.endpoint(base, "chat")
        index = 0

        def batch() -> list[dict]:
            nonlocal index
            index += c
            return _bodies(index - c, c, SMOKE)

        async def old_client() -> None:
            async with reference.make_client(c + 4) as client:
                for b in range(batches + 1):  # the first batch opens the connections: not counted
                    results, _, cpu_s = await reference.run_batch(client, url, batch(), c, "chat")
                    assert all(r.ok for r in results)
                    if b:
                        cpu["old httpx"].append(cpu_s)

        async def aiohttp_client() -> None:
            assert aiohttp_reference is not None
            for _ in range(batches):  # a session per request: nothing to warm
                results, _, cpu_s = await aiohttp_reference.run_batch(url, batch(), c)
                assert all(r.ok for r in results)
                cpu["aiohttp (bench_serving style)"].append(cpu_s)

        for _ in range(rounds):
            asyncio.run(old_client())
            if aiohttp_reference is not None:
                asyncio.run(aiohttp_client())
            for b in range(batches + 1):
                result = pool.run_batch(url, [json.dumps(x).encode() for x in batch()], c, api="chat", timeout_s=60)
                assert all(r.ok for r in result.results)
                if b:
                    cpu["new"].append(result.cpu_s)
    return cpu


def _cpu_lines(cpu: dict[str, list[float]]) -> list[str]:
    new = statistics.median(cpu["new"])
    lines = []
    for name, values in cpu.items():
        med = statistics.median(values)
        ratio = "" if name == "new" else f"; {med / new:.1f}x the new client's"
        lines.append(
            f"  {name}: {med:.4f} s CPU per batch (median of {len(values)}, {min(values):.4f}-{max(values):.4f}){ratio}"
        )
    return lines


def test_client_cpu_per_batch(benchmark):
    cpu = benchmark.pedantic(cpu_per_batch, rounds=1, iterations=1)
    benchmark.extra_info.update({k: statistics.median(v) for k, v in cpu.items()}, load=_load())
    print("\nclient CPU per batch of 16 requests, 16 streams x 64 tokens, fake pacing 2 ms/token:")
    print("\n".join(_cpu_lines(cpu)) + f"\n  {_load()}")
    assert all(v > 0 for values in cpu.values() for v in values)


# --------------------------------------------------------------------------------------------- ceilings


def old_client_ceiling(base: str, shape: dict, level_s: float = 1.0, repeats: int = 2) -> float:
    """The old client's best tok/s against the fake at ``base`` (warmup, then repeats of >= ``level_s``)."""
    c, url = shape["concurrency"], bench.endpoint(base, "chat")

    async def run() -> float:
        async with reference.make_client(c + 4) as client:
            results, wall, _ = await reference.run_batch(client, url, _bodies(0, c, shape), c, "chat")
            n, start, best = c, c, 0.0
            n = max(c, int(level_s * len(results) / wall * 1.5))
            for _ in range(repeats):
                results, wall, _ = await reference.run_batch(client, url, _bodies(start, n, shape), c, "chat")
                start += n
                assert all(r.ok for r in results)
                best = max(best, sum(r.completion_tokens or 0 for r in results) / wall)
            return best

    return asyncio.run(run())


def ceilings() -> dict[str, float]:
    """Old client vs new, each pinned to the client's CPUs with the fake on the rest."""
    cpus = len(os.sched_getaffinity(0))
    out: dict[str, float] = {}
    split = bench.split_cpus(1)
    client_cpus, server_cpus = (split.client, split.server) if split else ((), ())
    fake_processes = max(1, min(8, len(server_cpus)))
    with bench.fake_server(processes=fake_processes, cpus=server_cpus, extra=FAKE_FLAGS) as base, _pinned(client_cpus):
        out["old httpx, 1 process"] = old_client_ceiling(base, H200)
    shape = Workload(
        concurrency=(H200["concurrency"],),
        input_len=H200["input_len"],
        output_len=H200["output_len"],
        prompts_per_concurrency=H200["concurrency"],
        warmup=0,
        repeats=1,
    )
    processes = [1] + [p for p in (2, 4, 8) if p <= cpus // 2]
    for p in processes:
        split = bench.split_cpus(p)
        w = Workload(**{**shape.__dict__, "client_processes": p, "client_cpus": split.client if split else ()})
        server = split.server if split else ()
        ceiling = bench.measure_ceiling(w, server_cpus=server)
        level = ceiling.levels[0]
        out[f"new, {p} process(es)"] = level.tok_s
        out[f"new, {p} process(es): client busy"] = level.client_busy or 0.0
        out[f"new, {p} process(es): client CPU s per 1k tokens"] = level.cpu_s_per_1k_tokens or 0.0
    return out


def _ceiling_lines(out: dict[str, float]) -> list[str]:
    old = out["old httpx, 1 process"]
    lines = [f"  old httpx, 1 process: {old:,.0f} tok/s"]
    for name, value in out.items():
        if name.startswith("new") and ":" not in name:
            busy = out[f"{name}: client busy"]
            per_1k = out[f"{name}: client CPU s per 1k tokens"]
            lines.append(
                f"  {name}: {value:,.0f} tok/s ({value / old:.1f}x the old client's); client busy {busy:.0%}, "
                f"{per_1k * 1000:.2f} ms CPU per 1k tokens"
            )
    return lines


def test_client_ceiling(benchmark):
    out = benchmark.pedantic(ceilings, rounds=1, iterations=1)
    benchmark.extra_info.update(out, load=_load())
    print("\nclient ceiling against the fake server, 32 streams x 128 tokens, disjoint CPUs:")
    print("\n".join(_ceiling_lines(out)) + f"\n  {_load()}")
    assert all(v >= 0 for v in out.values())


# ---------------------------------------------------------------------------------------- real server


def cpu_per_batch_against(base: str, model: str, rounds: int = 3, batches: int = 2) -> dict[str, list[float]]:
    """CPU seconds per batch (16 requests, 16 streams, 64 tokens) of each client against the server at ``base``,
    the clients taking turns; the first batch of each turn (connections opening) is not counted."""
    c = SMOKE["concurrency"]
    cpu: dict[str, list[float]] = {"old httpx": [], "new": []}
    if aiohttp_reference is not None:
        cpu["aiohttp (bench_serving style)"] = []
    url = bench.endpoint(base, "chat")
    index = 0

    def batch() -> list[dict]:
        nonlocal index
        index += c
        return [
            bench.request_body(
                model, bench.make_prompt(i, SMOKE["input_len"]), api="chat", max_tokens=64, temperature=0
            )
            for i in range(index - c, index)
        ]

    async def old_client() -> None:
        async with reference.make_client(c + 4) as client:
            for b in range(batches + 1):
                results, _, cpu_s = await reference.run_batch(client, url, batch(), c, "chat")
                assert all(r.ok for r in results)
                if b:
                    cpu["old httpx"].append(cpu_s)

    async def aiohttp_client() -> None:
        assert aiohttp_reference is not None
        for _ in range(batches):
            results, _, cpu_s = await aiohttp_reference.run_batch(url, batch(), c)
            assert all(r.ok for r in results)
            cpu["aiohttp (bench_serving style)"].append(cpu_s)

    with bench.ClientPool(1) as pool:
        for _ in range(rounds):
            asyncio.run(old_client())
            if aiohttp_reference is not None:
                asyncio.run(aiohttp_client())
            for b in range(batches + 1):
                result = pool.run_batch(url, [json.dumps(x).encode() for x in batch()], c, api="chat", timeout_s=300)
                assert all(r.ok for r in result.results)
                if b:
                    cpu["new"].append(result.cpu_s)
    return cpu


@pytest.mark.integration
@pytest.mark.slow
def test_client_headroom_vs_real_cpu_server(benchmark):
    from tests.integration.test_tinymodel_and_bench import (
        CB_FLAGS,
        VERSIONS,
        ensure_model,
        ensure_venv,
        transformers_serve,
    )

    version = VERSIONS[-1]
    python = ensure_venv(version)
    model_dir = ensure_model(python)
    real_load = Workload(
        concurrency=(SMOKE["concurrency"],),
        input_len=SMOKE["input_len"],
        output_len=SMOKE["output_len"],
        prompts_per_concurrency=32,
        warmup=2,
        repeats=3,
    )

    def measure() -> tuple[bench.BenchReport, dict[str, list[float]]]:
        ceiling = bench.measure_ceiling(real_load)  # before the server starts: nothing else competes
        with transformers_serve(python, model_dir, CB_FLAGS) as srv:
            report = bench.run_workload_sync(srv.base_url, srv.model, real_load, ceiling=ceiling)
            cpu = cpu_per_batch_against(srv.base_url, srv.model)
        assert report.error_count == 0
        return report, cpu

    report, cpu = benchmark.pedantic(measure, rounds=1, iterations=1)
    real = report.levels[0]
    benchmark.extra_info.update(
        {k: statistics.median(v) for k, v in cpu.items()},
        transformers=version,
        real_tok_s=real.output_tok_s.median,
        client_ceiling_tok_s=real.client_ceiling_tok_s,
        headroom=real.client_headroom,
        client_busy=real.client_busy,
        load=_load(),
    )
    verdict = "ok" if (real.client_headroom or 0) >= 10 else "BELOW the 10x target"
    print(
        f"\ntransformers {version} continuous batching, 16 streams x 64 tokens: {real.output_tok_s.median:,.0f} tok/s "
        f"(repeats {real.output_tok_s.min:,.0f}-{real.output_tok_s.max:,.0f}); client ceiling "
        f"{real.client_ceiling_tok_s:,.0f} tok/s: headroom {real.client_headroom:.1f}x ({verdict}); client busy "
        f"{real.client_busy:.0%}, client_bound {real.client_bound}.\nclient CPU per batch of 16 requests against it:"
    )
    print("\n".join(_cpu_lines(cpu)) + f"\n  {_load()}")


if __name__ == "__main__":
    t0 = time.perf_counter()
    print("client CPU per batch of 16 requests, 16 streams x 64 tokens, fake pacing 2 ms/token:")
    print("\n".join(_cpu_lines(cpu_per_batch())), flush=True)
    print("client ceiling against the fake server, 32 streams x 128 tokens, disjoint CPUs:")
    print("\n".join(_ceiling_lines(ceilings())))
    print(f"  {_load()}; {time.perf_counter() - t0:.0f} s")
