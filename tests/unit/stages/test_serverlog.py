"""A server log's bounds (`stages/serverlog.py`): the file keeps a head and a tail of whole lines with a
marker between them that says exactly what was left out; real SGLang logs are kept whole; the live scan's
lines come from the stream whatever the file keeps. (The serve stage with a flooding server:
test_serve_bounds.py.)"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from servematrix.classify import classify_text
from servematrix.engines import load_engine
from servematrix.planning.plan import make_plan
from servematrix.run.serving import mode_check
from servematrix.stages import serverlog
from servematrix.stages.serverlog import LOG_BOUNDS, MARKER_PREFIX, BoundedLog, LiveLines, LogBounds

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
MARKER = re.compile(rb"\[servematrix\] log cut: (\d+) bytes \((\d+) lines\) of the server's output left out here\.")


def _numbered(count: int) -> bytes:
    return b"".join(b"line %05d %s\n" % (i, b"x" * (i % 37)) for i in range(count))


def _write(path: Path, data: bytes, bounds: LogBounds, *, seed: int = 1) -> BoundedLog:
    """`data` through a BoundedLog in pieces of random sizes, as the pump hands them over."""
    log = BoundedLog(path, bounds)
    rng = random.Random(seed)
    at = 0
    while at < len(data):
        size = rng.randint(1, 700)
        log.write(data[at : at + size])
        at += size
    log.close()
    return log


def _split(text: bytes) -> tuple[bytes, re.Match[bytes], bytes]:
    (found,) = list(MARKER.finditer(text))
    line_end = text.index(b"\n", found.start()) + 1
    return text[: found.start()], found, text[line_end:]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_log_past_its_bounds_keeps_whole_lines_of_its_head_and_tail_and_says_what_it_left_out(tmp_path, seed):
    data = _numbered(2000)
    bounds = LogBounds(head=1000, tail=3000)
    log = _write(tmp_path / "s.log", data, bounds, seed=seed)
    head, marker, tail = _split((tmp_path / "s.log").read_bytes())
    lines = data.splitlines(keepends=True)
    # The head: the most whole lines within its bound; the tail: likewise, from the end.
    kept_head = next(n for n in range(len(lines), -1, -1) if len(b"".join(lines[:n])) <= bounds.head)
    kept_tail = next(n for n in range(len(lines), -1, -1) if len(b"".join(lines[len(lines) - n :])) <= bounds.tail)
    assert head == b"".join(lines[:kept_head])
    assert tail == b"".join(lines[len(lines) - kept_tail :])
    # The marker says exactly how many bytes and lines are missing between them.
    assert int(marker[1]) == len(data) - len(head) - len(tail) == log.dropped
    assert int(marker[2]) == len(lines) - kept_head - kept_tail == log.dropped_lines
    assert lines[kept_head].startswith(b"line 000") and lines[len(lines) - kept_tail - 1] not in tail


def test_a_log_within_its_bounds_is_written_whole_and_one_line_more_is_cut(tmp_path):
    data = _numbered(300)
    bounds = LogBounds(head=len(data) // 2, tail=len(data) - len(data) // 2)
    _write(tmp_path / "whole.log", data, bounds)
    assert (tmp_path / "whole.log").read_bytes() == data
    _write(tmp_path / "cut.log", data + b"one more\n", bounds)
    _, marker, tail = _split((tmp_path / "cut.log").read_bytes())
    assert tail.endswith(b"one more\n") and int(marker[1]) > 0


def test_every_real_sglang_log_is_kept_whole_by_the_declared_bounds(tmp_path):
    logs = sorted(LOGS.glob("*.log"))
    largest = max(logs, key=lambda p: p.stat().st_size)
    assert largest.stat().st_size > 100_000  # the served-and-benchmarked H200 logs are among them
    for path in logs:
        data = path.read_bytes()
        _write(tmp_path / "copy.log", data, LOG_BOUNDS)
        assert (tmp_path / "copy.log").read_bytes() == data, path.name
    # Ten of the largest real log, back to back, are still whole.
    _write(tmp_path / "ten.log", largest.read_bytes() * 10, LOG_BOUNDS)
    assert MARKER_PREFIX.encode() not in (tmp_path / "ten.log").read_bytes()


def test_while_it_grows_the_file_stays_bounded_and_ends_with_the_newest_line(tmp_path):
    bounds = LogBounds(head=2000, tail=2000)
    path = tmp_path / "s.log"
    log = BoundedLog(path, bounds)
    marker_len = len(serverlog.gap_marker(10**9, 10**8, bounds))
    for i in range(3000):
        line = b"decode %06d\n" % i
        log.write(line)
        text = path.read_bytes()
        assert len(text) <= bounds.head + 2 * bounds.tail + marker_len + len(line)
        assert text.endswith(line)
    log.close()
    assert len(path.read_bytes()) <= bounds.head + bounds.tail + marker_len


def test_a_line_across_the_head_bound_starts_the_part_left_out(tmp_path):
    bounds = LogBounds(head=100, tail=50)
    data = b"a" * 60 + b"\n" + b"b" * 80 + b"\n" + b"c" * 200 + b"\n" + b"d" * 20 + b"\n"
    _write(tmp_path / "s.log", data, bounds)
    head, marker, tail = _split((tmp_path / "s.log").read_bytes())
    assert head == b"a" * 60 + b"\n"
    assert tail == b"d" * 20 + b"\n"
    assert int(marker[1]) == len(data) - len(head) - len(tail) and int(marker[2]) == 2


def test_the_marker_is_no_failure_and_no_mode_evidence():
    marker = serverlog.gap_marker(123456, 789, LOG_BOUNDS).decode()
    assert marker.startswith(MARKER_PREFIX) and "123456 bytes (789 lines)" in marker and "16 MiB" in marker
    for engine in ("sglang", "transformers"):
        assert classify_text(marker, engine) is None
    sglang = load_engine("sglang")
    for rule in sglang.mode_evidence:
        assert not any(text in marker for text in (*rule.applied, *rule.absent))


def test_a_failed_write_ends_the_files_writes_not_the_callers():
    log = BoundedLog(Path("/dev/full"), LogBounds(head=10, tail=10))  # every write: no space left on device
    log.write(b"first\n" * 20)
    assert isinstance(log.error, OSError) and log.dropped > 0  # the bounds are still kept, in memory
    log.close()


def test_live_lines_decode_a_character_split_between_reads_and_read_a_long_progress_bar_to_its_last_cr():
    lines = LiveLines()
    data = "ready ✓\n".encode()
    assert lines.feed(data[:7]) == [] and lines.feed(data[7:]) == ["ready ✓"]
    bar = "10%\r" * 20_000  # 80,000 characters, no newline
    found = lines.feed((bar + "Traceback (most recent call last):").encode())
    assert found == [bar] and lines.partial == "Traceback (most recent call last):"
    assert lines.flush() == ["Traceback (most recent call last):"] and lines.flush() == []


PIECEWISE_MATRIX = """
engine = "sglang"
[model]
name = "m"
path = "/models/m"
[axes]
sglang = ["0.5.12"]
torch = ["pinned"]
flashinfer = ["pinned"]
cuda = ["13.0"]
gpu = ["h200"]
mode = ["piecewise"]
[gpu.h200]
arch = "sm_90"
count = 1
[bench]
concurrency = [1]
input_len = 8
output_len = 8
prompts_per_concurrency = 2
"""


def test_a_real_log_followed_by_a_flood_still_proves_its_mode_from_the_head(tmp_path, write_matrix):
    """The declared bounds: the real H200 piecewise log, then 40 MiB of decode lines (a server flooding while
    it is benchmarked). The log is cut, and its head still holds the capture line that proves the mode."""
    (cell,) = make_plan(write_matrix(PIECEWISE_MATRIX)).cells
    real = (LOGS / "h200-sglang-0.5.12-piecewise-server.log").read_bytes()
    decode = b"[2026-12-03 06:26:06] Decode batch, #running-req: 1, #token: 299, token usage: 0.00\n"
    log = BoundedLog(tmp_path / "s.log", LOG_BOUNDS)
    log.write(real)
    block = decode * 4096
    for _ in range(40 * 2**20 // len(block) + 1):
        log.write(block)
    log.close()
    text = (tmp_path / "s.log").read_bytes()
    head, _, tail = _split(text)
    assert head.startswith(real) and len(head) <= LOG_BOUNDS.head and 0 < len(tail) <= LOG_BOUNDS.tail
    assert str(mode_check(load_engine("sglang"), cell, tmp_path / "s.log")) == "pass"
