"""A client in the style of sglang's ``bench_serving`` (aiohttp; the request loop of its OpenAI chat backend): a
second reference for ``test_client_headroom.py``, used only where aiohttp is installed (it is not a dependency).

What it reproduces of bench_serving: one ``aiohttp.ClientSession`` per request, ``async for`` over the
response's lines, ``json.loads`` of every event, content from ``choices[0].delta.content``, completion tokens
from ``usage``. Written for this comparison, not copied.
"""

import asyncio
import itertools
import json
import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from servematrix.stages.bench_worker import RequestResult

TIMEOUT = aiohttp.ClientTimeout(total=6 * 60 * 60)


async def request(url: str, body: dict[str, Any]) -> RequestResult:
    times: list[float] = []
    tokens = None
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session, session.post(url, json=body) as resp:
        if resp.status != 200:
            return RequestResult(ok=False, error=f"http_{resp.status}")
        async for raw in resp.content:
            line = raw.strip()
            if not line:
                continue
            chunk = line.decode().removeprefix("data: ")
            if chunk == "[DONE]":
                continue
            data = json.loads(chunk)
            choices = data.get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                times.append(time.perf_counter())
            tokens = (data.get("usage") or {}).get("completion_tokens", tokens)
    t_end = time.perf_counter()
    return RequestResult(
        ok=tokens is not None,
        ttft_s=times[0] - t0 if times else None,
        itl_s=[b - a for a, b in itertools.pairwise(times)],
        e2e_s=t_end - t0,
        completion_tokens=tokens,
    )


async def run_batch(
    url: str, bodies: Sequence[dict[str, Any]], concurrency: int
) -> tuple[list[RequestResult], float, float]:
    """Send ``bodies`` with at most ``concurrency`` in flight: results, wall seconds, CPU seconds of this thread."""
    sem = asyncio.Semaphore(concurrency)

    async def one(body: dict[str, Any]) -> RequestResult:
        async with sem:
            return await request(url, body)

    cpu0, t0 = time.thread_time(), time.perf_counter()
    results = await asyncio.gather(*(one(b) for b in bodies))
    return list(results), time.perf_counter() - t0, time.thread_time() - cpu0
