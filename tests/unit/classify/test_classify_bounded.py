"""Classifying stays linear and bounded on long lines: a line is read in chunks and scanned in its first
LINE_SCAN_MAX characters, and the verdict says which lines were cut (a 200 MB single-line log took
5 min 37 s and 662 MB before)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from servematrix.classify import (
    LINE_SCAN_MAX,
    READ_CHUNK,
    LineSplitter,
    LogScanner,
    classify_file,
    classify_text,
    scan_stream,
)

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
DYNAMO = "dynamo-untraceable-sglang-0.5.10.log"
FATAL = (LOGS / DYNAMO).read_text(encoding="utf-8").split("\n")[21]  # the deciding line of that fixture


class GeneratedLog:
    """A binary stream whose first line is `long_line` bytes, made as it is read. It has no readline and
    no iteration, and refuses reads larger than 1 MiB: only a scanner that reads in bounded chunks and
    never holds the whole line gets through it."""

    def __init__(self, long_line: int, rest: bytes) -> None:
        self.left = long_line
        self.rest = rest
        self.largest_read = 0

    def read(self, size: int = -1) -> bytes:
        assert 0 < size <= 1 << 20, f"read({size}) would read the whole line"
        self.largest_read = max(self.largest_read, size)
        if self.left:
            n = min(size, self.left)
            self.left -= n
            return b"x" * n
        out, self.rest = self.rest[:size], self.rest[size:]
        return out


def test_a_200_mb_line_is_read_in_chunks_and_memory_stays_bounded():
    log = GeneratedLog(200 * 1024 * 1024, b"\n" + FATAL.encode() + b"\nafter\n")
    tracemalloc.start()
    try:
        scanner = scan_stream(log, "sglang", env={})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert log.left == 0 and log.largest_read == READ_CHUNK
    # A few chunks and one capped line, not 200 MB.
    assert peak < 8 * LINE_SCAN_MAX + 4 * READ_CHUNK + (1 << 20), peak
    best = scanner.best()
    assert best is not None and (best.cls, best.line) == ("dynamo-untraceable", 2)
    assert f"line 1 truncated to {LINE_SCAN_MAX} chars for scanning" in best.evidence
    assert scanner.line_count == 3


def test_classify_file_names_the_cut_line_on_stderr(tmp_path, capsys):
    log = tmp_path / "server.log"
    log.write_bytes(b"start\n" + b"y" * (3 * LINE_SCAN_MAX) + b"\n" + FATAL.encode() + b"\n")
    result = classify_file(log, "sglang", env={})
    assert (result["class"], result["line"]) == ("dynamo-untraceable", 3)
    assert set(result) == {"class", "title", "line", "excerpt"}  # the contract's shape is unchanged
    # The long line is in the excerpt's context, clipped for people.
    assert max(len(line) for line in result["excerpt"].split("\n")) < 2 * 1000
    err = capsys.readouterr().err
    assert f"{log}: line 2 truncated to {LINE_SCAN_MAX} chars for scanning" in err


def test_no_note_when_no_line_was_cut(tmp_path, capsys):
    log = tmp_path / "server.log"
    log.write_bytes(b"x" * LINE_SCAN_MAX + b"\n" + FATAL.encode() + b"\n")  # exactly at the cap
    match = scan_stream(log.open("rb"), "sglang", env={}).best()
    assert match is not None and match.cls == "dynamo-untraceable"
    assert not any("truncated" in label for label in match.evidence)
    classify_file(log, "sglang", env={})
    assert "truncated" not in capsys.readouterr().err


def test_a_signature_at_the_start_of_a_long_line_is_found_and_the_verdict_says_it_was_cut():
    scanner = LogScanner("sglang", env={})
    scanner.feed(FATAL + " " + "z" * (2 * LINE_SCAN_MAX))
    scanner.feed("x" * (LINE_SCAN_MAX + 1))
    best = scanner.best()
    assert best is not None and best.cls == "dynamo-untraceable"
    assert f"2 lines truncated to {LINE_SCAN_MAX} chars for scanning (first: line 1)" in best.evidence
    assert scanner.truncation_note in best.label


def test_only_the_start_of_a_line_is_scanned():
    """The cap is real: text past it is not searched (which is why the verdict says a line was cut)."""
    assert classify_text("z" * LINE_SCAN_MAX + FATAL + "\n", "sglang") is None
    assert (
        classify_text("z" * (LINE_SCAN_MAX - len(FATAL) - 1) + " " + FATAL + "\n", "sglang").cls == "dynamo-untraceable"
    )


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 64, 4096])
def test_line_splitter_gives_the_same_lines_for_any_chunking(chunk_size):
    data = b"one\r\ntwo\n\nthree " + b"L" * 50 + b"\nfour\xff\nlast without newline"
    splitter = LineSplitter(limit=20)
    lines = []
    for start in range(0, len(data), chunk_size):
        lines += splitter.feed(data[start : start + chunk_size])
    lines += splitter.flush()
    assert lines == [
        ("one\r", False),
        ("two", False),
        ("", False),
        ("three " + "L" * 14, True),
        ("four\ufffd", False),
        ("last without newline", False),
    ]


def test_line_splitter_line_of_exactly_the_limit_is_whole():
    splitter = LineSplitter(limit=4)
    assert splitter.feed(b"abcd\nabcde\n") == [("abcd", False), ("abcd", True)]
    assert splitter.flush() == []
    assert LineSplitter(limit=4).flush() == []
