"""Scanning a log against an engine's signatures: a whole log (`classify_text`, `classify_file`,
`scan_stream`) or one being written (`LogScanner.feed`, which reports the first fatal line so the harness can
kill a doomed server instead of waiting out its launch timeout).

A log usually matches several signatures: the scheduler dies after every failure, and a traceback follows
most. The most specific cause wins (highest priority), and the earliest line among equals. Secondary
"evidence" patterns found anywhere in the log qualify the winner, e.g. `dynamo-untraceable (flashinfer fp4
JIT)`. Both stay linear and bounded however long a line is: files are read in chunks (LineSplitter), only
the first LINE_SCAN_MAX characters of a line are scanned, and a match's evidence says which lines were cut.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from servematrix.classify.frames import Frame, FrameHit, FrameTracker, shown
from servematrix.classify.lines import LINE_SCAN_MAX, LineSplitter, printable
from servematrix.classify.prefilter import Probe
from servematrix.classify.signatures import IMPORT_CONFLICT, PLACEHOLDER, Signature, Signatures, load_signatures
from servematrix.classify.tracebacks import TracebackReader
from servematrix.errors import InputError, Location
from servematrix.store.redact import redact

EXCERPT_BEFORE = 3
# Error messages continue downwards (the dynamo explanation, sglang's hint), so show more after.
EXCERPT_AFTER = 5
# A single log line can be a whole server_args dump; the excerpt is for people and tables.
EXCERPT_LINE_MAX = 1000
# Files and streams are read in blocks of this size, never a line at a time, so that a line without a
# newline is never held whole.
READ_CHUNK = 64 * 1024


@dataclass(frozen=True, kw_only=True)
class Match:
    cls: str
    title: str
    line: int
    excerpt: str
    evidence: tuple[str, ...]
    fatal: bool
    explanation: str
    workaround: str
    # The traceback frames that decided the class (outermost first), when a [[signature.traceback]] did.
    frames: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.cls} ({', '.join(self.evidence)})" if self.evidence else self.cls

    def to_contract(self) -> dict[str, Any]:
        return {"class": self.cls, "title": self.title, "line": self.line, "excerpt": self.excerpt}


NO_MATCH: dict[str, Any] = {"class": None, "title": None, "line": None, "excerpt": None}


class _Candidate:
    """The first line of one class, with the context collected so far."""

    __slots__ = ("after_missing", "context", "frames", "line", "rule", "signature")

    def __init__(
        self, signature: Signature, line: int, before: list[str], text: str, hit: FrameHit | None = None
    ) -> None:
        self.signature = signature
        self.line = line
        self.context = [*before, text]
        self.after_missing = EXCERPT_AFTER
        self.rule = hit.rule.label if hit is not None else None
        self.frames: tuple[Frame, ...] = hit.frames if hit is not None else ()


class LogScanner:
    """Incremental classifier for a log that is still being written.

    `feed(line)` returns a Match the first time a fatal signature is seen, so the harness can abort
    early. The decisive cause may be printed after the generic line that first revealed the failure
    (a traceback after "Scheduler hit an exception"), so before killing a server, feed what is already
    in its log and ask `best()`, which re-ranks everything seen.

    Feed whole lines: a caller reading a growing file keeps an unterminated last line until it ends.
    Line numbers count across feeds, from 1.
    """

    def __init__(self, engine: str | Signatures, *, env: Mapping[str, str] | None = None) -> None:
        self.signatures = load_signatures(engine) if isinstance(engine, str) else engine
        self._env = env
        self._line_count = 0
        self._before: deque[str] = deque(maxlen=EXCERPT_BEFORE)
        self._candidates: dict[str, _Candidate] = {}
        self._collecting: list[_Candidate] = []
        self._evidence_seen: set[tuple[str, str]] = set()
        self._evidence_text: dict[tuple[str, str], str] = {}  # labels with placeholders, filled
        self._fatal_reported = False
        self._ranked = sorted(self.signatures, key=lambda s: -s.priority)
        self._tracebacks = TracebackReader()  # an import-time failure between two packages names both
        self._frames = FrameTracker(self.signatures.frame_rules)  # classes and evidence decided by frames
        self._truncated: list[int] = []  # the first few line numbers cut to LINE_SCAN_MAX
        self._truncated_count = 0

    @property
    def line_count(self) -> int:
        return self._line_count

    @property
    def truncation_note(self) -> str | None:
        """Which lines were scanned only in part, for the verdict: a match past the cap was not seen."""
        if not self._truncated_count:
            return None
        if self._truncated_count == 1:
            return f"line {self._truncated[0]} truncated to {LINE_SCAN_MAX} chars for scanning"
        return (
            f"{self._truncated_count} lines truncated to {LINE_SCAN_MAX} chars for scanning "
            f"(first: line {self._truncated[0]})"
        )

    def feed(self, line: str, *, truncated: bool = False) -> Match | None:
        """Scan one line (a trailing newline is ignored; embedded newlines start new lines).

        `truncated` says the caller already cut the line (as LineSplitter does)."""
        if line.endswith("\n"):
            line = line[:-1]
        if "\n" not in line:
            return self._scan(line, truncated)
        first_fatal = None
        for piece in line.split("\n"):
            found = self._scan(piece)
            first_fatal = first_fatal or found
        return first_fatal

    def best(self) -> Match | None:
        """The most specific match over everything fed so far."""
        winner = max(self._candidates.values(), key=lambda c: (c.signature.priority, -c.line), default=None)
        conflict = self._import_conflict()
        if conflict is not None and (winner is None or winner.signature.priority < conflict[0].priority):
            return conflict[1]
        return self._match(winner) if winner is not None else None

    def failing_a_pass(self) -> Match | None:
        """The most specific match of a signature that fails even a server that passed (`fails_a_pass`)."""
        found = [c for c in self._candidates.values() if c.signature.fails_a_pass]
        winner = max(found, key=lambda c: (c.signature.priority, -c.line), default=None)
        return self._match(winner) if winner is not None else None

    def _import_conflict(self) -> tuple[Signature, Match] | None:
        """The traceback reader's finding, as the engine's `import-dependency-conflict` class (if it has one)."""
        signature = self.signatures.get(IMPORT_CONFLICT)
        if signature is None or self._tracebacks.found is None:
            return None
        number, conflict, tail = self._tracebacks.found
        evidence = f"{conflict.raised_in} (imported by {conflict.imported_by})"
        match = Match(
            cls=signature.id,
            title=signature.title,
            line=number,
            excerpt="\n".join(_clip(line) for line in redact("\n".join(tail), self._env).split("\n")),
            evidence=(evidence,),
            fatal=signature.fatal,
            explanation=signature.explanation,
            workaround=signature.workaround,
        )
        return signature, match

    def matches(self) -> list[Match]:
        """Every class seen, best first."""
        ranked = sorted(self._candidates.values(), key=lambda c: (-c.signature.priority, c.line))
        return [self._match(candidate) for candidate in ranked]

    def _scan(self, text: str, truncated: bool = False) -> Match | None:
        self._line_count += 1
        number = self._line_count
        if len(text) > LINE_SCAN_MAX:
            text = text[:LINE_SCAN_MAX]
            truncated = True
        if truncated:
            self._truncated_count += 1
            if len(self._truncated) < 3:
                self._truncated.append(number)
        if text.endswith("\r"):
            text = text[:-1]
        text = printable(text)  # the excerpt is printed and published: no terminal control survives
        self._tracebacks.feed(number, text)
        if self._collecting:
            self._collect_after(text)
        fatal: _Candidate | None = None
        frame_hits = self._frames.feed(number, text)
        if frame_hits:
            fatal = self._record_frames(number, text, frame_hits)
        hits = self.signatures.prefilter.hits(text)
        if hits:
            matched = set()
            for probe in hits:
                if probe.evidence is None:
                    matched.add(probe.signature)
                elif (probe.signature, probe.evidence) not in self._evidence_seen:
                    self._evidence_seen.add((probe.signature, probe.evidence))
                    self._fill_evidence(probe, text)
            if matched:
                by_line = self._record_classes(number, text, matched)
                if by_line is not None and (fatal is None or fatal.signature.priority < by_line.signature.priority):
                    fatal = by_line
        self._before.append(text)
        if fatal is None:
            return None
        self._fatal_reported = True
        return self._match(fatal)

    def _fill_evidence(self, probe: Probe, text: str) -> None:
        """An evidence label with placeholders, filled from its first matching line."""
        signature = self.signatures.get(probe.signature)
        evidence = next((e for e in signature.evidence if e.label == probe.evidence), None) if signature else None
        found = probe.pattern.search(text)
        if evidence is not None and found is not None and PLACEHOLDER.search(evidence.label):
            self._evidence_text[(probe.signature, evidence.label)] = evidence.text(found)

    def _record_classes(self, number: int, text: str, matched: set[str]) -> _Candidate | None:
        fatal = None
        for signature in self._ranked:
            if signature.id in self._candidates or signature.id not in matched:
                continue
            candidate = _Candidate(signature, number, list(self._before), text)
            self._candidates[signature.id] = candidate
            self._collecting.append(candidate)
            # Ranked order: the first fatal class on this line is the most specific one.
            if signature.fatal and fatal is None and not self._fatal_reported:
                fatal = candidate
        return fatal

    def _record_frames(self, number: int, text: str, hits: list[FrameHit]) -> _Candidate | None:
        """Classes a traceback's frames decided, and evidence they showed."""
        fatal = None
        for hit in hits:
            if hit.evidence is not None:
                self._evidence_seen.add((hit.signature, hit.evidence))
                continue
            signature = self.signatures.get(hit.signature)
            if signature is None or signature.id in self._candidates:
                continue
            candidate = _Candidate(signature, number, list(self._before), text, hit)
            self._candidates[signature.id] = candidate
            self._collecting.append(candidate)
            outranks = fatal is None or fatal.signature.priority < signature.priority
            if signature.fatal and not self._fatal_reported and outranks:
                fatal = candidate
        return fatal

    def _collect_after(self, text: str) -> None:
        still = []
        for candidate in self._collecting:
            candidate.context.append(text)
            candidate.after_missing -= 1
            if candidate.after_missing > 0:
                still.append(candidate)
        self._collecting = still

    def _match(self, candidate: _Candidate) -> Match:
        signature = candidate.signature
        # Redact before clipping, so a secret cut in half by the clip is still recognised.
        context = candidate.context
        if candidate.frames:
            # The frames that decided come first, so the excerpt shows them however far apart they were.
            context = [
                f"frames that decided ({candidate.rule}):",
                *(f"  {f.shown}" for f in candidate.frames),
                *context,
            ]
        redacted = redact("\n".join(context), self._env)
        excerpt = "\n".join(_clip(line) for line in redacted.split("\n"))
        evidence = []
        groups: set[str] = set()
        for entry in signature.evidence:
            if (signature.id, entry.label) not in self._evidence_seen or entry.group in groups:
                continue
            if entry.group is not None:
                groups.add(entry.group)
            evidence.append(self._evidence_text.get((signature.id, entry.label), entry.label))
        if candidate.frames:
            evidence.append(f"frames: {shown(candidate.frames)}")
        if self.truncation_note:
            evidence.append(self.truncation_note)
        return Match(
            cls=signature.id,
            title=signature.title,
            line=candidate.line,
            excerpt=excerpt,
            evidence=tuple(evidence),
            fatal=signature.fatal,
            explanation=signature.explanation,
            workaround=signature.workaround,
            frames=tuple(frame.shown for frame in candidate.frames),
        )


