"""The log writer's redaction rate (issue 38: about 3 MB/s, so a server that logs faster blocks on its stdout).

8 MB of sglang decode lines (which name `token`) and 8 MB of lines that name no secret word, through
`LineRedactingWriter` in 64 KiB chunks, as the serve stage's pump feeds it; against the same text with every
pattern run over every chunk (what the writer did before the patterns were filtered by their literals), in the
same run. Prints MB/s and the ratio. A benchmark, not a timed assertion: the assertions check the output is
the same.
"""

from __future__ import annotations

import io
import os
import time

import pytest

from servematrix.store import redact
from servematrix.store.redact import LineRedactingWriter, Redactor

DECODE = (
    b"[2026-01-01 00:00:00 TP0] Decode batch. #running-req: 8, #token: 1234, token usage: 0.01, "
    b"gen throughput (token/s): 512.3, #queue-req: 0\n"
)
PLAIN = b"[2026-01-01 00:00:00 TP0] Prefill batch. #new-seq: 1, #new-tok: 64, #cached: 0, #running-req: 0\n"
pytestmark = pytest.mark.slow

SECRETS = b"hf_" + b"Wd2" * 10 + b" api_key=k3y-abcdefghijklmnop Authorization: Bearer abcdefghijkl\n"


def _every_pattern(text: str, known, flag_pattern) -> str:  # type: ignore[no-untyped-def]
    text = redact.strip_terminal_controls(text)
    for value in known:
        if value in text:
            text = text.replace(value, redact.REDACTED)
    for pattern, replacement in redact._TOKEN_SHAPES:
        text = pattern.sub(replacement, text)
    if flag_pattern is not None:
        text = flag_pattern.sub(redact._replace_flag_value, text)
    text = redact._FLAG_SECRET.sub(redact._replace_assigned, text)
    return redact._ASSIGNED_SECRET.sub(redact._replace_assigned, text)


def _pump(data: bytes, redactor: Redactor) -> tuple[bytes, float]:
    sink = io.BytesIO()
    writer = LineRedactingWriter(sink, redactor)
    started = time.perf_counter()
    for i in range(0, len(data), 65536):
        writer.write(data[i : i + 65536])
    writer.close()
    return sink.getvalue(), time.perf_counter() - started


def test_the_log_writer_redacts_fast(monkeypatch):
    env = {**os.environ, "MY_SECRET": "s3cr3t-value-xyz"}
    redactor = Redactor.for_launch(["python", "-m", "sglang", "--api-key", "k3y-abcdefghijklmnop"], env, ["--api-key"])
    for name, line in (("decode lines", DECODE), ("plain lines", PLAIN)):
        data = line * (8 * 2**20 // len(line)) + SECRETS
        now, now_s = _pump(data, redactor)
        monkeypatch.setattr(redact, "_redact", _every_pattern)
        before, before_s = _pump(data, redactor)
        monkeypatch.undo()
        assert now == before and b"k3y-" not in now and b"Wd2Wd2" not in now
        mb = len(data) / 2**20
        print(f"\nlog writer, {name}: {mb / now_s:.1f} MB/s; every pattern on every chunk: {mb / before_s:.1f} MB/s "
              f"({before_s / now_s:.1f}x)")  # fmt: skip
