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

Comparing two modes: :func:`speedup` gives the ratio of medians and its range from the repeats' spread, and
calls it inconclusive when the range includes 1.0.
"""

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import pickle
import random
import signal
import site
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import servematrix
from servematrix.stages.bench_worker import (
    BatchSpec,
    RequestResult,
    Stream,
    Target,
    format_cpus,
    read_message,
    write_message,
)

__all__ = [
    "BenchReport",
    "Ceiling",
    "CeilingLevel",
    "ClientPool",
    "CpuSplit",
    "LatencyStats",
    "LevelRun",
    "LevelSummary",
    "RequestResult",
    "SmokeResult",
    "Speedup",
    "Spread",
    "Workload",
    "make_prompt",
    "measure_ceiling",
    "percentile",
    "request_body",
    "run_workload",
    "run_workload_sync",
    "smoke_check",
    "smoke_check_sync",
    "speedup",
    "split_cpus",
]

APIS = ("chat", "completions")
SMOKE_PROMPT = "Write one short sentence about the river and the mill."
SMOKE_MAX_TOKENS = 16
MAX_ERROR_SAMPLES = 5
# A level is flagged client_bound when its best repeat reaches this fraction of the client's ceiling (under 3x
# headroom, the client's own cost and jitter show in the figure), or when the client's processes were busy this
# fraction of the time or more while it ran. The second rule is the one that counts with a real server: events
# then arrive one or a few per network read, which costs the client several times more CPU per token than the
# bursts of the fake server at full speed (measured: 40 us vs 5 us per token on a 2-core EPYC VM).
CLIENT_BOUND_FRACTION = 1 / 3
# Level sizing: requests for min_level_s at the measured rate, times this margin (rates drift between batches).
SIZE_MARGIN = 1.5
# At most this many short repeats are discarded per level before the floor is given up (floor_met: false).
MAX_RESIZES = 4

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
    then ``repeats`` times N measured requests with at most ``c`` in flight.

    N is ``prompts_per_concurrency`` (the floor in requests: an absolute number per level and repeat, not a
    multiplier; use at least ``c`` of them, or the level never reaches ``c`` streams in flight), raised when
    ``min_level_s`` > 0 so that each repeat lasts at least that long at the throughput measured in the warmup,
    up to ``max_level_requests``.

    ``ignore_eos`` sends sglang/vLLM's ``ignore_eos`` extra field. It is opt-in: ``transformers serve``
    validates request fields and answers 422 ``Unexpected fields in the request: {'ignore_eos'}``.

    ``client_processes`` worker processes share the streams of each level; ``client_cpus`` pins them (see
    :func:`split_cpus`).
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
    min_level_s: float = 0.0
    max_level_requests: int = 100_000
    client_processes: int = 1
    client_cpus: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ValueError(f"concurrency must be a non-empty tuple of ints >= 1, got {self.concurrency!r}")
        if self.api not in APIS:
            raise ValueError(f"api must be one of {APIS}, got {self.api!r}")
        for name in ("input_len", "output_len", "prompts_per_concurrency", "repeats", "client_processes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.warmup < 0 or self.timeout_s <= 0 or self.temperature < 0 or self.min_level_s < 0:
            raise ValueError("warmup must be >= 0, timeout_s > 0, temperature >= 0, min_level_s >= 0")
        if self.max_level_requests < self.prompts_per_concurrency:
            raise ValueError("max_level_requests must be >= prompts_per_concurrency")
        if any(c < 0 for c in self.client_cpus):
            raise ValueError(f"client_cpus must be CPU numbers >= 0, got {self.client_cpus!r}")

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], **given: Any) -> "Workload":
        """A workload from a matrix's validated `[bench]` table: every field of the same name, plus `given`
        (what the engine or the host decides: ignore_eos, client_cpus)."""
        names = {f.name for f in dataclasses.fields(cls)} - set(given)
        values = {name: value for name, value in settings.items() if name in names}
        values["concurrency"] = tuple(values["concurrency"])
        return cls(**values, **given)


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


class _Prompts:
    """Request bodies (JSON bytes) with prompts numbered across the whole run: no two requests share one."""

    def __init__(self, model: str, workload: Workload) -> None:
        self.model, self.workload, self.index = model, workload, 0

    def take(self, n: int) -> list[bytes]:
        w = self.workload
        out = []
        for i in range(self.index, self.index + n):
            body = request_body(
                self.model,
                make_prompt(i, w.input_len),
                api=w.api,
                max_tokens=w.output_len,
                temperature=w.temperature,
                ignore_eos=w.ignore_eos,
            )
            out.append(json.dumps(body).encode())
        self.index += n
        return out


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
    """One repeat of one concurrency level.

    ``client_cpu_s`` is the client's CPU time (user+sys, summed over its worker processes) during the repeat;
    ``client_busy`` that time over ``wall_s`` x ``client_processes``: near 1, the client's processes were
    saturated while the figure was measured.
    """

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
    client_cpu_s: float | None = None
    client_processes: int = 1
    client_busy: float | None = None

    @classmethod
    def aggregate(
        cls,
        concurrency: int,
        repeat: int,
        results: Sequence[RequestResult],
        wall_s: float,
        *,
        client_cpu_s: float | None = None,
        client_processes: int = 1,
    ) -> "LevelRun":
        ok = [r for r in results if r.ok]
        bad = [r for r in results if not r.ok]
        completion = sum(r.completion_tokens or 0 for r in ok)
        samples = [f"{r.error}: {r.error_detail}" for r in bad[:MAX_ERROR_SAMPLES]]
        busy = client_cpu_s / (wall_s * client_processes) if client_cpu_s is not None and wall_s > 0 else None
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
            client_cpu_s=client_cpu_s,
            client_processes=client_processes,
            client_busy=busy,
        )


@dataclass(frozen=True)
class Spread:
    min: float
    median: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> "Spread":
        return cls(min(values), statistics.median(values), max(values))


@dataclass(frozen=True, kw_only=True)
class CeilingLevel:
    """The client's ceiling at one concurrency: its best repeat against the fake server (no per-token delay)."""

    concurrency: int
    tok_s: float
    cpu_s_per_1k_tokens: float | None
    client_busy: float | None


