"""The benchmark client's hot path: a lean HTTP/1.1 + SSE streaming client, and the worker process that runs it.

Not httpx, whose layers took most of the client's CPU: per-event work is kept to a minimum so the client is not
the bottleneck. One ``asyncio.Protocol`` per connection parses bytes in ``data_received``; one timestamp per
network read; one regular-expression test per SSE event decides whether it needs a full ``json.loads``
(``tests/unit/stages/test_bench_worker.py`` checks them against the full parse). Tokens come ONLY from the
server's ``usage.completion_tokens``. A worker process (``python -m servematrix.stages.bench_worker``) runs its
share of a batch's streams on its own event loop, driven by the parent (``bench.ClientPool``) over stdin/stdout.

More, with the measurements behind it: docs/design-notes.md#srcservematrixstagesbench_workerpy
"""

import asyncio
import itertools
import json
import os
import pickle
import re
import ssl
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any
from urllib.parse import urlsplit

# A non-null usage/finish_reason/error: the event needs the full parse. ``\s*+`` because some servers put
# spaces around separators (Python's json.dumps does); possessive, or backtracking would let ": null" pass.
_NEEDS_PARSE = re.compile(rb'"(?:usage|finish_reason|error)"\s*+:\s*+(?!null)')
# A content field holding a non-empty string.
_CONTENT = {
    "chat": re.compile(rb'"(?:content|reasoning_content|reasoning)"\s*+:\s*+"(?!")'),
    "completions": re.compile(rb'"text"\s*+:\s*+"(?!")'),
    # sglang's /generate streams the whole text so far in `text` (non-incremental, its default): every event
    # after the first token holds a non-empty one, and each event is one step of the stream.
    "generate": re.compile(rb'"text"\s*+:\s*+"(?!")'),
}
MAX_ERROR_BODY = 300
# An SSE line longer than this is a protocol error: the server is not streaming tokens (one line per event,
# each a few hundred bytes), and the buffer of an endless line would grow without bound.
MAX_SSE_LINE = 1 << 20
# A server may count a stop token or two beyond max_tokens; more than this margin is not a count of tokens.
USAGE_MARGIN = 16
# Without max_tokens in the request, a completion_tokens this large is not a count either.
USAGE_CEILING = 1 << 24
# This many timeouts in a row and the server is taken to hang: the batch's other requests are not sent
# (`circuit_open`), and each later batch to the same server first sends one request to see if it answers.
CIRCUIT_TIMEOUTS = 3
# Chunked transfer decoding states (a positive state is the number of data bytes left in the current chunk).
_AT_SIZE, _AT_CRLF, _IN_TRAILER = -1, -2, -3
_LEN = struct.Struct("<Q")


@dataclass(slots=True)
class RequestResult:
    ok: bool
    error: str | None = None  # an error kind: http_<code>, timeout, connect, missing_usage, ...
    error_detail: str = ""
    ttft_s: float | None = None  # time to the first event with content
    itl_s: list[float] = field(default_factory=list)  # gaps between consecutive content events
    e2e_s: float | None = None
    completion_tokens: int | None = None  # from the server's usage only
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    text: str = ""
    events: int = 0  # SSE data lines received (content or not, [DONE] included)


def _chunk_text(choice: dict[str, Any], api: str) -> str | None:
    if api == "chat":
        delta = choice.get("delta") or {}
        # Reasoning models behind a reasoning parser (sglang, vLLM) stream their thinking tokens in a separate
        # field; they are generated tokens all the same, so they count for TTFT and ITL.
        return delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
    return choice.get("text")


def event_has_content(payload: bytes, api: str) -> bool | None:
    """The fast test: True/False if the event has content, None if it needs the full parse."""
    if _NEEDS_PARSE.search(payload) is not None:
        return None
    return _CONTENT[api].search(payload) is not None


class _ProtocolError(Exception):
    pass