def _clip(line: str) -> str:
    return line if len(line) <= EXCERPT_LINE_MAX else line[:EXCERPT_LINE_MAX] + " …"


def classify_text(text: str, engine: str | Signatures, *, env: Mapping[str, str] | None = None) -> Match | None:
    """The most specific known cause in a whole log, or None."""
    scanner = LogScanner(engine, env=env)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for line in lines:
        scanner._scan(line)
    return scanner.best()


def classify_file(
    path: Path | str, engine: str | Signatures, *, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The design contract `{class, title, line, excerpt}`; every value is None when nothing matches.
    Lines cut for scanning are named on stderr (the contract has no place for them)."""
    found = match_file(path, engine, env=env)
    return found.to_contract() if found is not None else dict(NO_MATCH)


def match_file(path: Path | str, engine: str | Signatures, *, env: Mapping[str, str] | None = None) -> Match | None:
    """The most specific known cause in a log file, with its evidence, or None."""
    return _scan_file(path, engine, env=env).best()


def pass_failure(path: Path | str, engine: str | Signatures) -> Match | None:
    """What fails the log of a server that passed (`LogScanner.failing_a_pass`), or None."""
    return _scan_file(path, engine, env=None).failing_a_pass()


def _scan_file(path: Path | str, engine: str | Signatures, *, env: Mapping[str, str] | None) -> LogScanner:
    try:
        with open(path, "rb") as log:
            scanner = scan_stream(log, engine, env=env)
    except OSError as exc:
        raise InputError(f"cannot read log file: {exc.strerror}", Location(file=path)) from None
    if scanner.truncation_note:
        print(f"warning: {path}: {scanner.truncation_note}", file=sys.stderr)
    return scanner


def scan_stream(stream: BinaryIO, engine: str | Signatures, *, env: Mapping[str, str] | None = None) -> LogScanner:
    """A scanner fed a whole byte stream in READ_CHUNK blocks: time is linear in the size, and memory is
    bounded by LINE_SCAN_MAX however long a line is."""
    scanner = LogScanner(engine, env=env)
    splitter = LineSplitter()
    while chunk := stream.read(READ_CHUNK):
        for text, truncated in splitter.feed(chunk):
            scanner._scan(text, truncated)
    for text, truncated in splitter.flush():
        scanner._scan(text, truncated)
    return scanner
