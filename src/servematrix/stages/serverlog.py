"""A server's output on its way from its pipe: every line to the live scan, a bounded head and tail to its log.

The serve stage's pump (`pump`) redacts what the server writes line by line (`LineRedactingWriter`) and hands
it to the caller's `on_lines`, which scans every line for the ready line and fatal signatures, and to the log
file (`BoundedLog`), which keeps its first `LogBounds.head` and last `LogBounds.tail` bytes with a marker line
between (`gap_marker`): a flooding server cannot fill the disk, the scan still sees every line, and a crash's
traceback stays in the tail. The bounds, `LOG_BOUNDS`, are declared once here (docs/gpu-runners.md), well
above the largest real server logs.

More, with the measurements behind it: docs/design-notes.md#srcservematrixstagesserverlogpy
"""

from __future__ import annotations

import codecs
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from servematrix.store.redact import LineRedactingWriter, Redactor

MiB = 2**20


@dataclass(frozen=True)
class LogBounds:
    head: int  # bytes kept from the start of the output
    tail: int  # bytes kept from its end

    def __post_init__(self) -> None:
        if self.head < 0 or self.tail <= 0:
            raise ValueError(f"log bounds must be a head >= 0 and a tail > 0, got {self}")


# Every server log's bounds, declared once (docs/design-notes.md says why these).
LOG_BOUNDS = LogBounds(head=16 * MiB, tail=16 * MiB)

# The most of an unfinished line held: for the scan, and at the end of the head (past it, the head is cut inside
# the line).
PARTIAL_MAX = 64 * 1024

# The marker line's start: it is the harness's, not the server's.
MARKER_PREFIX = "[servematrix] log cut:"


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n} bytes"


def gap_marker(dropped_bytes: int, dropped_lines: int, bounds: LogBounds) -> bytes:
    """The line between the head and the tail of a cut log."""
    return (
        f"{MARKER_PREFIX} {dropped_bytes} bytes ({dropped_lines} lines) of the server's output left out here. "
        f"This log keeps the first {_size(bounds.head)} and the last {_size(bounds.tail)} of it; every line "
        "was scanned for the ready line and known causes as the server wrote it\n"
    ).encode()


class BoundedLog:
    """A log file that keeps the head and the tail of what is written to it, written through (unbuffered) so
    it can be read while it grows. A log of at most `head + tail` bytes is kept whole. Past the head, what is
    written is appended and its last `tail` bytes are also held in memory; once more than twice the tail is
    past the head, the file is cut back to the head's last whole line, the marker and the last `tail` bytes
    from a line start. `close` leaves at most head, marker and tail.

    Only one thread writes. A write that fails (a full disk) ends the file's writes, never the caller's:
    `error` says why."""

    def __init__(self, path: Path, bounds: LogBounds = LOG_BOUNDS) -> None:
        self.bounds = bounds
        self.error: OSError | None = None
        self.dropped = 0  # bytes of output left out of the file so far
        self.dropped_lines = 0
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o666)
        self._head_left = bounds.head
        self._head_written = 0
        self._head_end = 0  # where a cut file's head ends: after the head's last newline
        self._head_ends_line = True
        self._head_partial = b""  # the head's bytes after `_head_end` (one line, at most PARTIAL_MAX)
        self._over = 0  # bytes past the head's bound
        self._past = 0  # bytes past `_head_end`, and their newlines
        self._past_lines = 0
        self._in_file = 0  # of those, the bytes now in the file (after the marker, if any)
        self._recent: deque[bytes] = deque()  # the newest bytes past `_head_end`, at least `tail` of them
        self._recent_bytes = 0
        self._before_recent_ends_line = True  # whether the byte before `_recent` ends a line

    def write(self, data: bytes) -> None:
        if self._head_left and data:
            data = self._head(data)
        if not data:
            return
        self._append(data)
        self._over += len(data)
        self._past_bytes(data)
        if self._in_file > 2 * self.bounds.tail:
            self._cut()

    def close(self) -> None:
        if self._fd is None:
            return
        if self._over > self.bounds.tail:
            self._cut()
        os.close(self._fd)
        self._fd = None

    def _head(self, data: bytes) -> bytes:
        """Write what fits in the head; return the rest."""
        part = data[: self._head_left]
        self._append(part)
        self._head_left -= len(part)
        newline = part.rfind(b"\n")
        if newline >= 0:
            self._head_end = self._head_written + newline + 1
            self._head_ends_line = True
            self._head_partial = part[newline + 1 :]
        else:
            self._head_partial += part
        self._head_written += len(part)
        if len(self._head_partial) > PARTIAL_MAX:  # a line too long to move out of the head: cut inside it
            self._head_end = self._head_written
            self._head_ends_line = False
            self._head_partial = b""
        if not self._head_left:  # the head's unfinished last line belongs to what a cut may leave out
            self._before_recent_ends_line = self._head_ends_line
            self._past_bytes(self._head_partial)
            self._head_partial = b""
        return data[len(part) :]

    def _past_bytes(self, data: bytes) -> None:
        if not data:
            return
        self._past += len(data)
        self._past_lines += data.count(b"\n")
        self._in_file += len(data)
        self._recent.append(data)
        self._recent_bytes += len(data)
        while self._recent_bytes - len(self._recent[0]) >= self.bounds.tail:
            dropped = self._recent.popleft()
            self._recent_bytes -= len(dropped)
            self._before_recent_ends_line = dropped.endswith(b"\n")

    def _cut(self) -> None:
        """Cut the file back to its head, the marker and the newest `tail` bytes, from a line start (trimmed in
        place: no copy of the tail is made)."""
        pieces = self._recent
        excess = self._recent_bytes - self.bounds.tail
        starts_line = self._before_recent_ends_line
        if excess > 0:  # `_past_bytes` leaves less than a piece too many
            starts_line = pieces[0][excess - 1] == 0x0A
            pieces[0] = pieces[0][excess:]
            self._recent_bytes -= excess
        if not starts_line:
            for i, piece in enumerate(pieces):
                if (newline := piece.find(b"\n")) >= 0:
                    for _ in range(i):
                        self._recent_bytes -= len(pieces.popleft())
                    pieces[0] = pieces[0][newline + 1 :]
                    self._recent_bytes -= newline + 1
                    starts_line = True
                    break
        self._before_recent_ends_line = starts_line  # a tail of one line without end starts inside it
        dropped = self._past - self._recent_bytes
        if dropped == self.dropped:
            return
        self.dropped = dropped
        self.dropped_lines = self._past_lines - sum(piece.count(b"\n") for piece in pieces)
        self._in_file = self._recent_bytes
        if self._fd is None or self.error is not None:
            return
        try:
            os.ftruncate(self._fd, self._head_end)
        except OSError as exc:
            self.error = exc
            return
        self._append((b"" if self._head_ends_line else b"\n") + gap_marker(dropped, self.dropped_lines, self.bounds))
        for piece in pieces:
            self._append(piece)

    def _append(self, data: bytes) -> None:
        if self._fd is None or self.error is not None or not data:
            return
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            self.error = exc


