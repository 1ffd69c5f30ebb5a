"""The log writer's redaction rate (issue 38: about 3 MB/s, so a server that logs faster blocks on its stdout).

8 MB of sglang decode lines (which name `token`) and 8 MB of lines that name no secret word, through
`LineRedactingWriter` in 64 KiB chunks, as the serve stage's pump feeds it; against the same text with every
pattern run over every chunk (what the writer did before the patterns were filtered by their literals), in the
same run. Prints MB/s and the ratio. A benchmark, not a timed assertion: the assertions check the output is
the same. And the serve stage's whole pump (`stages/serverlog.py`) on a process flooding 1 kB lines (attack L2
of 2026-12-06): redacted, its file bounded and every line scanned, against the same pump without the scan.
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


# A server flooding 1 kB decode lines (attack L2 of 2026-12-06), from a real process through a real pipe.
FLOODER = """
import os, sys
line = b"[2026-12-03 06:26:06] Decode batch, #running-req: 1, #token: 299, token usage: 0.00, gen throughput "
line += b"x" * (1023 - len(line)) + b"\\n"  # 1 kB
block = line * 64
for _ in range(int(sys.argv[1]) // len(block)):
    os.write(1, block)
"""


def _flood_through_pump(tmp_path, size: int, on_lines) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    from servematrix.stages.serverlog import BoundedLog, LogBounds, pump

    redactor = Redactor.for_launch(["python", "-m", "sglang"], dict(os.environ), ())
    log = BoundedLog(tmp_path / "flood.log", LogBounds(head=4 * 2**20, tail=4 * 2**20))
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", FLOODER, str(size)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    pump(proc.stdout, log, redactor, on_lines)
    proc.wait()
    return time.perf_counter() - started, (tmp_path / "flood.log").stat().st_size


def test_the_pump_scans_every_line_of_a_flood_and_bounds_its_file(tmp_path):
    """The serve stage's pump on 32 MB of 1 kB lines: redacted, bounded to 8 MiB and every line scanned by the
    engine's signatures, against the same pump with no scan, in the same run. Prints MB/s and the ratio (the
    scan's cost to a server that logs faster than the pump takes it)."""
    from servematrix.classify import LogScanner

    size = 32 * 2**20
    scanner = LogScanner("sglang")
    seen = [0]

    def scan(lines: list[str]) -> None:
        seen[0] += len(lines)
        for line in lines:
            scanner.feed(line)

    scanned_s, scanned_size = _flood_through_pump(tmp_path, size, scan)
    plain_s, plain_size = _flood_through_pump(tmp_path, size, lambda lines: None)
    lines = size // 1024 // 64 * 64
    assert seen[0] == scanner.line_count == lines and scanner.best() is None
    assert scanned_size == plain_size <= 8 * 2**20 + 300
    mb = size / 2**20
    print(f"\npump, 1 kB lines: {mb / scanned_s:.1f} MB/s scanned; {mb / plain_s:.1f} MB/s without the scan "
          f"({scanned_s / plain_s:.2f}x); file {scanned_size / 2**20:.1f} MiB of {mb:.0f} MiB")  # fmt: skip
