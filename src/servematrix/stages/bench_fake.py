"""A FAKE OpenAI-compatible streaming server: no model, canned tokens, configurable faults.

Two users: the tests (``tests/fakes/fake_openai_server.py`` re-exports it), and :func:`bench.measure_ceiling`,
which measures the benchmark client's ceiling against it on the host that runs the benchmark. It lives in the
package so that a wheel install can start it (``python -m servematrix.stages.bench_fake``).

It speaks just enough HTTP/1.1 (keep-alive, chunked transfer encoding) to serve ``/v1/chat/completions`` and
``/v1/completions`` with ``stream: true`` in the OpenAI SSE format, SGLang's native ``/generate`` in its own
stream format (cumulative ``text``, ``meta_info`` with the counts; see :func:`_stream_generate`), plus
``/health`` and ``/v1/models``.
Everything it sends is recorded, so tests can compare the client's counts with what the server reported.

Non-streamed requests are answered by a FAKE deterministic model (tokens and top-k logprobs as a function of
the prompt, :func:`_answer`), with injectable faults (``wrong_tokens_from``: garbage tokens, as a broken graph
mode would serve), for the correctness check's tests.

Use it in-process (``with FakeOpenAIServer(FakeBehavior(...)) as srv: srv.base_url``; the server runs its own
event loop in a thread), or as separate processes for throughput measurements::

    python -m servematrix.stages.bench_fake --port 0 [--processes 4] [--cpus 0-3] [--token-delay 0.001]
        [--usage separate_chunk] [--send-done] [--null-fields]

which prints ``PORT <n>`` once every process listens (``--processes`` shares the port with SO_REUSEPORT, so the
kernel spreads connections over the processes and the fake does not become the bottleneck).
"""

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import random
import re
import signal
import socket
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any

USAGE_MODES = ("final_chunk", "separate_chunk", "none")


@dataclass(frozen=True)
class FakeBehavior:
    # Completion tokens per request; None means the request's max_tokens. early_eos_mod > 0 makes a request
    # stop (len(prompt) % early_eos_mod) tokens early, like a model that sometimes emits EOS.
    tokens: int | None = None
    early_eos_mod: int = 0
    # Tokens per content chunk: > 1 means the chunk count differs from the token count (as with merged bytes).
    tokens_per_chunk: int = 1
    first_token_delay_s: float = 0.0
    token_delay_s: float = 0.0
    # "final_chunk": usage on the chunk with finish_reason (transformers serve, no [DONE]);
    # "separate_chunk": a last chunk with choices=[] and usage, then [DONE] (sglang, vLLM); "none": no usage.
    usage: str = "final_chunk"
    send_done: bool = False
    role_chunk: bool = True
    # Every Nth request (1-based arrival count) answers HTTP 500 instead of streaming.
    fail_every: int = 0
    # Every Nth request is cut off after a few chunks (the connection closes mid-stream).
    drop_every: int = 0
    # Chat only: the first N content chunks go in delta.reasoning_content, as behind sglang's reasoning parser.
    reasoning_chunks: int = 0
    # Put the request's arrival count in the text, so that two identical requests get different answers.
    vary_text: bool = False
    # Request fields answered with 422, like transformers serve does for fields it does not know.
    reject_fields: frozenset[str] = frozenset()
    # Every chunk carries the fields sglang and vLLM send as null ("finish_reason", "logprobs", "usage"):
    # the shape, and the size, of the events a client really parses.
    null_fields: bool = False
    # Keep every request in the log. Off in the server process (nobody can read its log; a ceiling
    # measurement sends tens of thousands of requests).
    record: bool = True
    # HOSTILE modes, for the attack tests: `usage_raw` is sent as the usage, as is (JSON text, or not: "NaN",
    # "[1, 2]", "-1000000"), in a chunk of its own; `hang_after_chunks` > 0 stops sending after that many
    # content chunks and keeps the connection open (an endless stream); `long_line_bytes` > 0 sends one SSE
    # line of that many bytes with no newline, then hangs.
    usage_raw: str = ""
    hang_after_chunks: int = 0
    long_line_bytes: int = 0
    # Non-streamed answers (the correctness check's greedy requests) come from a FAKE deterministic model: each
    # position's top-k is a function of the prompt and the position. Faults: `wrong_tokens_from` >= 0 answers
    # `<pad>` from that position on, a token outside every top-k (a graph mode serving garbage);
    # `near_tie_from` >= 0 picks the second-ranked token there (a harmless divergence inside the top-k);
    # `no_logprobs` leaves logprobs out, as transformers serve does.
    wrong_tokens_from: int = -1
    near_tie_from: int = -1
    no_logprobs: bool = False

    def __post_init__(self) -> None:
        if self.usage not in USAGE_MODES:
            raise ValueError(f"usage must be one of {USAGE_MODES}")


