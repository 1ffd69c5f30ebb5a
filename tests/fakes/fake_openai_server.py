"""A FAKE OpenAI-compatible streaming server for tests: no model, canned tokens, configurable faults.

It speaks just enough HTTP/1.1 (keep-alive, chunked transfer encoding) to serve ``/v1/chat/completions`` and
``/v1/completions`` with ``stream: true`` in the OpenAI SSE format, plus ``/health`` and ``/v1/models``.
Everything it sends is recorded, so tests can compare the client's counts with what the server reported.

Use it in-process (``with FakeOpenAIServer(FakeBehavior(...)) as srv: srv.base_url``; the server runs its own
event loop in a thread), or as a separate process for throughput measurements::

    python tests/fakes/fake_openai_server.py --port 0 [--token-delay 0.001] [--usage separate_chunk]

which prints ``PORT <n>`` once it listens.
"""

import argparse
import asyncio
import contextlib
import json
import re
import threading
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


def _prompt_of(body: dict[str, Any]) -> str:
    if "messages" in body:
        return " ".join(str(m.get("content", "")) for m in body["messages"])
    return str(body.get("prompt", ""))


def _chunk(
    api: str, *, text: str | None = None, finish: str | None = None, role: bool = False, reasoning: bool = False
) -> dict:
    if api == "chat":
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["reasoning_content" if reasoning else "content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or ""}
        obj = "text_completion"
    if finish:
        choice["finish_reason"] = finish
    return {"id": "fake", "object": obj, "created": 0, "model": "fake", "choices": [choice]}


def _sse(obj: dict | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    payload = f"data: {data}\n\n".encode()
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _response(status: int, body: dict, reason: str = "") -> bytes:
    data = json.dumps(body).encode()
    reason = reason or {200: "OK", 404: "Not Found", 422: "Unprocessable Entity", 500: "Internal Server Error"}[status]
    head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
    return head.encode() + data


async def _stream(
    writer: asyncio.StreamWriter, state: _State, api: str, body: dict, entry: RequestLog, *, drop: bool
) -> bool:
    """Stream one completion. Returns False if the connection was dropped on purpose."""
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
        writer.write(_sse(_chunk(api, role=True)))
    if b.first_token_delay_s:
        await asyncio.sleep(b.first_token_delay_s)
    # One pre-encoded content chunk, reused: the fake must stay far cheaper than the client it measures.
    word = f" tok{state.count}" if b.vary_text else " tok"
    content = _sse(_chunk(api, text=word * b.tokens_per_chunk))
    sent, i = 0, 0
    while sent < n or i == 0:  # n == 0 still sends one (empty) final chunk
        k = min(b.tokens_per_chunk, n - sent)
        last = sent + k >= n
        if last:  # the last content chunk may carry fewer tokens, finish_reason and (transformers) usage
            obj = _chunk(api, text=word * k, finish=finish)
            if include_usage and b.usage == "final_chunk":
                obj["usage"] = usage
            writer.write(_sse(obj))
        elif api == "chat" and i < b.reasoning_chunks:
            writer.write(_sse(_chunk(api, text=word * k, reasoning=True)))
        else:
            writer.write(content)
        sent += k
        i += 1
        if drop and i >= 3:
            await writer.drain()
            writer.close()
            return False
        if b.token_delay_s:
            await writer.drain()
            await asyncio.sleep(b.token_delay_s)
        elif i % 8 == 0:
            await writer.drain()
            await asyncio.sleep(0)  # let other streams interleave
    if include_usage and b.usage == "separate_chunk":
        writer.write(_sse({"id": "fake", "object": "chat.completion.chunk", "choices": [], "usage": usage}))
    if b.send_done:
        writer.write(_sse("[DONE]"))
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    return True


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
            elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
                api = "chat" if path == "/v1/chat/completions" else "completions"
                body = json.loads(raw)
                state.count += 1
                entry = RequestLog(path=path, body=body, status=200, prompt=_prompt_of(body))
                state.log.append(entry)
                b = state.behavior
                unexpected = set(body) & b.reject_fields
                if unexpected:
                    entry.status = 422
                    writer.write(_response(422, {"detail": f"Unexpected fields in the request: {unexpected}"}))
                elif b.fail_every and state.count % b.fail_every == 0:
                    entry.status = 500
                    writer.write(_response(500, {"detail": "fake failure"}))
                elif not body.get("stream"):
                    writer.write(_response(422, {"detail": "the fake server only streams"}))
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


async def _serve_forever(behavior: FakeBehavior, host: str, port: int) -> None:
    state = _State(behavior)
    server = await asyncio.start_server(lambda r, w: _handle(state, r, w), host, port)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="A fake OpenAI-compatible streaming server (for tests).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--token-delay", type=float, default=0.0)
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--usage", choices=USAGE_MODES, default="final_chunk")
    args = p.parse_args(argv)
    behavior = FakeBehavior(token_delay_s=args.token_delay, tokens_per_chunk=args.tokens_per_chunk, usage=args.usage)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_forever(behavior, args.host, args.port))


if __name__ == "__main__":
    main()
