"""A log's lines as the scanner reads them: split from a byte stream in bounded chunks, and shown safely.

`LineSplitter` splits on b"\\n" only and holds at most `limit` bytes of any line. `printable` removes
terminal control sequences and characters from a line (CSI, OSC such as OSC 52 which writes the clipboard,
DCS and the other strings, any other escape, C0 and C1 controls but tab), so no excerpt a log supplied can
drive the terminal it is printed on.
"""

from __future__ import annotations

import re

# Only the start of a line is scanned. Without a cap one 200 MB line (a dumped tensor, a progress bar
# without newlines) took minutes and hundreds of MB: every probe searches it, and it is kept as excerpt
# context and redacted. The longest real server_args dump is a few KiB; a signature's text is at the
# start of its line.
LINE_SCAN_MAX = 64 * 1024

# ECMA-48 / ISO 6429, 7- and 8-bit forms. A control string's body (OSC, DCS, SOS, PM, APC) stops at any
# control character: a string without its terminator costs a scan to the next control only, so the whole
# line stays linear, and then only its introducer is removed (the rest is plain text).
_TERMINAL_CONTROL = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"  # CSI: parameters, intermediates, final byte
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x00-\x1f\x7f-\x9f]*(?:\x07|\x1b\\|\x9c)"  # a terminated string
    r"|\x1b[ -/]*[0-~]?"  # any other escape (and a lone ESC)
    r"|[\x00-\x08\x0a-\x1f\x7f-\x9f]"  # any other C0 or C1 control character; tab stays
)


def printable(line: str) -> str:
    """`line` without terminal control sequences or control characters (tab stays)."""
    return line if line.isprintable() else _TERMINAL_CONTROL.sub("", line)


# (text, truncated): truncated says the line was longer than the limit and text is its start. A plain
# tuple, not a record class: one is made per log line, and a tuple is the cheapest thing to make.
LogLine = tuple[str, bool]


class LineSplitter:
    """Lines from a byte stream fed in chunks, holding at most `limit` bytes of any line.

    Splits on b"\n" only, so line numbers agree with editors and grep even when progress bars wrote
    bare carriage returns. The rest of a line past the limit is dropped as it arrives. Feed it the
    chunks of a file (classify_file) or of a log being written (the serve stage).
    """

    def __init__(self, limit: int = LINE_SCAN_MAX) -> None:
        self.limit = limit
        self._partial = b""
        self._truncated = False

    def feed(self, chunk: bytes) -> list[LogLine]:
        pieces = chunk.split(b"\n")
        if len(pieces) == 1:
            self._add(chunk)
            return []
        self._add(pieces[0])
        lines = [self._take()]
        limit = self.limit
        for piece in pieces[1:-1]:
            if len(piece) > limit:
                lines.append((piece[:limit].decode("utf-8", errors="replace"), True))
            else:
                lines.append((piece.decode("utf-8", errors="replace"), False))
        self._add(pieces[-1])
        return lines

    def flush(self) -> list[LogLine]:
        """The last line, when the stream ended without a newline."""
        if not self._partial and not self._truncated:
            return []
        return [self._take()]

    def _add(self, piece: bytes) -> None:
        if self._truncated:
            return
        room = self.limit - len(self._partial)
        if len(piece) > room:
            piece = piece[:room]
            self._truncated = True
        self._partial += piece

    def _take(self) -> LogLine:
        line = (self._partial.decode("utf-8", errors="replace"), self._truncated)
        self._partial = b""
        self._truncated = False
        return line