@dataclass(frozen=True, kw_only=True)
class Ceiling:
    """What the client can do on this host, measured by :func:`measure_ceiling`."""

    levels: tuple[CeilingLevel, ...]
    client_processes: int
    client_cpus: tuple[int, ...]
    server_cpus: tuple[int, ...]  # where the fake server ran
    fake_processes: int
    api: str
    output_len: int
    measured_at: float  # Unix time

    def tok_s(self, concurrency: int) -> float | None:
        return next((lv.tok_s for lv in self.levels if lv.concurrency == concurrency), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LevelSummary:
    """All repeats of one concurrency level, and the client's figures beside them.

    ``client_ceiling_tok_s``: the client's ceiling at this concurrency (None if not measured);
    ``client_headroom``: that ceiling over the best repeat; ``client_busy``: the highest fraction of time the
    client's processes were busy in a repeat; ``client_bound``: the best repeat reached ``CLIENT_BOUND_FRACTION``
    of the ceiling, or ``client_busy`` reached it (None if neither was measured).
    """

    concurrency: int
    runs: list[LevelRun]
    warmup_requests: int
    warmup_errors: dict[str, int]
    output_tok_s: Spread
    request_s: Spread
    error_count: int
    completion_tokens: int
    calibration_requests: int = 0  # requests of repeats discarded for ending under min_level_s
    min_level_s: float = 0.0
    floor_met: bool = True
    wall_s: Spread | None = None
    client_cpu_s: Spread | None = None
    client_cpu_s_per_1k_tokens: float | None = None
    client_ceiling_tok_s: float | None = None
    client_headroom: float | None = None
    client_busy: float | None = None
    client_bound: bool | None = None

    @classmethod
    def of(
        cls,
        concurrency: int,
        runs: list[LevelRun],
        *,
        warmup: Sequence[RequestResult] = (),
        calibration_requests: int = 0,
        min_level_s: float = 0.0,
        ceiling: Ceiling | None = None,
    ) -> "LevelSummary":
        cpu = [r.client_cpu_s for r in runs if r.client_cpu_s is not None]
        tokens = sum(r.completion_tokens for r in runs)
        best = max(r.output_tok_s for r in runs)
        ceiling_tok_s = ceiling.tok_s(concurrency) if ceiling is not None else None
        busy = max((r.client_busy for r in runs if r.client_busy is not None), default=None)
        near_ceiling = None if ceiling_tok_s is None else best >= ceiling_tok_s * CLIENT_BOUND_FRACTION
        saturated = None if busy is None else busy >= CLIENT_BOUND_FRACTION
        return cls(
            concurrency=concurrency,
            runs=runs,
            warmup_requests=len(warmup),
            warmup_errors=dict(Counter(r.error or "unknown" for r in warmup if not r.ok)),
            output_tok_s=Spread.of([r.output_tok_s for r in runs]),
            request_s=Spread.of([r.request_s for r in runs]),
            error_count=sum(r.error_count for r in runs),
            completion_tokens=tokens,
            calibration_requests=calibration_requests,
            min_level_s=min_level_s,
            floor_met=all(r.wall_s >= min_level_s for r in runs),
            wall_s=Spread.of([r.wall_s for r in runs]),
            client_cpu_s=Spread.of(cpu) if cpu else None,
            client_cpu_s_per_1k_tokens=sum(cpu) / tokens * 1000 if cpu and tokens else None,
            client_ceiling_tok_s=ceiling_tok_s,
            client_headroom=ceiling_tok_s / best if ceiling_tok_s is not None and best > 0 else None,
            client_busy=busy,
            client_bound=None if near_ceiling is None and saturated is None else bool(near_ceiling or saturated),
        )


@dataclass(frozen=True)
class BenchReport:
    base_url: str
    model: str
    workload: Workload
    levels: list[LevelSummary]
    started_at: float  # Unix time
    duration_s: float
    client: dict[str, Any]
    client_ceiling: Ceiling | None = None

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

    @property
    def client_bound(self) -> bool:
        """True if any level came within reach of the client's ceiling."""
        return any(lv.client_bound for lv in self.levels)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["workload"]["concurrency"] = list(self.workload.concurrency)
        d["workload"]["client_cpus"] = list(self.workload.client_cpus)
        d["error_count"] = self.error_count
        d["completion_tokens"] = self.completion_tokens
        d["client_bound"] = self.client_bound
        return d


# ------------------------------------------------------------------------------------------ the workers


def _child_env() -> dict[str, str]:
    """The environment for a child that imports servematrix: this servematrix, whatever put it on sys.path."""
    env = dict(os.environ)
    root = Path(servematrix.__file__).resolve().parents[1]
    site_dirs = {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]}
    if root not in site_dirs:  # a source checkout: put it first (never a site-packages, which would shadow stdlib)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    return env


