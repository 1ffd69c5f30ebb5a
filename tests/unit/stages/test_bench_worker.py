"""The lean client's hot path: the fast event test agrees with a full JSON parse, HTTP framing survives any split
of the bytes, and connections are reused or reopened as servers close them."""

import asyncio
import itertools
import json
import random

import pytest

from servematrix.stages.bench import request_body
from servematrix.stages.bench_worker import (
    RequestResult,
    Stream,
    Target,
    _chunk_text,
    _Exchange,
    event_has_content,
    format_cpus,
    parse_cpus,
    requested_tokens,
)

# ------------------------------------------------------------------------------ the fast test vs json.loads


def _full_parse_has_content(payload: bytes, api: str) -> bool:
    obj = json.loads(payload)
    return any(_chunk_text(choice, api) for choice in obj.get("choices") or ())


def _chat(delta: dict, **extra) -> dict:
    return {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, **extra}]}


CHAT_EVENTS = [
    _chat({"role": "assistant", "content": ""}),
    _chat({"role": "assistant"}),
    _chat({"content": " the"}),
    _chat({"content": None, "reasoning_content": "hmm"}),
    _chat({"content": None, "reasoning": "hmm"}),
    _chat({"content": None, "reasoning_content": None, "tool_calls": None, "role": None}),
    _chat({"content": "\n"}),
    _chat({"content": '"'}),
    _chat({"content": "\\"}),
    _chat({"content": 'say "content": "x" and \\"content\\":'}),  # keys inside the text
    _chat({"content": '", "usage": {"completion_tokens": 5}'}),
    _chat({"content": "ünïcödé ✓"}),
    _chat({"content": ""}, logprobs={"content": [{"token": "a", "logprob": -1.0}]}),
    _chat({"content": "a"}, logprobs={"content": [{"token": "a", "logprob": -1.0}]}),
    _chat({"content": " x"}, finish_reason=None, matched_stop=None),
    _chat({"content": " x"}, finish_reason="length"),
    _chat({}, finish_reason="stop"),
    {"id": "x", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7}},
    {"id": "x", "choices": [], "usage": None},
    {"error": {"message": "boom"}},
    {"error": None, "choices": [{"delta": {"content": "y"}}]},
]
COMPLETION_EVENTS = [
    {"choices": [{"index": 0, "text": ""}]},
    {"choices": [{"index": 0, "text": " the"}]},
    {"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": {"completion_tokens": 4}},
    {"choices": [{"index": 0, "text": '"text": "x"'}]},
    {"choices": [{"index": 0, "text": None, "logprobs": None, "finish_reason": None}], "usage": None},
]


def _encodings(obj: dict) -> list[bytes]:
    """The same event as different servers write it: compact, Python's default spacing, indented, ASCII."""
    return [
        json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode(),
        json.dumps(obj).encode(),
        json.dumps(obj, separators=(" , ", " : ")).encode(),
    ]


@pytest.mark.parametrize(("api", "events"), [("chat", CHAT_EVENTS), ("completions", COMPLETION_EVENTS)])
def test_fast_event_test_agrees_with_the_full_parse(api, events):
    fast_paths = 0
    for obj in events:
        for payload in _encodings(obj):
            fast = event_has_content(payload, api)
            if fast is None:
                continue  # the full parse decides: usage, finish_reason or error is set
            fast_paths += 1
            assert fast == _full_parse_has_content(payload, api), payload
    assert fast_paths >= len(events)  # most events take the fast path


def test_events_with_usage_finish_or_error_take_the_full_parse():
    for obj in (CHAT_EVENTS[15], CHAT_EVENTS[16], CHAT_EVENTS[17], CHAT_EVENTS[19], COMPLETION_EVENTS[2]):
        for payload in _encodings(obj):
            assert event_has_content(payload, "chat") is None
    # null usage / finish_reason / error: the fast path
    assert event_has_content(json.dumps(CHAT_EVENTS[14]).encode(), "chat") is True
    assert event_has_content(json.dumps(CHAT_EVENTS[18]).encode(), "chat") is False


