"""The ONE benchmark client used for every cell: async httpx, OpenAI-compatible streaming, usage-counted tokens.

It runs in the harness (never inside a cell's environment), so every engine and version is measured by the same
code. Known faults of benchmark clients, and what this one does about them:

* The client becomes the bottleneck. One shared ``httpx.AsyncClient`` whose connection pool is at least the
  concurrency; per chunk, only a timestamp and one small ``json.loads``. Text is joined once per request. The
  headroom against a trivial fake server is measured in ``tests/benchmarks/test_client_headroom.py``.
* Read buffers. aiohttp's default 64 KB line limit (``StreamReader`` high-water mark) truncates or throttles
  long SSE lines at long contexts (a known vLLM benchmark issue). httpx reads whole network chunks and splits
  lines itself, with no such limit.
* Re-tokenized output counts drift from what the server generated. Completion tokens come ONLY from the
  server's ``usage.completion_tokens``; a stream without usage is an error (``missing_usage``), never guessed.

Usage placement differs by server and is handled the same way: transformers puts ``usage`` on the final chunk
(the one carrying ``finish_reason``) and sends no ``data: [DONE]``; sglang and vLLM send a separate last chunk
with ``choices: []`` and ``usage``, then ``data: [DONE]``.
"""

import asyncio
import itertools
import json
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

APIS = ("chat", "completions")
SMOKE_PROMPT = "Write one short sentence about the river and the mill."
SMOKE_MAX_TOKENS = 16
MAX_ERROR_SAMPLES = 5

# Common English words that are single tokens (with their leading space) in typical BPE vocabularies, so a
# prompt of N words is roughly N tokens. The server's usage.prompt_tokens reports the real count.
_PROMPT_TEXT = (
    "time year people way day man thing woman life child world school state family student group country "
    "problem hand part place case week company system program question work number night point home water "
    "room mother area money story fact month right study book eye job word business issue side kind head "
    "house service friend father power hour game line end member law car city name team minute idea body "
    "back parent face level office door health person art war history party result change morning reason "
    "girl moment air teacher force education foot boy age policy music market sense plan college interest "
    "death experience effect class control care field role effort rate heart show leader light voice wife "
    "mind price report son view town road arm value building action model season society tax player record "
    "paper space ground form event matter center couple site project star table need court oil cost street "
    "image phone data picture piece land product doctor wall worker news test movie north love support tree "
    "source river sea fish boat bread stone cloud wind gold map dog good new first last long great little "
    "own other old big high small large next early young few public bad same able late hard major better "
    "strong free true full special easy clear certain open red short single past fine common poor hot cold "
    "happy simple left blue dark green nice quick slow warm"
)
_PROMPT_WORDS = tuple(_PROMPT_TEXT.split())


