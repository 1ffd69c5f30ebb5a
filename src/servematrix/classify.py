"""Name the cause of a failed server run from its log.

The signatures are data (`servematrix/data/signatures/<engine>.toml`). A log usually matches several of
them: the scheduler dies after every failure, and a traceback follows most. The most specific cause wins
(highest priority), and the earliest line among equals. Secondary "evidence" patterns found anywhere in
the log qualify the winner, e.g. `dynamo-untraceable (flashinfer fp4 JIT)`.

Two entry points share one scanner: `classify_text`/`classify_file` for a finished log, and
`LogScanner.feed` for a log being written, which reports the first fatal line so the harness can kill a
doomed server instead of waiting out its launch timeout.

Both stay linear and bounded however long a line is: files are read in chunks (LineSplitter), only the
first LINE_SCAN_MAX characters of a line are scanned, and a match's evidence says which lines were cut.
"""

from __future__ import annotations

import functools
import re
import sys
import tomllib
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from re import _constants as sre_constants  # type: ignore[attr-defined]
from re import _parser as sre_parser  # type: ignore[attr-defined]
from typing import Any, BinaryIO

from servematrix.errors import InputError, Location
from servematrix.redact import redact
from servematrix.tracebacks import TracebackReader

SCHEMA = 1
EXCERPT_BEFORE = 3
# Error messages continue downwards (the dynamo explanation, sglang's hint), so show more after.
EXCERPT_AFTER = 5
# A single log line can be a whole server_args dump; the excerpt is for people and tables.
EXCERPT_LINE_MAX = 1000
# Only the start of a line is scanned. Without a cap one 200 MB line (a dumped tensor, a progress bar
# without newlines) took minutes and hundreds of MB: every probe searches it, and it is kept as excerpt
# context and redacted. The longest real server_args dump is a few KiB; a signature's text is at the
# start of its line.
LINE_SCAN_MAX = 64 * 1024
# Files and streams are read in blocks of this size, never a line at a time, so that a line without a
# newline is never held whole.
READ_CHUNK = 64 * 1024

_ID = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column \d+\)")
# Shorter required literals ("a", ": ") occur in most lines and would not filter anything.
MIN_LITERAL_LEN = 3

_TOP_KEYS = {"schema", "engine", "signature"}
_SIGNATURE_KEYS = {
    "id",
    "title",
    "explanation",
    "workaround",
    "fatal",
    "priority",
    "patterns",
    "evidence",
    "harness_assigned",
}
_EVIDENCE_KEYS = {"label", "patterns"}


class SignatureDataError(InputError):
    """A signature data file is missing or malformed; the message names the file, line and key."""


@dataclass(frozen=True, kw_only=True)
class Evidence:
    label: str
    patterns: tuple[re.Pattern[str], ...]

    def search(self, line: str) -> bool:
        return any(pattern.search(line) for pattern in self.patterns)


@dataclass(frozen=True, kw_only=True)
class Signature:
    id: str
    title: str
    explanation: str
    workaround: str
    fatal: bool
    priority: int
    patterns: tuple[re.Pattern[str], ...]
    evidence: tuple[Evidence, ...] = ()
    # Assigned by the harness from outside the log (server-timeout); such a signature has no patterns.
    harness_assigned: bool = False

    def search(self, line: str) -> bool:
        return any(pattern.search(line) for pattern in self.patterns)


@dataclass(frozen=True, kw_only=True)
class Signatures:
    engine: str
    source: str
    signatures: tuple[Signature, ...]
    prefilter: Prefilter = field(repr=False, compare=False)

    def __iter__(self) -> Iterator[Signature]:
        return iter(self.signatures)

    def __len__(self) -> int:
        return len(self.signatures)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(signature.id for signature in self.signatures)

    def get(self, signature_id: str) -> Signature | None:
        for signature in self.signatures:
            if signature.id == signature_id:
                return signature
        return None


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

    @property
    def label(self) -> str:
        return f"{self.cls} ({', '.join(self.evidence)})" if self.evidence else self.cls

    def to_contract(self) -> dict[str, Any]:
        return {"class": self.cls, "title": self.title, "line": self.line, "excerpt": self.excerpt}


NO_MATCH: dict[str, Any] = {"class": None, "title": None, "line": None, "excerpt": None}


# ---- loading ---------------------------------------------------------------------------------------