# --------------------------------------------------------------------------------------- HTTP framing


def _sse_stream(events: list[dict | str]) -> bytes:
    return b"".join(
        b"data: " + (e.encode() if isinstance(e, str) else json.dumps(e).encode()) + b"\n\n" for e in events
    )


def _chunked(body: bytes, sizes: list[int]) -> bytes:
    out, pos = [], 0
    for size in itertools.cycle(sizes):
        if pos >= len(body):
            break
        part = body[pos : pos + size]
        out.append(b"%x;ext=1\r\n%s\r\n" % (len(part), part))
        pos += len(part)
    return b"".join(out) + b"0\r\nx-trailer: 1\r\n\r\n"


STREAM_EVENTS: list[dict | str] = [
    _chat({"role": "assistant", "content": ""}),
    *[_chat({"content": f" t{i}"}) for i in range(5)],
    _chat({"content": " end"}, finish_reason="length"),
    {"id": "x", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 6}},
    "[DONE]",
]


def _feed(raw: bytes, cuts: list[int]) -> _Exchange:
    loop = asyncio.new_event_loop()
    try:
        ex = _Exchange("chat", True, loop.create_future())
        pos = 0
        for i, cut in enumerate([*cuts, len(raw)]):
            ex.feed(raw[pos:cut], float(i))
            pos = cut
        return ex
    finally:
        loop.close()


@pytest.mark.parametrize("framing", ["chunked", "length"])
def test_any_split_of_the_response_parses_the_same(framing):
    body = _sse_stream(STREAM_EVENTS)
    if framing == "chunked":
        raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(body, [7, 50, 3, 200])
    else:
        raw = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    whole = _feed(raw, [])
    assert whole.body_done and whole.failure is None
    assert whole.usage == {"prompt_tokens": 3, "completion_tokens": 6}
    assert "".join(whole.parts) == " t0 t1 t2 t3 t4 end" and whole.finish_reason == "length"
    rng = random.Random(0)
    splits = [[i] for i in range(1, len(raw))] + [sorted(rng.sample(range(1, len(raw)), 12)) for _ in range(50)]
    for cuts in splits:
        ex = _feed(raw, cuts)
        assert ex.body_done and ex.failure is None, cuts
        assert (ex.usage, ex.parts, ex.events, ex.finish_reason) == (
            whole.usage,
            whole.parts,
            whole.events,
            whole.finish_reason,
        ), cuts