class LiveLines:
    """Whole lines, decoded, from the redacted bytes of a log being written: what the live scan reads. An
    unfinished line is held up to PARTIAL_MAX characters; a progress bar that only writes `\\r` past that is
    read up to its last one (a traceback printed on the same line stays whole)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.partial = ""

    def feed(self, data: bytes) -> list[str]:
        lines = (self.partial + self._decoder.decode(data)).split("\n")
        self.partial = lines.pop()
        if len(self.partial) > PARTIAL_MAX:
            cut = self.partial.rfind("\r") + 1
            if not cut or len(self.partial) - cut > PARTIAL_MAX:
                cut = len(self.partial)
            lines.append(self.partial[:cut])
            self.partial = self.partial[cut:]
        return lines

    def flush(self) -> list[str]:
        """The last line, when the output ended without a newline."""
        rest = self.partial + self._decoder.decode(b"", final=True)
        self.partial = ""
        return [rest] if rest else []


class _Tee:
    """Where the redacting writer writes: the file first (a line the scan reports is already in it), then
    the scan."""

    def __init__(self, log: BoundedLog, on_lines: Callable[[list[str]], None], lines: LiveLines) -> None:
        self._log = log
        self._on_lines = on_lines
        self._lines = lines

    def write(self, data: bytes) -> None:
        self._log.write(data)
        if lines := self._lines.feed(data):
            self._on_lines(lines)

    def close(self) -> None:
        if lines := self._lines.flush():
            self._on_lines(lines)


READ_BYTES = 65536


def pump(
    stream: IO[bytes],
    log: BoundedLog,
    redactor: Redactor,
    on_lines: Callable[[list[str]], None],
    lines: LiveLines | None = None,
) -> None:
    """Copy a server's output to its log and to `on_lines`, redacted line by line, until the server closes it
    (run as the serve stage's log thread). `on_lines` gets every line, split by `lines`; the log keeps its
    bounds."""
    tee = _Tee(log, on_lines, lines or LiveLines())
    writer = LineRedactingWriter(tee, redactor)
    try:
        while chunk := os.read(stream.fileno(), READ_BYTES):
            writer.write(chunk)
    except OSError:
        pass
    finally:
        try:
            writer.close()
            tee.close()
        finally:
            log.close()
            stream.close()