@functools.cache
def load_signatures(engine: str) -> Signatures:
    """The packaged signatures of an engine (servematrix/data/signatures/<engine>.toml)."""
    shown = f"servematrix/data/signatures/{engine}.toml"
    if not _ID.match(engine):
        raise SignatureDataError(f"not an engine name: {engine!r}", Location(file=shown))
    resource = resources.files("servematrix.data") / "signatures" / f"{engine}.toml"
    if not resource.is_file():
        # An engine may come without signatures (a new one, or one defined outside servematrix): its logs are
        # then classified by nothing, and a failure is `fail:unclassified` with its last lines.
        from servematrix.engines import available_engines

        if engine not in available_engines():
            raise SignatureDataError(f"no failure signatures for engine {engine!r}", Location(file=shown))
        return Signatures(engine=engine, source=shown, signatures=(), prefilter=Prefilter(()))
    return parse_signatures(resource.read_text(encoding="utf-8"), source=shown, engine=engine)


def load_signatures_file(path: Path | str) -> Signatures:
    """Signatures from any file (a user's own, or a test's); the engine defaults to the file's stem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SignatureDataError(f"cannot read signature file: {exc.strerror}", Location(file=path)) from None
    return parse_signatures(text, source=str(path), engine=None, default_engine=path.stem)


def parse_signatures(text: str, *, source: str, engine: str | None = None, default_engine: str = "") -> Signatures:
    """Validate and compile signature data. `engine`, when given, must agree with the file's `engine`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # Python < 3.14 has the position only in the message text.
        where = _TOML_POSITION.search(str(exc))
        message = _TOML_POSITION.sub("", str(exc)).strip()
        line = int(where.group(1)) if where else None
        raise SignatureDataError(f"invalid TOML: {message}", Location(file=source, line=line)) from None
    return _Parser(text=text, source=source).parse(data, engine=engine, default_engine=default_engine)


