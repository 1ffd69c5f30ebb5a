"""Traceback frames as evidence: a log's Python frames (`  File "…/x.py", line N, in fn`), read line by line
in constant memory, and the frame sequences of the signature data matched against them as they arrive.

A *run* of frames is what one listing shows: a `Traceback (most recent call last):` (also after a log prefix,
as sglang's "Scheduler hit an exception: Traceback …" prints it), dynamo's `from user code:` block, or frame
lines that start without a header (a log cut at its start). Indented source and caret lines and blank lines
continue a run; any other line ends it, and that line is the run's last word (the exception line, when the
listing was a traceback).

A rule's frames are regexes searched in `path:function` of each frame (e.g.
`…/sglang/srt/model_executor/cuda_graph_runner.py:capture_one_batch_size`), in call order with gaps allowed:
`a`, `b` matches a run that reaches a frame matching `a` and, later (deeper), one matching `b`. Matching is
greedy and incremental (for each rule, the index of the next frame it waits for), so no run is held in
memory, and a run cut off before its exception line (a truncated log) still matches its frames. A rule with
`raises` also needs the line that ends the run to match it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servematrix.classify.signatures import FrameRule

# `File "<path>", line <n>, in <function>`: paths as Python prints them, including `<frozen runpy>`,
# `<string>` and paths a redaction shortened to `.../site-packages/x.py`.
FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')
_TRACEBACK = "Traceback (most recent call last):"
_USER_CODE = "from user code:"
_STARTS = (_TRACEBACK, _USER_CODE)
# A frame is shown as its file's last two path components and its function.
_SHOWN_PARTS = 2


@dataclass(frozen=True, kw_only=True)
class Frame:
    path: str
    line: int
    function: str

    @property
    def key(self) -> str:
        """What a rule's frame pattern is searched in."""
        return f"{self.path}:{self.function}"

    @property
    def shown(self) -> str:
        """`model_executor/cuda_graph_runner.py:1195 capture_one_batch_size`: short enough for a table."""
        parts = self.path.replace("\\", "/").split("/")
        return f"{'/'.join(parts[-_SHOWN_PARTS:])}:{self.line} {self.function}"


@dataclass(frozen=True, kw_only=True)
class FrameHit:
    """A rule whose frames (and exception line, if it names one) one run of the log satisfied."""

    rule: FrameRule
    signature: str
    evidence: str | None  # the evidence label, or None when the rule decides the class
    line: int  # the log line that completed it: the last frame needed, or the exception line
    text: str  # that line
    frames: tuple[Frame, ...]  # the frames that matched the rule's patterns, outermost first


class _Progress:
    __slots__ = ("done", "frames", "next")

    def __init__(self) -> None:
        self.next = 0
        self.frames: list[Frame] = []
        self.done = False


class FrameTracker:
    """Feeds log lines, reports each rule the first time a run satisfies it.

    Memory is bounded by the rules: a run is never stored, only each rule's progress through it (at most
    its own number of frames)."""

    def __init__(self, rules: tuple[tuple[str, str | None, FrameRule], ...]) -> None:
        self._rules = rules  # (signature id, evidence label or None, rule)
        self._in_run = False
        self._progress: list[_Progress] = []
        self._reported: set[int] = set()  # indexes of rules already reported
        patterns = {pattern.pattern for _, _, rule in rules for pattern in rule.frames}
        self._any = re.compile("|".join(f"(?:{pattern})" for pattern in sorted(patterns)) or r"(?!)")

    def feed(self, number: int, text: str) -> list[FrameHit]:
        if not self._rules:
            return []
        # Most lines are neither frames nor headers: two substring tests reject them.
        if 'File "' in text:
            found = FRAME.match(text)
            if found is not None:
                if not self._in_run:
                    self._start()
                return self._frame(number, text, found)
        if not self._in_run:
            if _TRACEBACK in text or text.startswith(_USER_CODE):
                self._start()
            return []
        stripped = text.lstrip()
        if not stripped:
            return []  # blank lines inside a listing (dynamo's, between its parts)
        if stripped.startswith(_STARTS) or (text[0] not in " \t" and _TRACEBACK in text):
            # A new listing; "During handling of the above exception" and its kind end the previous one
            # first (they are plain lines).
            self._start()
            return []
        if text[0] in " \t":
            return []  # source lines and carets inside a listing
        self._in_run = False
        return self._end(number, text)

    def _start(self) -> None:
        self._in_run = True
        self._progress = [_Progress() for _ in self._rules]

    def _frame(self, number: int, text: str, found: re.Match[str]) -> list[FrameHit]:
        key = f"{found.group('path')}:{found.group('function')}"
        if not self._any.search(key):
            return []  # most frames are in no rule: one search rejects them
        frame = None
        hits = []
        for index, ((_, _, rule), progress) in enumerate(zip(self._rules, self._progress, strict=True)):
            if progress.done or index in self._reported or not rule.frames[progress.next].search(key):
                continue
            if frame is None:
                frame = Frame(path=found.group("path"), line=int(found.group("line")), function=found.group("function"))
            progress.frames.append(frame)
            progress.next += 1
            if progress.next == len(rule.frames):
                progress.done = True
                if rule.raises is None:
                    hits.append(self._hit(index, number, text, progress))
        return hits

    def _end(self, number: int, text: str) -> list[FrameHit]:
        hits = []
        for index, ((_, _, rule), progress) in enumerate(zip(self._rules, self._progress, strict=True)):
            if not progress.done or rule.raises is None or index in self._reported:
                continue
            if rule.raises.search(text):
                hits.append(self._hit(index, number, text, progress))
        self._progress = []
        return hits

    def _hit(self, index: int, number: int, text: str, progress: _Progress) -> FrameHit:
        """Rule `index` decided at line `number`: reported once per log."""
        self._reported.add(index)
        signature, evidence, rule = self._rules[index]
        frames = tuple(progress.frames)
        return FrameHit(rule=rule, signature=signature, evidence=evidence, line=number, text=text, frames=frames)


def shown(frames: tuple[Frame, ...]) -> str:
    return " → ".join(frame.shown for frame in frames)
