"""The benchmark client's hot path as it was before the lean rewrite (httpx, one process): the baseline that
``test_client_headroom.py`` measures the new client against, in the same run. Frozen: do not improve it.

Copied from ``servematrix.stages.bench`` at commit 85978c7 (``stream_request``, ``_client``, ``_run_batch``),
returning the same :class:`RequestResult`.
"""

import asyncio
import itertools
import json
import time
from collections.abc import Sequence
from typing import Any

import httpx

from servematrix.stages.bench_worker import RequestResult


def _chunk_text(choice: dict[str, Any], api: str) -> str | None:
    if api == "chat":
        delta = choice.get("delta") or {}
        return delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
    return choice.get("text")


async def stream_request(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], *, api: str, timeout_s: float
) -> RequestResult:
    content_times: list[float] = []
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    t0 = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", url, json=body) as resp:
                if resp.status_code != 200:
                    detail = (await resp.aread()).decode("utf-8", "replace")[:300]
                    return RequestResult(ok=False, error=f"http_{resp.status_code}", error_detail=detail)
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    now = time.perf_counter()
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    obj = json.loads(data)
                    if obj.get("error"):
                        return RequestResult(ok=False, error="stream_error", error_detail=str(obj["error"])[:300])
                    for choice in obj.get("choices") or ():
                        if _chunk_text(choice, api):
                            content_times.append(now)
                        if choice.get("finish_reason"):
                            finish_reason = choice["finish_reason"]
                    if obj.get("usage"):
                        usage = obj["usage"]
    except TimeoutError:
        return RequestResult(ok=False, error="timeout")
    except (httpx.HTTPError, OSError) as exc:
        return RequestResult(ok=False, error="transport", error_detail=str(exc)[:300])
    t_end = time.perf_counter()
    ttft = content_times[0] - t0 if content_times else None
    itl = [b - a for a, b in itertools.pairwise(content_times)]
    result = RequestResult(ok=True, ttft_s=ttft, itl_s=itl, e2e_s=t_end - t0, finish_reason=finish_reason)
    if usage is None or not isinstance(usage.get("completion_tokens"), int):
        result.ok, result.error = False, "missing_usage"
    else:
        result.completion_tokens = usage["completion_tokens"]
        result.prompt_tokens = usage.get("prompt_tokens")
    return result


def make_client(max_connections: int, timeout_s: float = 300.0) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    timeout = httpx.Timeout(timeout_s, connect=min(30.0, timeout_s))
    return httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False)


async def run_batch(
    client: httpx.AsyncClient, url: str, bodies: Sequence[dict[str, Any]], concurrency: int, api: str
) -> tuple[list[RequestResult], float, float]:
    """Send ``bodies`` with at most ``concurrency`` in flight: results, wall seconds, CPU seconds of this thread
    (the whole client: it runs on this event loop)."""
    results: list[RequestResult | None] = [None] * len(bodies)
    next_index = iter(range(len(bodies)))

    async def worker() -> None:
        for i in next_index:
            results[i] = await stream_request(client, url, bodies[i], api=api, timeout_s=300.0)

    cpu0, t0 = time.thread_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(bodies)))))
    wall, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
    return [r for r in results if r is not None], wall, cpu