class _Parser:
    def __init__(self, *, text: str, source: str) -> None:
        self.text_lines = text.splitlines()
        self.source = source

    def error(self, keypath: tuple[str | int, ...], message: str) -> SignatureDataError:
        return SignatureDataError(
            message, Location(file=self.source, line=self._line_of(keypath), key=_dotted(keypath))
        )

    def _line_of(self, keypath: tuple[str | int, ...]) -> int | None:
        """Best-effort line for a key: enough to point a person at the right entry."""
        if not keypath or keypath[0] != "signature" or len(keypath) < 2 or not isinstance(keypath[1], int):
            if keypath:
                return self._key_line(0, len(self.text_lines), str(keypath[0]))
            return None
        start, end = self._block(0, len(self.text_lines), r"\[\[\s*signature\s*\]\]", keypath[1])
        if start is None:
            return None
        rest = keypath[2:]
        if rest[:1] == ("evidence",) and len(rest) >= 2 and isinstance(rest[1], int):
            e_start, e_end = self._block(start, end, r"\[\[\s*signature\s*\.\s*evidence\s*\]\]", rest[1])
            if e_start is None:
                return start + 1
            if len(rest) >= 3:
                return self._key_line(e_start, e_end, str(rest[2])) or e_start + 1
            return e_start + 1
        if rest:
            # Keys of the signature itself come before its first evidence table.
            first_evidence = self._block(start, end, r"\[\[\s*signature\s*\.\s*evidence\s*\]\]", 0)[0]
            return self._key_line(start, first_evidence or end, str(rest[0])) or start + 1
        return start + 1

    def _block(self, lo: int, hi: int, header: str, index: int) -> tuple[int | None, int]:
        header_re = re.compile(rf"^\s*{header}\s*(#.*)?$")
        any_array = re.compile(r"^\s*\[\[\s*([^\]]+?)\s*\]\]")
        headers = [i for i in range(lo, hi) if header_re.match(self.text_lines[i])]
        if index >= len(headers):
            return None, hi
        start = headers[index]
        depth_name = any_array.match(self.text_lines[start])
        own = depth_name.group(1).replace(" ", "") if depth_name else ""
        for i in range(start + 1, hi):
            other = any_array.match(self.text_lines[i])
            if other and not other.group(1).replace(" ", "").startswith(own + "."):
                return start, i
        return start, hi

    def _key_line(self, lo: int, hi: int, key: str) -> int | None:
        key_re = re.compile(rf"^\s*{re.escape(key)}\s*=")
        for i in range(lo, hi):
            if key_re.match(self.text_lines[i]):
                return i + 1
        return None

    def parse(self, data: dict[str, Any], *, engine: str | None, default_engine: str) -> Signatures:
        for key in data:
            if key not in _TOP_KEYS:
                raise self.error((key,), f"unknown key (expected one of {sorted(_TOP_KEYS)})")
        schema = data.get("schema")
        if schema != SCHEMA:
            raise self.error(("schema",), f"schema must be {SCHEMA}, got {schema!r}")
        file_engine = data.get("engine", engine or default_engine)
        if not isinstance(file_engine, str) or not _ID.match(file_engine):
            raise self.error(("engine",), f"engine must be a lowercase name, got {file_engine!r}")
        if engine is not None and file_engine != engine:
            raise self.error(("engine",), f"file is for engine {file_engine!r}, expected {engine!r}")
        entries = data.get("signature")
        if not isinstance(entries, list) or not entries:
            raise self.error(("signature",), "expected one or more [[signature]] tables")
        signatures = tuple(self._signature(i, entry) for i, entry in enumerate(entries))
        seen: set[str] = set()
        for i, signature in enumerate(signatures):
            if signature.id in seen:
                raise self.error(("signature", i, "id"), f"duplicate signature id {signature.id!r}")
            seen.add(signature.id)
        return Signatures(
            engine=file_engine, source=self.source, signatures=signatures, prefilter=Prefilter(signatures)
        )

    def _signature(self, index: int, entry: Any) -> Signature:
        at: tuple[str | int, ...] = ("signature", index)
        if not isinstance(entry, dict):
            raise self.error(at, "expected a table")
        for key in entry:
            if key not in _SIGNATURE_KEYS:
                raise self.error((*at, key), f"unknown key (expected one of {sorted(_SIGNATURE_KEYS)})")
        signature_id = self._string(entry, (*at, "id"))
        if not _ID.match(signature_id):
            raise self.error((*at, "id"), f"id must be lowercase words joined by '-', got {signature_id!r}")
        fatal = entry.get("fatal")
        if not isinstance(fatal, bool):
            raise self.error((*at, "fatal"), f"fatal must be true or false, got {fatal!r}")
        priority = entry.get("priority")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise self.error((*at, "priority"), f"priority must be an integer, got {priority!r}")
        harness_assigned = entry.get("harness_assigned", False)
        if not isinstance(harness_assigned, bool):
            raise self.error((*at, "harness_assigned"), f"must be true or false, got {harness_assigned!r}")
        patterns = self._patterns(entry, (*at, "patterns"), allow_empty=harness_assigned)
        if harness_assigned and patterns:
            raise self.error((*at, "patterns"), "a harness-assigned signature matches no log line: leave it empty")
        raw_evidence = entry.get("evidence", [])
        if not isinstance(raw_evidence, list):
            raise self.error((*at, "evidence"), "expected [[signature.evidence]] tables")
        evidence = tuple(self._evidence((*at, "evidence", j), item) for j, item in enumerate(raw_evidence))
        return Signature(
            id=signature_id,
            title=self._string(entry, (*at, "title")),
            explanation=self._string(entry, (*at, "explanation")),
            workaround=self._string(entry, (*at, "workaround")),
            fatal=fatal,
            priority=priority,
            patterns=patterns,
            evidence=evidence,
            harness_assigned=harness_assigned,
        )

    def _evidence(self, at: tuple[str | int, ...], item: Any) -> Evidence:
        if not isinstance(item, dict):
            raise self.error(at, "expected a table")
        for key in item:
            if key not in _EVIDENCE_KEYS:
                raise self.error((*at, key), f"unknown key (expected one of {sorted(_EVIDENCE_KEYS)})")
        return Evidence(
            label=self._string(item, (*at, "label")),
            patterns=self._patterns(item, (*at, "patterns"), allow_empty=False),
        )

    def _string(self, table: dict[str, Any], at: tuple[str | int, ...]) -> str:
        value = table.get(str(at[-1]))
        if not isinstance(value, str) or not value.strip():
            raise self.error(at, "missing" if value is None else f"must be a non-empty string, got {value!r}")
        return value.strip()

    def _patterns(
        self, table: dict[str, Any], at: tuple[str | int, ...], *, allow_empty: bool
    ) -> tuple[re.Pattern[str], ...]:
        raw = table.get(str(at[-1]))
        if not isinstance(raw, list):
            raise self.error(at, "missing" if raw is None else "must be a list of regex strings")
        if not raw and not allow_empty:
            raise self.error(at, "needs at least one pattern")
        compiled = []
        for k, pattern in enumerate(raw):
            if not isinstance(pattern, str) or not pattern:
                raise self.error((*at, k), f"must be a non-empty regex string, got {pattern!r}")
            try:
                regex = re.compile(pattern)
            except re.error as exc:
                raise self.error((*at, k), f"invalid regex {pattern!r}: {exc}") from None
            # Such a pattern would match every line of every log.
            if regex.search("") is not None:
                raise self.error((*at, k), f"regex {pattern!r} matches an empty line")
            compiled.append(regex)
        return tuple(compiled)