@dataclass
class RequestLog:
    path: str
    body: dict[str, Any]
    status: int
    completion_tokens: int | None = None  # as reported in usage (None if no usage was sent)
    prompt: str = ""


@dataclass
class _State:
    behavior: FakeBehavior
    log: list[RequestLog] = field(default_factory=list)
    count: int = 0
    in_flight: int = 0
    max_in_flight: int = 0


_APIS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/generate": "generate"}


def _prompt_of(body: dict[str, Any]) -> str:
    if "messages" in body:
        return " ".join(str(m.get("content", "")) for m in body["messages"])
    return str(body.get("prompt", body.get("text", "")))


def _chunk(
    api: str,
    *,
    text: str | None = None,
    finish: str | None = None,
    role: bool = False,
    reasoning: bool = False,
    nulls: bool = False,
) -> dict:
    if api == "chat":
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["reasoning_content" if reasoning else "content"] = text
        if nulls:
            delta = {"role": None, "content": None, "reasoning_content": None, "tool_calls": None, **delta}
        choice: dict[str, Any] = {"index": 0, "delta": delta}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or ""}
        obj = "text_completion"
    if nulls:
        choice.update(logprobs=None, finish_reason=None, matched_stop=None)
    if finish:
        choice["finish_reason"] = finish
    out: dict[str, Any] = {"id": "fake", "object": obj, "created": 0, "model": "fake", "choices": [choice]}
    if nulls:
        out.update(id="chatcmpl-0123456789abcdef0123456789abcdef", created=1735000000, usage=None)
    return out


