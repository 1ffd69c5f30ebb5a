"""One short request before the benchmark: a server that cannot answer it fails `smoke`, not the bench."""

import asyncio
import json
from dataclasses import dataclass

from servematrix.stages.bench.workload import APIS, endpoint, request_body
from servematrix.stages.bench_worker import (
    Stream,
    Target,
)

SMOKE_PROMPT = "Write one short sentence about the river and the mill."
SMOKE_MAX_TOKENS = 16


@dataclass(frozen=True)
class SmokeResult:
    ok: bool
    text: str
    reason: str


async def smoke_check(base_url: str, model: str, *, api: str = "chat", timeout_s: float = 120.0) -> SmokeResult:
    """A fixed prompt at temperature 0, sent twice in sequence: ok if both texts are non-empty and identical."""
    if api not in APIS:
        raise ValueError(f"api must be one of {APIS}, got {api!r}")
    body = request_body(model, SMOKE_PROMPT, api=api, max_tokens=SMOKE_MAX_TOKENS, temperature=0.0)
    stream = Stream(Target.of(endpoint(base_url, api)))
    texts = []
    try:
        for attempt in (1, 2):
            r = await stream.request(json.dumps(body).encode(), api=api, timeout_s=timeout_s, keep_text=True)
            if not r.ok:
                return SmokeResult(False, r.text, f"request {attempt} failed: {r.error}: {r.error_detail}")
            if not r.text:
                return SmokeResult(False, "", f"request {attempt} returned no text ({r.completion_tokens} tokens)")
            texts.append(r.text)
    finally:
        stream.close()
    if texts[0] != texts[1]:
        return SmokeResult(False, texts[0], f"temperature 0 is not deterministic: {texts[0]!r} != {texts[1]!r}")
    return SmokeResult(True, texts[0], "two identical non-empty completions at temperature 0")


def smoke_check_sync(base_url: str, model: str, *, api: str = "chat", timeout_s: float = 120.0) -> SmokeResult:
    # A plain loop, not asyncio.run: asyncio.run turns SIGINT into a cancellation, which the request code
    # records as a failed request, and the harness's KeyboardInterrupt (exit 130) would be lost.
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(smoke_check(base_url, model, api=api, timeout_s=timeout_s))
    finally:
        loop.close()