@dataclass(frozen=True)
class Batch:
    results: list[RequestResult]  # in the order of the bodies
    wall_s: float  # from the first worker's start to the last worker's end
    cpu_s: float  # user+sys of the workers that took part, summed, and of the thread that ran the batch
    processes: int  # the workers that took part


class ClientPool:
    """``processes`` worker processes (``python -m servematrix.stages.bench_worker``), pinned to ``cpus`` if any.

    A batch is split over the workers by streams (at most one worker per stream) and requests (in proportion).
    Each worker gets its share, answers ready, and all start on one "go"; connections stay open between batches.
    """

    def __init__(self, processes: int, cpus: Sequence[int] = ()) -> None:
        argv = [sys.executable, "-m", "servematrix.stages.bench_worker"]
        if cpus:
            argv += ["--cpus", format_cpus(cpus)]
        env = _child_env()
        self._stderr: list[IO[bytes]] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        try:
            for _ in range(processes):
                err = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
                self._stderr.append(err)
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env)
                self._procs.append(proc)
            for i in range(processes):  # each worker says hello once it runs (and is pinned, if asked)
                self._receive(i, "hello")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "ClientPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for proc in self._procs:
            with contextlib.suppress(OSError, ValueError):
                assert proc.stdin is not None
                write_message(proc.stdin, ("exit",))
                proc.stdin.close()
        for proc in self._procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        for err in self._stderr:
            err.close()
        self._procs, self._stderr = [], []

    def _stopped(self, i: int) -> RuntimeError:
        proc = self._procs[i]
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(1)
        err = self._stderr[i]
        err.seek(0)
        tail = err.read()[-2000:].decode("utf-8", "replace").strip()
        return RuntimeError(f"benchmark worker {proc.pid} stopped (exit {proc.poll()}): {tail or 'no output'}")

    def _send(self, i: int, message: Any) -> None:
        stdin = self._procs[i].stdin
        assert stdin is not None
        try:
            write_message(stdin, message)
        except OSError as exc:  # a broken pipe: the worker is gone
            raise self._stopped(i) from exc

    def _receive(self, i: int, expect: str) -> Any:
        stdout = self._procs[i].stdout
        assert stdout is not None
        msg = read_message(stdout)
        if msg is None or msg[0] != expect:
            raise self._stopped(i)
        return msg

    def run_batch(self, url: str, bodies: Sequence[bytes], concurrency: int, *, api: str, timeout_s: float) -> Batch:
        """Send ``bodies`` with at most ``concurrency`` in flight in all. Results come back in order."""
        k = min(len(self._procs), concurrency, len(bodies))
        if k == 0:
            return Batch([], 0.0, 0.0, 0)
        # This thread's own share of the work (pickling bodies and results) counts as client CPU too.
        parent_cpu0 = time.thread_time()
        streams = [concurrency // k + (i < concurrency % k) for i in range(k)]
        shares = [len(bodies) * s // concurrency for s in streams]
        for i in range(len(bodies) - sum(shares)):
            shares[i % k] += 1
        start = 0
        for i in range(k):
            spec = BatchSpec(url, list(bodies[start : start + shares[i]]), streams[i], api, timeout_s, _cell_deadline)
            start += shares[i]
            self._send(i, ("batch", spec))
        for i in range(k):
            self._receive(i, "ready")
        for i in range(k):  # the start barrier: every worker has its share ready before any starts
            self._send(i, ("go",))
        done = [self._receive(i, "done") for i in range(k)]
        results: list[RequestResult] = [r for msg in done for r in pickle.loads(msg[1])]
        wall = max(msg[3] for msg in done) - min(msg[2] for msg in done)
        cpu = sum(msg[4] for msg in done) + time.thread_time() - parent_cpu0
        return Batch(results, wall, cpu, k)


# The running cell's wall-clock budget (time.perf_counter), set by `cell_budget`: every batch carries it.
_cell_deadline: float | None = None


@contextlib.contextmanager
def cell_budget(seconds: float) -> Iterator[None]:
    """Within it, no request is sent, nor waited for, past `seconds` from now (the workers answer `budget`)."""
    global _cell_deadline
    _cell_deadline = time.perf_counter() + seconds
    try:
        yield
    finally:
        _cell_deadline = None


# ------------------------------------------------------------------------------------------------- run


def _size(workload: Workload, request_s: float | None, at_least: int) -> int:
    """Requests per repeat: enough for ``min_level_s`` at ``request_s`` (with a margin), within the bounds."""
    n = max(workload.prompts_per_concurrency, at_least)
    if workload.min_level_s > 0 and request_s:
        n = max(n, math.ceil(workload.min_level_s * request_s * SIZE_MARGIN))
    return min(n, workload.max_level_requests)


def _run_level(
    pool: ClientPool,
    url: str,
    prompts: _Prompts,
    c: int,
    workload: Workload,
    ceiling: Ceiling | None,
    say: Callable[[str], None],
) -> LevelSummary:
    w = workload

    def batch(n: int) -> Batch:
        return pool.run_batch(url, prompts.take(n), c, api=w.api, timeout_s=w.timeout_s)

    if w.prompts_per_concurrency < c:
        say(f"c={c}: only {w.prompts_per_concurrency} requests, fewer than the concurrency")
    warm: list[RequestResult] = []
    rate = None
    if w.warmup:
        wb = batch(w.warmup)
        warm = wb.results
        completed = sum(r.ok for r in warm)
        say(f"c={c}: warmup {w.warmup} requests, {len(warm) - completed} errors")
        if completed == len(warm) and wb.wall_s > 0:
            # A warmup with fewer requests than streams underestimates the level's rate: scale it up (erring
            # towards longer levels; a repeat that still ends short is redone).
            rate = completed / wb.wall_s * c / min(c, w.warmup)
    n = _size(w, rate, 0)
    runs: list[LevelRun] = []
    calibration = resizes = 0
    while len(runs) < w.repeats:
        b = batch(n)
        run = LevelRun.aggregate(c, len(runs), b.results, b.wall_s, client_cpu_s=b.cpu_s, client_processes=b.processes)
        short = run.wall_s < w.min_level_s
        if short and run.completed and run.error_count == 0 and n < w.max_level_requests and resizes < MAX_RESIZES:
            resizes += 1
            calibration += n
            n = _size(w, run.completed / run.wall_s, n + 1)
            say(f"c={c}: {run.wall_s:.2f} s, under the {w.min_level_s} s floor: discarded; {n} requests per repeat")
            continue
        runs.append(run)
        if w.min_level_s > 0 and run.completed and run.error_count == 0:
            n = _size(w, run.completed / run.wall_s, 0)  # the next repeat, sized at this one's rate (up or down)
        say(
            f"c={c} repeat {len(runs)}/{w.repeats}: {run.output_tok_s:.1f} tok/s, {run.request_s:.2f} req/s, "
            f"{run.completion_tokens} tokens, {run.error_count} errors, {run.wall_s:.2f} s, "
            f"client {run.client_cpu_s or 0:.2f} CPU s"
        )
    return LevelSummary.of(
        c,
        runs,
        warmup=warm,
        calibration_requests=calibration,
        min_level_s=w.min_level_s,
        ceiling=ceiling,
    )


def run_workload_sync(
    base_url: str,
    model: str,
    workload: Workload,
    *,
    progress: Callable[[str], None] | None = None,
    ceiling: Ceiling | None = None,
) -> BenchReport:
    """Run every concurrency level of ``workload`` against an OpenAI-compatible server at ``base_url``.

    ``model`` is sent as the request's ``model`` field (for ``transformers serve``: exactly the model argument
    it was started with). Server and network faults are counted as errors, never raised. ``ceiling`` (from
    :func:`measure_ceiling` on this host) is recorded beside every level and sets its ``client_bound`` flag.
    """
    say = progress or (lambda _msg: None)
    url = endpoint(base_url, workload.api)
    Target.of(url)  # a bad URL is the caller's mistake: raise before starting anything
    started_at = time.time()
    t_start = time.perf_counter()
    prompts = _Prompts(model, workload)
    with ClientPool(workload.client_processes, workload.client_cpus) as pool:
        levels = [_run_level(pool, url, prompts, c, workload, ceiling, say) for c in workload.concurrency]
    return BenchReport(
        base_url=base_url,
        model=model,
        workload=workload,
        levels=levels,
        started_at=started_at,
        duration_s=time.perf_counter() - t_start,
        client={
            "name": "servematrix.stages.bench",
            "transport": "asyncio HTTP/1.1 (servematrix.stages.bench_worker)",
            "processes": workload.client_processes,
            "cpus": format_cpus(workload.client_cpus) if workload.client_cpus else "any",
            "python": sys.version.split()[0],
        },
        client_ceiling=ceiling,
    )


async def run_workload(
    base_url: str,
    model: str,
    workload: Workload,
    *,
    progress: Callable[[str], None] | None = None,
    ceiling: Ceiling | None = None,
) -> BenchReport:
    """:func:`run_workload_sync` for async callers (the work happens in worker processes)."""
    return await asyncio.to_thread(run_workload_sync, base_url, model, workload, progress=progress, ceiling=ceiling)


# --------------------------------------------------------------------------------------------- ceiling


@contextlib.contextmanager
def fake_server(*, processes: int = 1, cpus: Sequence[int] = (), extra: Sequence[str] = ()) -> Iterator[str]:
    """The fake server (``servematrix.stages.bench_fake``) as its own process group; yields its base URL."""
    argv = [sys.executable, "-m", "servematrix.stages.bench_fake", "--port", "0", "--processes", str(processes)]
    if cpus:
        argv += ["--cpus", format_cpus(cpus)]
    proc = subprocess.Popen(
        [*argv, *extra], stdout=subprocess.PIPE, text=True, start_new_session=True, env=_child_env()
    )
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


# --------------------------------------------------------------------------------------------- speedup


@dataclass(frozen=True, kw_only=True)
class Speedup:
    """treatment/baseline output tok/s at one concurrency: the ratio of medians and its range.

    ``low``/``high`` with method "pairs": the smallest and largest ratio of any (treatment repeat, baseline
    repeat) pair; with "bootstrap": the 2.5th and 97.5th percentiles of the ratio of medians over resamples of
    the repeats (fixed seed). ``inconclusive``: the range includes 1.0, or a side has a single repeat (no spread
    to judge by).
    """

    concurrency: int
    ratio: float
    low: float
    high: float
    inconclusive: bool
    method: str
    baseline: Spread
    treatment: Spread
    baseline_repeats: int
    treatment_repeats: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        verdict = "inconclusive" if self.inconclusive else "conclusive"
        return f"{self.ratio:.3f}x ({self.low:.3f}-{self.high:.3f}, {verdict}) at {self.concurrency} streams"


ReportLike = BenchReport | Mapping[str, Any]


def _tok_s_values(reports: ReportLike | Sequence[ReportLike], concurrency: int) -> list[float]:
    """Every repeat's output tok/s at ``concurrency``, from one report or several (interleaved server starts)."""
    items: Iterable[ReportLike] = [reports] if isinstance(reports, BenchReport | Mapping) else reports
    values: list[float] = []
    for item in items:
        levels = item.to_dict()["levels"] if isinstance(item, BenchReport) else item.get("levels", [])
        for lv in levels:
            if lv.get("concurrency") == concurrency:
                values += [float(r["output_tok_s"]) for r in lv.get("runs", []) if r.get("output_tok_s", 0) > 0]
    return values


def speedup(
    baseline: ReportLike | Sequence[ReportLike],
    treatment: ReportLike | Sequence[ReportLike],
    concurrency: int,
    *,
    method: str = "pairs",
    resamples: int = 2000,
    seed: int = 0,
) -> Speedup:
    """Speedup of ``treatment`` over ``baseline`` at ``concurrency``. Each side is a :class:`BenchReport`, its
    ``to_dict()`` (as stored), or a list of them (one per server start): their repeats are pooled."""
    base, treat = _tok_s_values(baseline, concurrency), _tok_s_values(treatment, concurrency)
    for name, values in (("baseline", base), ("treatment", treat)):
        if not values:
            raise ValueError(f"speedup: the {name} has no repeat with output at {concurrency} streams")
    ratio = statistics.median(treat) / statistics.median(base)
    if method == "pairs":
        low, high = min(treat) / max(base), max(treat) / min(base)
    elif method == "bootstrap":
        rng = random.Random(seed)
        ratios = sorted(
            statistics.median(rng.choices(treat, k=len(treat))) / statistics.median(rng.choices(base, k=len(base)))
            for _ in range(resamples)
        )
        low, high = percentile(ratios, 2.5), percentile(ratios, 97.5)
    else:
        raise ValueError(f"speedup: method must be 'pairs' or 'bootstrap', got {method!r}")
    single = len(base) < 2 or len(treat) < 2
    return Speedup(
        concurrency=concurrency,
        ratio=ratio,
        low=low,
        high=high,
        inconclusive=single or low <= 1.0 <= high,
        method=method,
        baseline=Spread.of(base),
        treatment=Spread.of(treat),
        baseline_repeats=len(base),
        treatment_repeats=len(treat),
    )


# ------------------------------------------------------------------------------------------ CPU pinning


@dataclass(frozen=True, kw_only=True)
class CpuSplit:
    """Disjoint CPU sets for the server and the benchmark client on one host."""

    server: tuple[int, ...]
    client: tuple[int, ...]

    @property
    def server_cpuset(self) -> str:
        """The server's CPUs as ``taskset -c`` / ``podman run --cpuset-cpus`` take them ("0-11")."""
        return format_cpus(self.server)

    @property
    def client_cpuset(self) -> str:
        return format_cpus(self.client)

    def pin_server(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run with its affinity set to the server's CPUs (inherited by every process it starts). Uses
        this interpreter to set the affinity, then execs ``argv`` (no taskset needed on the host)."""
        code = f"import os,sys;os.sched_setaffinity(0,{set(self.server)!r});os.execvp(sys.argv[1],sys.argv[1:])"
        return [sys.executable, "-c", code, *argv]


def _sibling_groups(cpus: Sequence[int], sysfs: Path) -> list[tuple[int, ...]]:
    """``cpus`` grouped by physical core (SMT siblings together), from sysfs; one group per CPU if unknown."""
    from servematrix.stages.bench_worker import parse_cpus

    allowed, seen, groups = set(cpus), set(), []
    for cpu in sorted(cpus):
        if cpu in seen:
            continue
        path = sysfs / f"cpu{cpu}" / "topology" / "thread_siblings_list"
        try:
            siblings = parse_cpus(path.read_text().strip()) & allowed
        except (OSError, ValueError):
            siblings = {cpu}
        siblings.add(cpu)
        seen |= siblings
        groups.append(tuple(sorted(siblings)))
    return groups


def split_cpus(
    client_cpus: int,
    *,
    cpus: Iterable[int] | None = None,
    sysfs: Path = Path("/sys/devices/system/cpu"),
) -> CpuSplit | None:
    """Split ``cpus`` (default: this process's affinity) into ``client_cpus`` CPUs for the client and the rest
    for the server, by whole physical cores where SMT siblings are known (siblings share a core's execution
    units, so splitting them would not stop the two from competing). The client takes the highest-numbered
    cores, and the server always keeps at least one core. None if there is nothing to split (one CPU)."""
    if client_cpus < 1:
        raise ValueError("client_cpus must be >= 1")
    pool = sorted(set(os.sched_getaffinity(0) if cpus is None else cpus))
    if len(pool) < 2:
        return None
    groups = _sibling_groups(pool, sysfs)
    if len(groups) == 1:  # one core with several threads: split its threads, the best there is
        groups = [(cpu,) for cpu in groups[0]]
    client: list[int] = []
    while len(client) < client_cpus and len(groups) > 1:
        client[:0] = groups.pop()
    server = [cpu for g in groups for cpu in g]
    return CpuSplit(server=tuple(server), client=tuple(sorted(client)))


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