class _Exchange:
    """One request/response on a connection: HTTP framing, then SSE events, parsed as bytes arrive."""

    __slots__ = (
        "_chunk_left",
        "_content_length",
        "_framing",
        "_head",
        "_sse",
        "api",
        "body_done",
        "closing",
        "content_times",
        "error_body",
        "events",
        "failure",
        "finish_reason",
        "future",
        "got_bytes",
        "keep_text",
        "parts",
        "raw",
        "status",
        "stream_error",
        "usage",
    )

    def __init__(self, api: str, keep_text: bool, future: "asyncio.Future[None]") -> None:
        self.api = api
        self.keep_text = keep_text
        self.future = future
        self.got_bytes = False
        self.status = 0
        self._head = b""
        self._framing = ""  # "chunked", "length" or "close", once the head is read
        self._content_length = 0
        self._chunk_left = _AT_SIZE  # chunked framing: see _dechunk
        self.raw = b""  # undecoded body bytes not yet consumed (chunked framing)
        self._sse = b""  # decoded body bytes not yet split into lines
        self.closing = False  # the server said "connection: close"
        self.body_done = False
        self.failure: tuple[str, str] | None = None
        self.content_times: list[float] = []
        self.parts: list[str] = []
        self.events = 0
        self.usage: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.stream_error: str | None = None
        self.error_body = b""

    # -- bytes in ------------------------------------------------------------------------------------------
    def feed(self, data: bytes, now: float) -> None:
        self.got_bytes = True
        try:
            if not self.status:
                head = self._head + data
                end = head.find(b"\r\n\r\n")
                if end < 0:
                    if len(head) > 65536:
                        raise _ProtocolError("response head over 64 KiB")
                    self._head = head
                    return
                self._parse_head(head[:end])
                data = head[end + 4 :]
                if 100 <= self.status < 200:  # an interim answer (100 Continue): the final one follows
                    self.status, self._head = 0, b""
                    if data:
                        self.feed(data, now)
                    return
            if self._framing == "chunked":
                body = self._dechunk(data)
            elif self._framing == "length":
                body = data[: self._content_length]
                self._content_length -= len(body)
                if self._content_length == 0:
                    self.body_done = True
            else:
                body = data
            if body:
                if self.status == 200:
                    self._feed_sse(body, now)
                elif len(self.error_body) < MAX_ERROR_BODY:
                    self.error_body += body
            if self.body_done:
                self._finish(now)
        # bad framing, JSON or shape (usage nested 200k deep: RecursionError)
        except (_ProtocolError, ValueError, AttributeError, TypeError, RecursionError) as exc:
            self.fail("protocol", f"{type(exc).__name__}: {exc}")

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise _ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        self.status = int(parts[1])
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        self.closing = headers.get(b"connection") == b"close" or parts[0] == b"HTTP/1.0"
        if b"chunked" in headers.get(b"transfer-encoding", b""):
            self._framing = "chunked"
        elif b"content-length" in headers:
            self._framing = "length"
            self._content_length = int(headers[b"content-length"])
            self.body_done = self._content_length == 0
        else:
            self._framing = "close"  # the body ends when the server closes the connection
            self.closing = True

    def _dechunk(self, data: bytes) -> bytes:
        raw = self.raw + data if self.raw else data
        out: list[bytes] = []
        pos, n = 0, len(raw)
        while pos < n:
            state = self._chunk_left
            if state > 0:  # inside a chunk's data
                take = min(state, n - pos)
                out.append(raw[pos : pos + take])
                pos += take
                self._chunk_left = state - take or _AT_CRLF
            elif state == _AT_CRLF:  # the CRLF after a chunk's data
                if n - pos < 2:
                    break
                if raw[pos : pos + 2] != b"\r\n":
                    raise _ProtocolError("chunk data not followed by CRLF")
                pos += 2
                self._chunk_left = _AT_SIZE
            else:  # a size line, or (after the last chunk) trailer lines up to an empty one
                eol = raw.find(b"\r\n", pos)
                if eol < 0:
                    if n - pos > 4096:
                        raise _ProtocolError("chunk size or trailer line over 4 KiB")
                    break
                line = raw[pos:eol]
                pos = eol + 2
                if state == _AT_SIZE:
                    size = int(line.split(b";", 1)[0], 16)
                    if size < 0:
                        raise _ProtocolError("negative chunk size")
                    self._chunk_left = size or _IN_TRAILER
                elif not line:
                    self.body_done = True
                    break
        self.raw = raw[pos:] if pos < n and not self.body_done else b""
        return out[0] if len(out) == 1 else b"".join(out)

    def _feed_sse(self, body: bytes, now: float) -> None:
        buf = self._sse + body if self._sse else body
        lines = buf.split(b"\n")
        self._sse = lines.pop()
        if len(self._sse) > MAX_SSE_LINE:
            raise _ProtocolError(f"an SSE line over {MAX_SSE_LINE} bytes without a newline")
        api, keep_text, times = self.api, self.keep_text, self.content_times
        needs_parse, content = _NEEDS_PARSE.search, _CONTENT[api].search
        for line in lines:
            if not line.startswith(b"data:"):
                continue  # blank separators, ": keep-alive" comments, event: lines
            payload = line[5:].strip()
            self.events += 1
            if keep_text or needs_parse(payload) is not None:
                self._parse_event(payload, now)
            elif content(payload) is not None:
                times.append(now)

    def _parse_event(self, payload: bytes, now: float) -> None:
        if payload == b"[DONE]":
            return
        obj = json.loads(payload)
        if obj.get("error"):
            self.stream_error = str(obj["error"])[:MAX_ERROR_BODY]
            return
        if self.api == "generate":
            self._parse_generate(obj, now)
            return
        for choice in obj.get("choices") or ():
            text = _chunk_text(choice, self.api)
            if text:
                self.content_times.append(now)
                if self.keep_text:
                    self.parts.append(text)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        if obj.get("usage"):
            self.usage = obj["usage"]

    def _parse_generate(self, obj: dict[str, Any], now: float) -> None:
        """One event of sglang's /generate: {"text": all so far, "output_ids", "meta_info": {"finish_reason":
        null or {"type": ...}, "prompt_tokens", "completion_tokens", ...}}; the counts are the server's."""
        text = obj.get("text")
        if text:
            self.content_times.append(now)
            if self.keep_text:
                self.parts = [text]  # cumulative: the latest is the whole text
        meta = obj.get("meta_info") or {}
        reason = meta.get("finish_reason")
        if reason:
            self.finish_reason = str(reason.get("type") if isinstance(reason, dict) else reason)
            # The usage of a finished request, in the OpenAI shape the rest of the client checks.
            self.usage = {k: meta.get(k) for k in ("completion_tokens", "prompt_tokens") if k in meta}

    # -- endings --------------------------------------------------------------------------------------------
    def _finish(self, now: float) -> None:
        if self._sse:  # a last line without its newline
            self._feed_sse(b"\n", now)
        if not self.future.done():
            self.future.set_result(None)

    def fail(self, kind: str, detail: str) -> None:
        self.failure = (kind, detail[:MAX_ERROR_BODY])
        if not self.future.done():
            self.future.set_result(None)

    def connection_lost(self) -> None:
        if self.future.done():
            return
        if self.status and self._framing == "close":
            self.body_done = True
            try:
                self._finish(time.perf_counter())
            except (_ProtocolError, ValueError, AttributeError, TypeError) as exc:
                self.fail("protocol", f"{type(exc).__name__}: {exc}")
            return
        self.fail("transport", "the server closed the connection before the response ended")


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.exchange: _Exchange | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        ex = self.exchange
        if ex is None or ex.future.done():
            self.close()  # bytes nobody asked for: the connection is unusable
            return
        ex.feed(data, time.perf_counter())

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.exchange is not None:
            self.exchange.connection_lost()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    path: str
    ssl: bool

    @classmethod
    def of(cls, url: str) -> "Target":
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        return cls(parts.hostname, parts.port or (443 if tls else 80), parts.path or "/", tls)

    def request(self, body: bytes) -> bytes:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {host}:{self.port}\r\ncontent-type: application/json\r\n"
            f"accept: text/event-stream\r\ncontent-length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body