def _dotted(keypath: tuple[str | int, ...]) -> str:
    out = ""
    for part in keypath:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# ---- the per-line pre-filter -----------------------------------------------------------------------
#
# Almost every line of a server log matches nothing, so the cost that matters is rejecting a line.
# One alternation regex of all patterns costs about 45-50 us per line here (Python's re tries every
# branch at every position, and \b or ^ in front defeats its literal-prefix search). Instead each pattern
# is reduced to literal strings of which at least one must occur for it to match. A line containing none
# of them is rejected by plain substring tests (about 7 us for 65 literals on a 150-character line; a
# trie-shaped regex of the same literals measured only 12 % faster), and only the patterns whose
# literals occur are searched.


@dataclass(frozen=True, kw_only=True)
class _Probe:
    pattern: re.Pattern[str]
    # One of these must occur in the line (lowercased when ignore_case); empty means "always search".
    literals: tuple[str, ...]
    ignore_case: bool
    signature: str
    evidence: str | None  # the evidence label, or None for a class pattern


class Prefilter:
    def __init__(self, signatures: tuple[Signature, ...]) -> None:
        probes = []
        for signature in signatures:
            for pattern in signature.patterns:
                probes.append(_probe(pattern, signature.id, None))
            for evidence in signature.evidence:
                probes.extend(_probe(pattern, signature.id, evidence.label) for pattern in evidence.patterns)
        self.probes = tuple(probes)
        self._exact = tuple(sorted({lit for p in probes if not p.ignore_case for lit in p.literals}))
        self._folded = tuple(sorted({lit for p in probes if p.ignore_case for lit in p.literals}))
        self._always = any(not p.literals for p in probes)

    def hits(self, line: str) -> list[_Probe]:
        """The probes whose pattern occurs in line."""
        lowered = line.lower() if self._folded else line
        if (
            not self._always
            and not any(map(line.__contains__, self._exact))
            and not any(map(lowered.__contains__, self._folded))
        ):
            return []
        return [
            probe
            for probe in self.probes
            if (not probe.literals or any(map((lowered if probe.ignore_case else line).__contains__, probe.literals)))
            and probe.pattern.search(line)
        ]


def _probe(pattern: re.Pattern[str], signature: str, evidence: str | None) -> _Probe:
    literals: frozenset[str] | None
    # re._parser is private and may change; a pattern it cannot reduce is searched on every line,
    # which is slower but still correct.
    try:
        parsed = sre_parser.parse(pattern.pattern, pattern.flags)
        ignore_case = bool(parsed.state.flags & re.IGNORECASE)
        literals, ignore_case = _best(_required(list(parsed), ignore_case))
    except Exception:
        literals, ignore_case = None, False
    if literals is None or min(map(len, literals)) < MIN_LITERAL_LEN:
        return _Probe(pattern=pattern, literals=(), ignore_case=False, signature=signature, evidence=evidence)
    return _Probe(
        pattern=pattern,
        literals=tuple(sorted(literals)),
        ignore_case=ignore_case,
        signature=signature,
        evidence=evidence,
    )


_Requirement = tuple[frozenset[str], bool]  # any-of literals, and whether they are case-folded


def _required(items: list[Any], ignore_case: bool) -> list[_Requirement]:
    """Literal sets that every match of this parsed sequence must contain (sound, not complete)."""
    found: list[_Requirement] = []
    run: list[str] = []

    def flush() -> None:
        if run:
            text = "".join(run)
            found.append((frozenset({text.lower() if ignore_case else text}), ignore_case))
            run.clear()

    for op, arg in items:
        if op is sre_constants.LITERAL:
            run.append(chr(arg))
            continue
        flush()
        if op is sre_constants.SUBPATTERN:
            _group, add_flags, _del_flags, sub = arg
            found.extend(_required(list(sub), ignore_case or bool(add_flags & re.IGNORECASE)))
        elif op is sre_constants.BRANCH:
            alternatives: set[str] = set()
            folded = ignore_case
            for branch in arg[1]:
                best, branch_folded = _best(_required(list(branch), ignore_case))
                if best is None:
                    break
                alternatives |= best
                folded = folded or branch_folded
            else:
                # Mixed case sensitivity across branches: fold all, which only widens the filter.
                found.append(
                    (frozenset(a.lower() for a in alternatives) if folded else frozenset(alternatives), folded)
                )
        elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT) and arg[0] >= 1:
            found.extend(_required(list(arg[2]), ignore_case))
        # Anything else (classes, anchors, look-arounds, optional parts) requires no literal.
    flush()
    return found