# ----------------------------------------------------------------------------------------------- workload


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What to send. Per concurrency level ``c``: ``warmup`` uncounted requests (at most ``c`` in flight),
    then ``repeats`` times ``prompts_per_concurrency`` measured requests with at most ``c`` in flight.

    ``prompts_per_concurrency`` is the absolute number of measured requests per level and repeat (not a
    multiplier); use at least ``c`` of them, or the level never reaches ``c`` streams in flight.

    ``ignore_eos`` sends sglang/vLLM's ``ignore_eos`` extra field. It is opt-in: ``transformers serve``
    validates request fields and answers 422 ``Unexpected fields in the request: {'ignore_eos'}``.
    """

    concurrency: tuple[int, ...]
    input_len: int
    output_len: int
    prompts_per_concurrency: int
    warmup: int
    repeats: int
    temperature: float = 0.0
    api: str = "chat"
    timeout_s: float = 300.0
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ValueError(f"concurrency must be a non-empty tuple of ints >= 1, got {self.concurrency!r}")
        if self.api not in APIS:
            raise ValueError(f"api must be one of {APIS}, got {self.api!r}")
        for name in ("input_len", "output_len", "prompts_per_concurrency", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.warmup < 0 or self.timeout_s <= 0 or self.temperature < 0:
            raise ValueError("warmup must be >= 0, timeout_s > 0, temperature >= 0")


def make_prompt(index: int, input_len: int) -> str:
    """A deterministic synthetic prompt of roughly ``input_len`` tokens, distinct per ``index``.

    The distinct part comes first, so no two prompts share a prefix beyond the chat template (no prefix-cache
    hits between requests).
    """
    rng = random.Random(index * 1_000_003 + input_len)
    head = f"Request {index}:"
    n_words = max(1, input_len - 4)
    return head + " " + " ".join(rng.choice(_PROMPT_WORDS) for _ in range(n_words))


def request_body(
    model: str, prompt: str, *, api: str, max_tokens: int, temperature: float, ignore_eos: bool = False
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def endpoint(base_url: str, api: str) -> str:
    return base_url.rstrip("/") + ("/v1/chat/completions" if api == "chat" else "/v1/completions")


# ----------------------------------------------------------------------------------------- one request


@dataclass
class RequestResult:
    ok: bool
    error: str | None = None  # an error kind: http_<code>, timeout, connect, missing_usage, ...
    error_detail: str = ""
    ttft_s: float | None = None  # time to the first chunk with content
    itl_s: list[float] = field(default_factory=list)  # gaps between consecutive content chunks
    e2e_s: float | None = None
    completion_tokens: int | None = None  # from the server's usage only
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    text: str = ""


def _chunk_text(choice: dict[str, Any], api: str) -> str | None:
    if api == "chat":
        delta = choice.get("delta") or {}
        # Reasoning models behind a reasoning parser (sglang, vLLM) stream their thinking tokens in a separate
        # field; they are generated tokens all the same, so they count for TTFT and ITL.
        return delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
    return choice.get("text")


async def stream_request(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    *,
    api: str,
    timeout_s: float,
    keep_text: bool = False,
) -> RequestResult:
    """Send one streaming request and time it. Never raises for server or network faults."""
    content_times: list[float] = []
    parts: list[str] = []
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
                        continue  # blank separators, ": keep-alive" comments, event: lines
                    now = time.perf_counter()
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    obj = json.loads(data)
                    if obj.get("error"):
                        return RequestResult(ok=False, error="stream_error", error_detail=str(obj["error"])[:300])
                    for choice in obj.get("choices") or ():
                        text = _chunk_text(choice, api)
                        if text:
                            content_times.append(now)
                            parts.append(text)
                        if choice.get("finish_reason"):
                            finish_reason = choice["finish_reason"]
                    if obj.get("usage"):
                        usage = obj["usage"]
    except TimeoutError:
        return RequestResult(ok=False, error="timeout", error_detail=f"no completion within {timeout_s} s")
    except httpx.ConnectError as exc:
        return RequestResult(ok=False, error="connect", error_detail=str(exc)[:300])
    except httpx.TimeoutException as exc:
        return RequestResult(ok=False, error="timeout", error_detail=f"{type(exc).__name__}: {exc}"[:300])
    except (httpx.HTTPError, OSError) as exc:
        return RequestResult(ok=False, error="transport", error_detail=f"{type(exc).__name__}: {exc}"[:300])
    except (ValueError, AttributeError, TypeError) as exc:  # bad JSON or a chunk of the wrong shape
        return RequestResult(ok=False, error="protocol", error_detail=f"{type(exc).__name__}: {exc}"[:300])
    t_end = time.perf_counter()

    text = "".join(parts) if keep_text else ""
    ttft = content_times[0] - t0 if content_times else None
    itl = [b - a for a, b in itertools.pairwise(content_times)]
    result = RequestResult(ok=True, ttft_s=ttft, itl_s=itl, e2e_s=t_end - t0, finish_reason=finish_reason, text=text)
    if usage is None or not isinstance(usage.get("completion_tokens"), int):
        result.ok = False
        result.error = "missing_usage"
        result.error_detail = "stream ended without usage.completion_tokens"
    else:
        result.completion_tokens = usage["completion_tokens"]
        result.prompt_tokens = usage.get("prompt_tokens")
    return result


# ------------------------------------------------------------------------------------------------ stats


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True)
class LatencyStats:
    """Seconds. ``count`` is the number of samples (requests, or gaps for ITL)."""

    count: int
    mean: float | None
    p50: float | None
    p99: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> "LatencyStats":
        if not values:
            return cls(0, None, None, None)
        return cls(len(values), statistics.fmean(values), percentile(values, 50), percentile(values, 99))


@dataclass(frozen=True)
class LevelRun:
    """One repeat of one concurrency level."""

    concurrency: int
    repeat: int
    num_requests: int
    completed: int
    error_count: int
    errors: dict[str, int]
    error_samples: list[str]
    wall_s: float
    completion_tokens: int  # sum of usage.completion_tokens over completed requests
    prompt_tokens: int
    output_tok_s: float
    request_s: float
    ttft: LatencyStats
    itl: LatencyStats
    e2e: LatencyStats

    @classmethod
    def aggregate(cls, concurrency: int, repeat: int, results: Sequence[RequestResult], wall_s: float) -> "LevelRun":
        ok = [r for r in results if r.ok]
        bad = [r for r in results if not r.ok]
        completion = sum(r.completion_tokens or 0 for r in ok)
        samples = [f"{r.error}: {r.error_detail}" for r in bad[:MAX_ERROR_SAMPLES]]
        return cls(
            concurrency=concurrency,
            repeat=repeat,
            num_requests=len(results),
            completed=len(ok),
            error_count=len(bad),
            errors=dict(Counter(r.error or "unknown" for r in bad)),
            error_samples=samples,
            wall_s=wall_s,
            completion_tokens=completion,
            prompt_tokens=sum(r.prompt_tokens or 0 for r in ok),
            output_tok_s=completion / wall_s if wall_s > 0 else 0.0,
            request_s=len(ok) / wall_s if wall_s > 0 else 0.0,
            ttft=LatencyStats.of([r.ttft_s for r in ok if r.ttft_s is not None]),
            itl=LatencyStats.of([gap for r in ok for gap in r.itl_s]),
            e2e=LatencyStats.of([r.e2e_s for r in ok if r.e2e_s is not None]),
        )


@dataclass(frozen=True)
class Spread:
    min: float
    median: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> "Spread":
        return cls(min(values), statistics.median(values), max(values))


@dataclass(frozen=True)
class LevelSummary:
    """All repeats of one concurrency level."""

    concurrency: int
    runs: list[LevelRun]
    warmup_requests: int
    warmup_errors: dict[str, int]
    output_tok_s: Spread
    request_s: Spread
    error_count: int
    completion_tokens: int


@dataclass(frozen=True)
class BenchReport:
    base_url: str
    model: str
    workload: Workload
    levels: list[LevelSummary]
    started_at: float  # Unix time
    duration_s: float
    client: dict[str, str]

    def level(self, concurrency: int) -> LevelSummary | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)

    def output_tok_s(self, concurrency: int) -> float | None:
        """Median output tokens/s across repeats at ``concurrency``, or None if that level was not run."""
        lv = self.level(concurrency)
        return lv.output_tok_s.median if lv else None

    @property
    def error_count(self) -> int:
        return sum(lv.error_count for lv in self.levels)

    @property
    def completion_tokens(self) -> int:
        return sum(lv.completion_tokens for lv in self.levels)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["workload"]["concurrency"] = list(self.workload.concurrency)
        d["error_count"] = self.error_count
        d["completion_tokens"] = self.completion_tokens
        return d


# ------------------------------------------------------------------------------------------------- run


def _client(max_connections: int, timeout_s: float) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    timeout = httpx.Timeout(timeout_s, connect=min(30.0, timeout_s))
    # trust_env=False: a benchmark of a local server must never go through an HTTP proxy from the environment.
    return httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False)


async def _run_batch(
    client: httpx.AsyncClient,
    url: str,
    bodies: Sequence[dict[str, Any]],
    concurrency: int,
    workload: Workload,
) -> tuple[list[RequestResult], float]:
    """Send ``bodies`` with at most ``concurrency`` in flight. Returns results (in order) and the wall time."""
    results: list[RequestResult | None] = [None] * len(bodies)
    next_index = iter(range(len(bodies)))

    async def worker() -> None:
        for i in next_index:  # a shared iterator: each index is taken by exactly one worker
            results[i] = await stream_request(client, url, bodies[i], api=workload.api, timeout_s=workload.timeout_s)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(bodies)))))
    wall = time.perf_counter() - t0
    return [r for r in results if r is not None], wall


async def run_workload(
    base_url: str,
    model: str,
    workload: Workload,
    *,
    progress: Callable[[str], None] | None = None,
) -> BenchReport:
    """Run every concurrency level of ``workload`` against an OpenAI-compatible server at ``base_url``.

    ``model`` is sent as the request's ``model`` field (for ``transformers serve``: exactly the model argument
    it was started with). Server and network faults are counted as errors, never raised.
    """
    say = progress or (lambda _msg: None)
    url = endpoint(base_url, workload.api)
    started_at = time.time()
    t_start = time.perf_counter()
    prompt_index = 0

    def bodies(n: int) -> list[dict[str, Any]]:
        nonlocal prompt_index
        out = []
        for _ in range(n):
            out.append(
                request_body(
                    model,
                    make_prompt(prompt_index, workload.input_len),
                    api=workload.api,
                    max_tokens=workload.output_len,
                    temperature=workload.temperature,
                    ignore_eos=workload.ignore_eos,
                )
            )
            prompt_index += 1
        return out

    levels: list[LevelSummary] = []
    async with _client(max(workload.concurrency) + 4, workload.timeout_s) as client:
        for c in workload.concurrency:
            if workload.prompts_per_concurrency < c:
                say(f"c={c}: only {workload.prompts_per_concurrency} requests, fewer than the concurrency")
            warm_results: list[RequestResult] = []
            if workload.warmup:
                warm_results, _ = await _run_batch(client, url, bodies(workload.warmup), c, workload)
                warm_err = sum(not r.ok for r in warm_results)
                say(f"c={c}: warmup {workload.warmup} requests, {warm_err} errors")
            runs = []
            for rep in range(workload.repeats):
                results, wall = await _run_batch(client, url, bodies(workload.prompts_per_concurrency), c, workload)
                run = LevelRun.aggregate(c, rep, results, wall)
                runs.append(run)
                say(
                    f"c={c} repeat {rep + 1}/{workload.repeats}: {run.output_tok_s:.1f} tok/s, "
                    f"{run.request_s:.2f} req/s, {run.completion_tokens} tokens, {run.error_count} errors"
                )
            levels.append(
                LevelSummary(
                    concurrency=c,
                    runs=runs,
                    warmup_requests=len(warm_results),
                    warmup_errors=dict(Counter(r.error or "unknown" for r in warm_results if not r.ok)),
                    output_tok_s=Spread.of([r.output_tok_s for r in runs]),
                    request_s=Spread.of([r.request_s for r in runs]),
                    error_count=sum(r.error_count for r in runs),
                    completion_tokens=sum(r.completion_tokens for r in runs),
                )
            )
    return BenchReport(
        base_url=base_url,
        model=model,
        workload=workload,
        levels=levels,
        started_at=started_at,
        duration_s=time.perf_counter() - t_start,
        client={"name": "servematrix.stages.bench", "httpx": httpx.__version__},
    )


def run_workload_sync(
    base_url: str,
    model: str,
    workload: Workload,
    *,
    progress: Callable[[str], None] | None = None,
) -> BenchReport:
    """:func:`run_workload` for synchronous callers (must not be called from a running event loop)."""
    return asyncio.run(run_workload(base_url, model, workload, progress=progress))


# ----------------------------------------------------------------------------------------------- smoke


@dataclass(frozen=True)
class SmokeResult:
    ok: bool
    text: str
    reason: str


async def smoke_check(base_url: str, model: str, *, api: str = "chat", timeout_s: float = 120.0) -> SmokeResult:
    """A fixed prompt at temperature 0, sent twice in sequence: ok if both texts are non-empty and identical."""
    if api not in APIS:
        raise ValueError(f"api must be one of {APIS}, got {api!r}")
    url = endpoint(base_url, api)
    body = request_body(model, SMOKE_PROMPT, api=api, max_tokens=SMOKE_MAX_TOKENS, temperature=0.0)
    texts = []
    async with _client(2, timeout_s) as client:
        for attempt in (1, 2):
            r = await stream_request(client, url, body, api=api, timeout_s=timeout_s, keep_text=True)
            if not r.ok:
                return SmokeResult(False, r.text, f"request {attempt} failed: {r.error}: {r.error_detail}")
            if not r.text:
                return SmokeResult(False, "", f"request {attempt} returned no text ({r.completion_tokens} tokens)")
            texts.append(r.text)
    if texts[0] != texts[1]:
        return SmokeResult(False, texts[0], f"temperature 0 is not deterministic: {texts[0]!r} != {texts[1]!r}")
    return SmokeResult(True, texts[0], "two identical non-empty completions at temperature 0")


def smoke_check_sync(base_url: str, model: str, *, api: str = "chat", timeout_s: float = 120.0) -> SmokeResult:
    return asyncio.run(smoke_check(base_url, model, api=api, timeout_s=timeout_s))