def _sse(obj: dict | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    payload = f"data: {data}\n\n".encode()
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _response(status: int, body: dict, reason: str = "") -> bytes:
    data = json.dumps(body).encode()
    reason = reason or {200: "OK", 404: "Not Found", 422: "Unprocessable Entity", 500: "Internal Server Error"}[status]
    head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
    return head.encode() + data


async def _hang(writer: asyncio.StreamWriter) -> bool:
    """Keep the connection open and send nothing, until the client gives up or the server stops."""
    with contextlib.suppress(asyncio.CancelledError):  # the server stopping: not an error of the fake's
        await asyncio.sleep(3600)
    writer.close()
    return False


async def _stream(
    writer: asyncio.StreamWriter, state: _State, api: str, body: dict, entry: RequestLog, *, drop: bool
) -> bool:
    """Stream one completion. Returns False if the connection was dropped on purpose."""
    if api == "generate":
        return await _stream_generate(writer, state, body, entry)
    b = state.behavior
    max_tokens = int(body.get("max_tokens") or 16)
    n = b.tokens if b.tokens is not None else max_tokens
    if b.early_eos_mod:
        n = max(1, n - len(entry.prompt) % b.early_eos_mod)
    finish = "length" if n >= max_tokens else "stop"
    usage = {"prompt_tokens": len(entry.prompt.split()), "completion_tokens": n, "total_tokens": 0}
    usage["total_tokens"] = usage["prompt_tokens"] + n
    include_usage = bool((body.get("stream_options") or {}).get("include_usage")) and b.usage != "none"
    entry.completion_tokens = n if include_usage else None

    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    if api == "chat" and b.role_chunk:
        writer.write(_sse(_chunk(api, role=True, nulls=b.null_fields)))
    if b.long_line_bytes:
        piece = b"x" * 65536
        writer.write(b"%x\r\ndata: \r\n" % 6)
        for _ in range(b.long_line_bytes // len(piece)):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        return await _hang(writer)
    if b.first_token_delay_s:
        await asyncio.sleep(b.first_token_delay_s)
    # One pre-encoded content chunk, reused: the fake must stay far cheaper than the client it measures.
    word = f" tok{state.count}" if b.vary_text else " tok"
    content = _sse(_chunk(api, text=word * b.tokens_per_chunk, nulls=b.null_fields))
    # Chunks are written in bursts of up to 8 (one send each): the fake must stay far cheaper than the client.
    out: list[bytes] = []
    sent, i = 0, 0
    while sent < n or i == 0:  # n == 0 still sends one (empty) final chunk
        k = min(b.tokens_per_chunk, n - sent)
        last = sent + k >= n
        if last:  # the last content chunk may carry fewer tokens, finish_reason and (transformers) usage
            obj = _chunk(api, text=word * k, finish=finish, nulls=b.null_fields)
            if include_usage and b.usage == "final_chunk" and not b.usage_raw:
                obj["usage"] = usage
            out.append(_sse(obj))
        elif api == "chat" and i < b.reasoning_chunks:
            out.append(_sse(_chunk(api, text=word * k, reasoning=True, nulls=b.null_fields)))
        else:
            out.append(content)
        sent += k
        i += 1
        if b.hang_after_chunks and i >= b.hang_after_chunks:
            writer.write(b"".join(out))
            await writer.drain()
            return await _hang(writer)
        if drop and i >= 3:
            writer.write(b"".join(out))
            await writer.drain()
            writer.close()
            return False
        if b.token_delay_s:
            writer.write(b"".join(out))
            out.clear()
            await writer.drain()
            await asyncio.sleep(b.token_delay_s)
        elif i % 8 == 0:
            writer.write(b"".join(out))
            out.clear()
            await writer.drain()
            await asyncio.sleep(0)  # let other streams interleave
    if b.usage_raw:
        out.append(_sse(f'{{"id":"fake","object":"chat.completion.chunk","choices":[],"usage":{b.usage_raw}}}'))
    elif include_usage and b.usage == "separate_chunk":
        out.append(_sse({"id": "fake", "object": "chat.completion.chunk", "choices": [], "usage": usage}))
    if b.send_done:
        out.append(_sse("[DONE]"))
    out.append(b"0\r\n\r\n")
    writer.write(b"".join(out))
    await writer.drain()
    return True


async def _stream_generate(writer: asyncio.StreamWriter, state: _State, body: dict, entry: RequestLog) -> bool:
    """Stream one /generate request as sglang 0.5.12 does by default (srt/managers/tokenizer_manager.py,
    non-incremental streaming): each event holds the whole text so far, its output ids and ``meta_info`` with
    ``finish_reason`` (null until the last event, then ``{"type": "length", ...}``), ``prompt_tokens`` and
    ``completion_tokens``; then ``data: [DONE]`` (srt/entrypoints/http_server.py). Of the faults, only the
    token pacing applies."""
    b = state.behavior
    sampling = body.get("sampling_params") or {}
    max_tokens = int(sampling.get("max_new_tokens") or 16)
    n = b.tokens if b.tokens is not None else max_tokens
    entry.completion_tokens = n
    prompt_tokens = len(entry.prompt.split())
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    if b.first_token_delay_s:
        await asyncio.sleep(b.first_token_delay_s)
    for i in range(1, n + 1):
        finish = None
        if i == n:
            finish = {"type": "length", "length": n} if n >= max_tokens else {"type": "stop", "matched": 0}
        meta = {"id": "fake", "finish_reason": finish, "prompt_tokens": prompt_tokens, "completion_tokens": i}
        writer.write(_sse({"text": " tok" * i, "output_ids": list(range(i)), "meta_info": meta}))
        if b.token_delay_s:
            await writer.drain()
            await asyncio.sleep(b.token_delay_s)
        elif i % 8 == 0:
            await writer.drain()
            await asyncio.sleep(0)
    writer.write(_sse("[DONE]") + b"0\r\n\r\n")
    await writer.drain()
    return True


# The fake model's vocabulary: a token's id is its index.
_FAKE_VOCAB = (*(f" w{i}" for i in range(64)), "<pad>")
_FAKE_LOGPROBS = (-0.05, -3.2, -3.9, -4.4, -4.8, -5.1, -5.5, -5.9)


def _fake_top(prompt: str, position: int, k: int) -> list[tuple[int, float]]:
    """The fake model's top-k at a position: (token id, logprob), best first; deterministic."""
    rng = random.Random(zlib.crc32(prompt.encode()) * 4096 + position)
    ids = rng.sample(range(len(_FAKE_VOCAB) - 1), max(k, 2))
    return list(zip(ids, _FAKE_LOGPROBS[: len(ids)], strict=False))


def _answer(api: str, body: dict, entry: RequestLog, b: FakeBehavior) -> dict[str, Any]:
    """A non-streamed greedy answer from the fake model, with its top-k logprobs where asked for."""
    sampling = body.get("sampling_params") or {}
    n = int(sampling.get("max_new_tokens") or body.get("max_tokens") or 16)
    if api == "generate":
        k = int(body.get("top_logprobs_num") or 0) if body.get("return_logprob") else 0
    elif api == "chat":
        k = int(body.get("top_logprobs") or 0) if body.get("logprobs") else 0
    else:
        k = int(body.get("logprobs") or 0)
    k = 0 if b.no_logprobs else k
    chosen: list[tuple[int, float]] = []
    tops: list[list[tuple[int, float]]] = []
    pad = len(_FAKE_VOCAB) - 1
    for i in range(n):
        top = _fake_top(entry.prompt, i, max(k, 2))
        if 0 <= b.wrong_tokens_from <= i:
            top = [(pad, -0.01), *top[: len(top) - 1]]
        elif 0 <= b.near_tie_from == i:
            top = [top[1], top[0], *top[2:]]
        chosen.append(top[0])
        tops.append(top[:k])
    text = "".join(_FAKE_VOCAB[t] for t, _ in chosen)
    entry.completion_tokens = n
    usage = {"prompt_tokens": len(entry.prompt.split()), "completion_tokens": n}
    if api == "generate":
        meta: dict[str, Any] = {"id": "fake", "finish_reason": {"type": "length", "length": n}, **usage}
        if k:
            meta["output_token_logprobs"] = [[lp, t, _FAKE_VOCAB[t]] for t, lp in chosen]
            meta["output_top_logprobs"] = [[[lp, t, _FAKE_VOCAB[t]] for t, lp in top] for top in tops]
        return {"text": text, "output_ids": [t for t, _ in chosen], "meta_info": meta}
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
    if api == "chat":
        choice["message"] = {"role": "assistant", "content": text}
        if k:
            choice["logprobs"] = {
                "content": [
                    {
                        "token": _FAKE_VOCAB[t],
                        "logprob": lp,
                        "top_logprobs": [{"token": _FAKE_VOCAB[u], "logprob": v} for u, v in top],
                    }
                    for (t, lp), top in zip(chosen, tops, strict=True)
                ]
            }
    else:
        choice["text"] = text
        if k:
            choice["logprobs"] = {
                "tokens": [_FAKE_VOCAB[t] for t, _ in chosen],
                "token_logprobs": [lp for _, lp in chosen],
                "top_logprobs": [{_FAKE_VOCAB[u]: v for u, v in top} for top in tops],
            }
    return {"id": "fake", "object": "fake", "model": "fake", "choices": [choice], "usage": usage}


async def _handle(state: _State, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            request_line = await reader.readline()
            if not request_line:
                return
            method, path, _ = request_line.decode().split(" ", 2)
            headers = {}
            while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                k, _, v = line.decode().partition(":")
                headers[k.strip().lower()] = v.strip()
            raw = await reader.readexactly(int(headers.get("content-length", 0)))
            if method == "GET" and path == "/health":
                writer.write(_response(200, {"status": "ok"}))
            elif method == "GET" and path == "/v1/models":
                writer.write(_response(200, {"object": "list", "data": [{"id": "fake", "object": "model"}]}))
            elif method == "POST" and path in _APIS:
                api = _APIS[path]
                body = json.loads(raw)
                state.count += 1
                entry = RequestLog(path=path, body=body, status=200, prompt=_prompt_of(body))
                b = state.behavior
                if b.record:
                    state.log.append(entry)
                unexpected = set(body) & b.reject_fields
                if unexpected:
                    entry.status = 422
                    writer.write(_response(422, {"detail": f"Unexpected fields in the request: {unexpected}"}))
                elif b.fail_every and state.count % b.fail_every == 0:
                    entry.status = 500
                    writer.write(_response(500, {"detail": "fake failure"}))
                elif not body.get("stream"):
                    writer.write(_response(200, _answer(api, body, entry, b)))
                else:
                    drop = bool(b.drop_every) and state.count % b.drop_every == 0
                    state.in_flight += 1
                    state.max_in_flight = max(state.max_in_flight, state.in_flight)
                    try:
                        if not await _stream(writer, state, api, body, entry, drop=drop):
                            return
                    finally:
                        state.in_flight -= 1
            else:
                writer.write(_response(404, {"detail": "Not Found"}))
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        return
    finally:
        writer.close()


class FakeOpenAIServer:
    """The fake server on 127.0.0.1 (a free port), served from its own event loop in a daemon thread."""

    def __init__(self, behavior: FakeBehavior | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.state = _State(behavior or FakeBehavior())
        self.host, self.port = host, port
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-openai-server", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def log(self) -> list[RequestLog]:
        return self.state.log

    def set_behavior(self, behavior: FakeBehavior) -> None:
        self.state.behavior = behavior

    def start(self) -> "FakeOpenAIServer":
        self._thread.start()

        async def start() -> asyncio.Server:
            return await asyncio.start_server(lambda r, w: _handle(self.state, r, w), self.host, self.port)

        self._server = asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            # Connection handlers idle on keep-alive connections: cancel them, or they outlive the loop.
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> "FakeOpenAIServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def request_index(entry: RequestLog) -> int | None:
    """The prompt index from the bench client's synthetic prompts ("Request <i>: ...")."""
    m = re.search(r"Request (\d+):", entry.prompt)
    return int(m.group(1)) if m else None


async def _serve_forever(behavior: FakeBehavior, sock: socket.socket) -> None:
    state = _State(behavior)
    server = await asyncio.start_server(lambda r, w: _handle(state, r, w), sock=sock)
    async with server:
        await server.serve_forever()


def _listeners(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` listening sockets on one port (SO_REUSEPORT: the kernel spreads connections over them)."""
    socks: list[socket.socket] = []
    for _ in range(count):
        # IPPROTO_TCP, not 0: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say they are TCP; with
        # Nagle on, small writes wait for the client's delayed ACK, 40 ms per request.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if count > 1:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        port = sock.getsockname()[1]  # port 0: the first bind picks one, the others join it
        sock.listen(1024)
        sock.setblocking(False)
        socks.append(sock)
    return socks


def _end_with_parent() -> None:
    """Die with the process that started it (PR_SET_PDEATHSIG: SIGTERM, which stops every server process): a
    harness SIGKILLed while it measured its ceiling left this listening for ever."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG (linux/prctl.h)
    if os.getppid() != parent:  # gone already
        os._exit(0)


def main(argv: list[str] | None = None) -> None:
    _end_with_parent()
    p = argparse.ArgumentParser(description="A fake OpenAI-compatible streaming server (for tests and ceilings).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--processes", type=int, default=1, help="server processes sharing the port (SO_REUSEPORT)")
    p.add_argument("--cpus", default="", help="pin the server to these CPUs (taskset -c list format)")
    p.add_argument("--token-delay", type=float, default=0.0)
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--usage", choices=USAGE_MODES, default="final_chunk")
    p.add_argument("--send-done", action="store_true", help="end each stream with data: [DONE]")
    p.add_argument("--null-fields", action="store_true", help="sglang/vLLM-shaped chunks (null fields)")
    p.add_argument("--wrong-tokens-from", type=int, default=-1, help="FAULT: non-streamed answers turn to <pad> here")
    p.add_argument("--no-logprobs", action="store_true", help="non-streamed answers carry no logprobs")
    args = p.parse_args(argv)
    if args.processes < 1:
        p.error("--processes must be >= 1")
    if args.cpus:
        from servematrix.stages.bench_worker import parse_cpus

        os.sched_setaffinity(0, parse_cpus(args.cpus))
    behavior = FakeBehavior(
        token_delay_s=args.token_delay,
        tokens_per_chunk=args.tokens_per_chunk,
        usage=args.usage,
        send_done=args.send_done,
        null_fields=args.null_fields,
        record=False,
        wrong_tokens_from=args.wrong_tokens_from,
        no_logprobs=args.no_logprobs,
    )
    socks = _listeners(args.host, args.port, args.processes)
    children = []
    for sock in socks[1:]:  # forked before any event loop or thread exists
        pid = os.fork()
        if pid == 0:
            for other in socks:
                if other is not sock:
                    other.close()
            with contextlib.suppress(KeyboardInterrupt):
                asyncio.run(_serve_forever(behavior, sock))
            os._exit(0)
        children.append(pid)
    for sock in socks[1:]:
        sock.close()

    def stop(signum: int, _frame: object) -> None:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        os._exit(0)  # nothing to flush or clean up; an exit through the event loop only prints tracebacks

    signal.signal(signal.SIGTERM, stop)
    print(f"PORT {socks[0].getsockname()[1]}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_forever(behavior, socks[0]))


if __name__ == "__main__":
    main()