def _best(requirements: list[_Requirement]) -> tuple[frozenset[str] | None, bool]:
    usable = [r for r in requirements if r[0]]
    if not usable:
        return None, False
    # The requirement whose shortest alternative is longest rejects the most lines.
    return max(usable, key=lambda r: min(map(len, r[0])))


# ---- scanning --------------------------------------------------------------------------------------


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


class _Candidate:
    """The first line of one class, with the context collected so far."""

    __slots__ = ("after_missing", "context", "line", "signature")

    def __init__(self, signature: Signature, line: int, before: list[str], text: str) -> None:
        self.signature = signature
        self.line = line
        self.context = [*before, text]
        self.after_missing = EXCERPT_AFTER


class LogScanner:
    """Incremental classifier for a log that is still being written.

    `feed(line)` returns a Match the first time a fatal signature is seen, so the harness can abort
    early. The decisive cause may be printed after the generic line that first revealed the failure
    (a traceback after "Scheduler hit an exception"), so before killing a server, feed what is already
    in its log and ask `best()`, which re-ranks everything seen.

    Feed whole lines: a caller reading a growing file keeps an unterminated last line until it ends.
    Line numbers count across feeds, from 1.
    """

    def __init__(self, engine: str | Signatures = "sglang", *, env: Mapping[str, str] | None = None) -> None:
        self.signatures = load_signatures(engine) if isinstance(engine, str) else engine
        self._env = env
        self._line_count = 0
        self._before: deque[str] = deque(maxlen=EXCERPT_BEFORE)
        self._candidates: dict[str, _Candidate] = {}
        self._collecting: list[_Candidate] = []
        self._evidence_seen: set[tuple[str, str]] = set()
        self._fatal_reported = False
        self._ranked = sorted(self.signatures, key=lambda s: -s.priority)
        self._tracebacks = TracebackReader()  # an import-time failure between two packages names both
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
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        self._tracebacks.feed(number, text)
        if self._collecting:
            self._collect_after(text)
        fatal: _Candidate | None = None
        hits = self.signatures.prefilter.hits(text)
        if hits:
            matched = set()
            for probe in hits:
                if probe.evidence is None:
                    matched.add(probe.signature)
                else:
                    self._evidence_seen.add((probe.signature, probe.evidence))
            if matched:
                fatal = self._record_classes(number, text, matched)
        self._before.append(text)
        if fatal is None:
            return None
        self._fatal_reported = True
        return self._match(fatal)

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
        redacted = redact("\n".join(candidate.context), self._env)
        excerpt = "\n".join(_clip(line) for line in redacted.split("\n"))
        evidence = [
            evidence.label for evidence in signature.evidence if (signature.id, evidence.label) in self._evidence_seen
        ]
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
        )


IMPORT_CONFLICT = "import-dependency-conflict"  # assigned from a traceback (tracebacks.py), not a pattern


def _clip(line: str) -> str:
    return line if len(line) <= EXCERPT_LINE_MAX else line[:EXCERPT_LINE_MAX] + " …"


def classify_text(
    text: str, engine: str | Signatures = "sglang", *, env: Mapping[str, str] | None = None
) -> Match | None:
    """The most specific known cause in a whole log, or None."""
    scanner = LogScanner(engine, env=env)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for line in lines:
        scanner._scan(line)
    return scanner.best()


def classify_file(
    path: Path | str, engine: str | Signatures = "sglang", *, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The design contract `{class, title, line, excerpt}`; every value is None when nothing matches.
    Lines cut for scanning are named on stderr (the contract has no place for them)."""
    try:
        with open(path, "rb") as log:
            scanner = scan_stream(log, engine, env=env)
    except OSError as exc:
        raise InputError(f"cannot read log file: {exc.strerror}", Location(file=path)) from None
    if scanner.truncation_note:
        print(f"warning: {path}: {scanner.truncation_note}", file=sys.stderr)
    found = scanner.best()
    return found.to_contract() if found is not None else dict(NO_MATCH)


def scan_stream(
    stream: BinaryIO, engine: str | Signatures = "sglang", *, env: Mapping[str, str] | None = None
) -> LogScanner:
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