def test_bad_framing_is_a_protocol_error():
    ex = _feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", [])
    assert ex.failure is not None and ex.failure[0] == "protocol"
    ex = _feed(b"SSH-2.0-OpenSSH\r\n\r\n", [])
    assert ex.failure is not None and ex.failure[0] == "protocol"
    ex = _feed(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\ndata: {oops\n", [])
    assert ex.failure is not None and ex.failure[0] == "protocol"


# ----------------------------------------------------------------------------- against raw socket servers


async def _raw_server(respond, *, close_after: bool) -> asyncio.Server:
    """A server that answers each request with ``respond()`` bytes, closing the connection afterwards if asked
    (without saying so in a header: as a server whose keep-alive timeout ran out)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                await reader.readexactly(length)
                writer.write(respond())
                await writer.drain()
                if close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def _sse_response() -> bytes:
    body = _sse_stream(STREAM_EVENTS[:-1])  # no [DONE], like transformers serve
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" + _chunked(
        body, [1000]
    )


def _run_requests(n: int, *, close_after: bool, respond=_sse_response) -> list[RequestResult]:
    async def main() -> list[RequestResult]:
        server = await _raw_server(respond, close_after=close_after)
        port = server.sockets[0].getsockname()[1]
        stream = Stream(Target.of(f"http://127.0.0.1:{port}/v1/chat/completions"))
        body = json.dumps(request_body("m", "hi", api="chat", max_tokens=6, temperature=0.0)).encode()
        try:
            return [await stream.request(body, api="chat", timeout_s=5) for _ in range(n)]
        finally:
            stream.close()
            server.close()
            await server.wait_closed()

    return asyncio.run(main())


@pytest.mark.parametrize("close_after", [False, True])
def test_sequential_requests_reuse_or_reopen_the_connection(close_after):
    results = _run_requests(5, close_after=close_after)
    assert all(r.ok for r in results), results
    assert [r.completion_tokens for r in results] == [6] * 5
    assert all(r.ttft_s is not None and len(r.itl_s) == 5 for r in results)


def test_a_body_that_ends_with_the_connection():
    def respond() -> bytes:  # HTTP/1.0 style: no length, no chunks; the body ends when the server closes
        return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n" + _sse_stream(STREAM_EVENTS)

    results = _run_requests(3, close_after=True, respond=respond)
    assert [r.completion_tokens for r in results] == [6] * 3 and all(r.ok for r in results)


def test_an_http_error_carries_its_body():
    def respond() -> bytes:
        return b'HTTP/1.1 503 Service Unavailable\r\ncontent-length: 17\r\n\r\n{"detail":"busy"}'

    results = _run_requests(2, close_after=False, respond=respond)
    assert [(r.error, r.error_detail) for r in results] == [("http_503", '{"detail":"busy"}')] * 2


def test_cpu_lists_round_trip():
    assert parse_cpus("0-3,8,10-11") == {0, 1, 2, 3, 8, 10, 11}
    assert format_cpus([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert format_cpus([5]) == "5" and parse_cpus("") == set()


# sglang 0.5.12's /generate stream (non-incremental, its default): the whole text so far in every event,
# meta_info's finish_reason null until the last, then `data: [DONE]` (srt/managers/tokenizer_manager.py,
# srt/entrypoints/http_server.py generate_request).
GENERATE_EVENTS: list[dict | str] = [
    *[
        {
            "text": "".join(f" t{j}" for j in range(i + 1)),
            "output_ids": list(range(i + 1)),
            "meta_info": {"id": "r", "finish_reason": None, "prompt_tokens": 3, "completion_tokens": i + 1},
        }
        for i in range(5)
    ],
    {
        "text": " t0 t1 t2 t3 t4 t5",
        "output_ids": list(range(6)),
        "meta_info": {
            "id": "r",
            "finish_reason": {"type": "length", "length": 6},
            "prompt_tokens": 3,
            "completion_tokens": 6,
            "cached_tokens": 0,
        },
    },
    "[DONE]",
]


@pytest.mark.parametrize("keep_text", [True, False])
def test_sglang_generate_stream_counts_from_meta_info(keep_text):
    body = _sse_stream(GENERATE_EVENTS)
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(body, [9, 64, 5])
    loop = asyncio.new_event_loop()
    try:
        ex = _Exchange("generate", keep_text, loop.create_future())
        ex.feed(raw, 1.0)
    finally:
        loop.close()
    assert ex.body_done and ex.failure is None
    # the counts are the server's, from the finished event's meta_info; one content time per token event
    assert ex.usage == {"completion_tokens": 6, "prompt_tokens": 3}
    assert ex.finish_reason == "length"
    assert len(ex.content_times) == 6
    assert ex.parts == ([" t0 t1 t2 t3 t4 t5"] if keep_text else [])


def test_generate_bodies_ask_in_sampling_params():
    body = request_body("m", "hi", api="generate", max_tokens=7, temperature=0.0, ignore_eos=True)
    assert body == {
        "text": "hi",
        "sampling_params": {"max_new_tokens": 7, "temperature": 0.0, "ignore_eos": True},
        "stream": True,
    }
    assert requested_tokens(json.dumps(body).encode()) == 7