class Stream:
    """One stream of sequential requests over one keep-alive connection (reopened when the server closes it)."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.conn: _Connection | None = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        ctx = ssl.create_default_context() if self.target.ssl else None
        _, proto = await loop.create_connection(_Connection, self.target.host, self.target.port, ssl=ctx)
        return proto

    async def request(
        self, body: bytes, *, api: str, timeout_s: float, keep_text: bool = False, max_tokens: int | None = None
    ) -> RequestResult:
        """Send one streaming request and time it. Never raises for server or network faults. `max_tokens`
        (what the body asks for) bounds the usage a reply may report."""
        loop = asyncio.get_running_loop()
        payload = self.target.request(body)
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(timeout_s):
                for attempt in (0, 1):
                    reused = self.conn is not None and not self.conn.closed
                    if not reused:
                        self.close()
                        try:
                            self.conn = await self._connect()
                        except OSError as exc:
                            return RequestResult(ok=False, error="connect", error_detail=f"{exc}"[:MAX_ERROR_BODY])
                    conn = self.conn
                    assert conn is not None and conn.transport is not None
                    ex = _Exchange(api, keep_text, loop.create_future())
                    conn.exchange = ex
                    conn.transport.write(payload)
                    try:
                        await ex.future
                    finally:
                        conn.exchange = None
                    # A kept-alive connection the server closed meanwhile fails before any byte: retry once.
                    if ex.failure is not None and reused and not ex.got_bytes and attempt == 0:
                        self.close()
                        continue
                    break
        except TimeoutError:
            self.close()
            return RequestResult(ok=False, error="timeout", error_detail=f"no completion within {timeout_s} s")
        t_end = time.perf_counter()
        if ex.failure is not None or ex.closing or not ex.body_done:
            self.close()
        return _result(ex, t0, t_end, max_tokens)


def requested_tokens(body: bytes) -> int | None:
    """The `max_tokens` (or `max_completion_tokens`) a request body asks for, if it names one."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if isinstance(obj, dict) and isinstance(obj.get("sampling_params"), dict):  # sglang's /generate
        obj = {"max_tokens": obj["sampling_params"].get("max_new_tokens")}
    for key in ("max_tokens", "max_completion_tokens"):
        value = obj.get(key) if isinstance(obj, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def usage_problem(usage: Any, max_tokens: int | None) -> str | None:
    """Why a reply's `usage` is not a count of the tokens this request made, or None."""
    if usage is None:
        return "stream ended without usage.completion_tokens"
    if not isinstance(usage, dict):
        return f"usage is a {type(usage).__name__}, not an object: {str(usage)[:80]}"
    limit = max_tokens + USAGE_MARGIN if max_tokens is not None else USAGE_CEILING
    tokens = usage.get("completion_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or not 0 <= tokens <= limit:
        return f"usage.completion_tokens {str(tokens)[:40]} is not a count of at most {limit} tokens"
    prompt = usage.get("prompt_tokens")
    if prompt is not None and (not isinstance(prompt, int) or isinstance(prompt, bool) or prompt < 0):
        return f"usage.prompt_tokens {str(prompt)[:40]} is not a count"
    return None


def _result(ex: _Exchange, t0: float, t_end: float, max_tokens: int | None = None) -> RequestResult:
    if ex.failure is not None:
        return RequestResult(ok=False, error=ex.failure[0], error_detail=ex.failure[1], events=ex.events)
    if ex.status != 200:
        detail = ex.error_body[:MAX_ERROR_BODY].decode("utf-8", "replace")
        return RequestResult(ok=False, error=f"http_{ex.status}", error_detail=detail)
    if ex.stream_error is not None:
        return RequestResult(ok=False, error="stream_error", error_detail=ex.stream_error, events=ex.events)
    times = ex.content_times
    result = RequestResult(
        ok=True,
        ttft_s=times[0] - t0 if times else None,
        itl_s=[b - a for a, b in itertools.pairwise(times)],
        e2e_s=t_end - t0,
        finish_reason=ex.finish_reason,
        text="".join(ex.parts),
        events=ex.events,
    )
    usage = ex.usage
    problem = usage_problem(usage, max_tokens)
    if problem is not None:  # counted for this request, like any protocol error
        result.ok = False
        result.error = (
            "missing_usage"
            if usage is None or (isinstance(usage, dict) and "completion_tokens" not in usage)
            else "bad_usage"
        )
        result.error_detail = problem
    else:
        assert isinstance(usage, dict)
        result.completion_tokens = usage["completion_tokens"]
        result.prompt_tokens = usage.get("prompt_tokens")
    return result


@dataclass(frozen=True)
class BatchSpec:
    """A worker's share of one batch: ``bodies`` (JSON bytes) sent over ``streams`` connections."""

    url: str
    bodies: list[bytes]
    streams: int
    api: str
    timeout_s: float
    # The cell's wall-clock budget ends here (time.perf_counter, CLOCK_MONOTONIC: the same in every process):
    # requests after it are not sent (`budget`), and none waits past it.
    deadline: float | None = None


class Runner:
    """Keeps a worker's connections alive between batches (the event loop persists), and the circuit breaker's
    state: a server that timed out CIRCUIT_TIMEOUTS times in a row gets one request per batch until it answers."""

    def __init__(self) -> None:
        self.idle: list[Stream] = []
        self.hung: Target | None = None  # the server the breaker opened for

    async def run(self, spec: BatchSpec) -> tuple[list[RequestResult], float, float]:
        target = Target.of(spec.url)
        n = min(spec.streams, len(spec.bodies))
        streams = [s for s in self.idle if s.target == target][:n]
        for s in self.idle:
            if s not in streams:
                s.close()
        streams += [Stream(target) for _ in range(n - len(streams))]
        results: list[RequestResult | None] = [None] * len(spec.bodies)
        next_index = iter(range(len(spec.bodies)))
        limits = [requested_tokens(body) for body in spec.bodies]
        # Timeouts in a row; a batch to a server the breaker opened for starts half-open: one request (under
        # `probe`) tries it first. `tripped`: the breaker opened in this batch, nothing more is sent.
        in_a_row = CIRCUIT_TIMEOUTS if self.hung == target else 0
        tripped = False
        probe = asyncio.Lock()

        async def send(stream: Stream, i: int) -> RequestResult:
            nonlocal in_a_row, tripped
            timeout_s = spec.timeout_s
            if spec.deadline is not None:
                left = spec.deadline - time.perf_counter()
                if left <= 0:
                    return RequestResult(ok=False, error="budget", error_detail="the cell's time budget was spent")
                timeout_s = min(timeout_s, left)
            result = await stream.request(spec.bodies[i], api=spec.api, timeout_s=timeout_s, max_tokens=limits[i])
            if result.error == "timeout":
                in_a_row += 1
                tripped = tripped or in_a_row > CIRCUIT_TIMEOUTS or (in_a_row == CIRCUIT_TIMEOUTS and not probing)
            else:
                in_a_row = 0
            return result

        probing = in_a_row >= CIRCUIT_TIMEOUTS

        async def drive(stream: Stream) -> None:
            nonlocal probing
            for i in next_index:  # a shared iterator: each index is taken by exactly one stream
                if not tripped and in_a_row >= CIRCUIT_TIMEOUTS:
                    async with probe:  # half-open: the others wait for the one request that tries the server
                        if not tripped and in_a_row >= CIRCUIT_TIMEOUTS:
                            results[i] = await send(stream, i)
                            probing = False
                            continue
                results[i] = _circuit_open() if tripped else await send(stream, i)

        t_start = time.perf_counter()
        await asyncio.gather(*(drive(s) for s in streams))
        t_end = time.perf_counter()
        self.idle = streams
        self.hung = target if in_a_row >= CIRCUIT_TIMEOUTS else None
        return [r for r in results if r is not None], t_start, t_end

    def close(self) -> None:
        for s in self.idle:
            s.close()
        self.idle = []


def _circuit_open() -> RequestResult:
    return RequestResult(
        ok=False, error="circuit_open", error_detail=f"not sent: {CIRCUIT_TIMEOUTS} requests in a row timed out"
    )


# ------------------------------------------------------------------------------------------- the process


def write_message(out: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(_LEN.pack(len(data)) + data)
    out.flush()


def read_message(inp: IO[bytes]) -> Any:
    """The next message, or None at end of file."""
    head = inp.read(_LEN.size)
    if len(head) < _LEN.size:
        return None
    size = _LEN.unpack(head)[0]
    data = inp.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


def serve(inp: IO[bytes], out: IO[bytes]) -> None:
    write_message(out, ("hello", sorted(os.sched_getaffinity(0))))  # started, and pinned where asked
    loop = asyncio.new_event_loop()
    runner = Runner()
    try:
        while True:
            # CPU from here on is the batch's (waiting for a message costs none): reading its share, the run,
            # and pickling the results all count.
            cpu0 = time.process_time()
            msg = read_message(inp)
            if msg is None or msg[0] == "exit":
                return
            if msg[0] != "batch":
                raise RuntimeError(f"unexpected message {msg[0]!r}")
            spec: BatchSpec = msg[1]
            write_message(out, ("ready",))
            go = read_message(inp)
            if go is None or go[0] != "go":
                return
            results, t_start, t_end = loop.run_until_complete(runner.run(spec))
            data = pickle.dumps(results, protocol=pickle.HIGHEST_PROTOCOL)
            write_message(out, ("done", data, t_start, t_end, time.process_time() - cpu0))
    finally:
        runner.close()
        loop.run_until_complete(asyncio.sleep(0))  # let the transports close
        loop.close()


def parse_cpus(text: str) -> set[int]:
    """``"0-3,8"`` → {0, 1, 2, 3, 8} (the cpuset list format of taskset -c and /sys)."""
    cpus: set[int] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def format_cpus(cpus: Sequence[int]) -> str:
    """{0, 1, 2, 3, 8} → ``"0-3,8"``."""
    out: list[str] = []
    for _, group in itertools.groupby(enumerate(sorted(set(cpus))), key=lambda p: p[1] - p[0]):
        run = [c for _, c in group]
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(out)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--cpus"] and len(args) >= 2 and args[1]:
        os.sched_setaffinity(0, parse_cpus(args[1]))
    serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    # Run from the imported module, not this __main__ copy: pickled results must name
    # servematrix.stages.bench_worker.RequestResult for the parent to load them.
    from servematrix.stages import bench_worker

    bench_worker.main()
