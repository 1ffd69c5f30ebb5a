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

import contextlib
import functools
import itertools
import re
import string
import sys
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, BinaryIO

from pydantic import BeforeValidator, Field, StrictBool, StrictInt, field_validator, model_validator

from servematrix import tomlsource
from servematrix.errors import InputError, Location
from servematrix.redact import redact
from servematrix.tomlsource import DataTable, TomlSource
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
# Shorter required literals ("a", ": ") occur in most lines and would not filter anything.
MIN_LITERAL_LEN = 3


class SignatureDataError(InputError):
    """A signature data file is missing or malformed; the message names the file, line and key."""


# ---- the data file's schema ------------------------------------------------------------------------
# pydantic, unknown keys forbidden, errors located by tomlsource; the checks that span keys (engine,
# harness-assigned classes, unique ids) are in _signatures.


def _name(value: Any) -> str:
    if not isinstance(value, str) or not _ID.match(value):
        raise ValueError(f"must be lowercase words joined by '-', got {value!r}")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be a non-empty string, got {value!r}")
    return value.strip()


def _regex(value: Any) -> re.Pattern[str]:
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be a non-empty regex string, got {value!r}")
    try:
        regex = re.compile(value)
    except re.error as exc:
        raise ValueError(f"invalid regex {value!r}: {exc}") from None
    # Such a pattern would match every line of every log.
    if regex.search("") is not None:
        raise ValueError(f"regex {value!r} matches an empty line")
    return regex


def _schema(value: Any) -> int:
    if value != SCHEMA or isinstance(value, bool):
        raise ValueError(f"schema must be {SCHEMA}, got {value!r}")
    return SCHEMA


Name = Annotated[str, BeforeValidator(_name)]
Text = Annotated[str, BeforeValidator(_text)]
Regex = Annotated[re.Pattern[str], BeforeValidator(_regex)]


# In an evidence label, `{name}` is what the pattern's group `(?P<name>...)` matched, and `{name-N}` or
# `{name+N}` that number less or plus N: the arithmetic that makes a number in a log line mean something
# (sglang's gRPC port is --port + 10000).
_PLACEHOLDER = re.compile(r"\{(\w+)(?:([+-])(\d+))?\}")


class Evidence(DataTable):
    label: Text
    patterns: tuple[Regex, ...]

    @field_validator("patterns")
    @classmethod
    def _not_empty(cls, patterns: tuple[re.Pattern[str], ...]) -> tuple[re.Pattern[str], ...]:
        if not patterns:
            raise ValueError("needs at least one pattern")
        return patterns

    @model_validator(mode="after")
    def _placeholders_are_groups(self) -> Evidence:
        for name in (found.group(1) for found in _PLACEHOLDER.finditer(self.label)):
            for pattern in self.patterns:
                if name not in pattern.groupindex:
                    raise ValueError(f"label names {{{name}}}, a group pattern {pattern.pattern!r} does not have")
        return self

    def text(self, found: re.Match[str]) -> str:
        """The label, its placeholders filled from what the pattern matched."""

        def fill(placeholder: re.Match[str]) -> str:
            value = found.group(placeholder.group(1)) or ""
            if placeholder.group(2) is None or not value.isdigit():
                return value
            offset = int(placeholder.group(3))
            return str(int(value) - offset if placeholder.group(2) == "-" else int(value) + offset)

        return _PLACEHOLDER.sub(fill, self.label)


class Signature(DataTable):
    id: Name
    title: Text
    explanation: Text
    workaround: Text
    fatal: StrictBool
    priority: StrictInt
    patterns: tuple[Regex, ...]
    evidence: tuple[Evidence, ...] = ()
    # Assigned by the harness from outside the log (server-timeout); such a signature has no patterns.
    harness_assigned: StrictBool = False


class SignatureFile(DataTable):
    schema_version: Annotated[int, BeforeValidator(_schema)] = Field(alias="schema")
    engine: Name | None = None  # default: the engine asked for, or the file's stem
    signature: tuple[Signature, ...]


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
    with _signature_errors():
        return _signatures(tomlsource.parse(resource.read_bytes(), shown), engine=engine, default_engine=engine)


def load_signatures_file(path: Path | str) -> Signatures:
    """Signatures from any file (a user's own, or a test's); the engine defaults to the file's stem."""
    path = Path(path)
    with _signature_errors():
        source = tomlsource.load(path, what="signature file")
        return _signatures(source, engine=None, default_engine=path.stem)


def parse_signatures(text: str, *, source: str, engine: str | None = None, default_engine: str = "") -> Signatures:
    """Validate and compile signature data. `engine`, when given, must agree with the file's `engine`."""
    with _signature_errors():
        return _signatures(tomlsource.parse(text.encode("utf-8"), source), engine=engine, default_engine=default_engine)


@contextlib.contextmanager
def _signature_errors() -> Iterator[None]:
    try:
        yield
    except SignatureDataError:
        raise
    except InputError as exc:
        raise SignatureDataError(exc.message, exc.location) from None


def _signatures(source: TomlSource, *, engine: str | None, default_engine: str) -> Signatures:
    """The checks that span keys, after the schema's: the engine, harness-assigned classes, unique ids."""
    data = tomlsource.validate(source, SignatureFile)
    file_engine = data.engine if data.engine is not None else (engine or default_engine)
    if not _ID.match(file_engine):
        raise source.error(("engine",), f"engine must be a lowercase name, got {file_engine!r}")
    if engine is not None and file_engine != engine:
        raise source.error(("engine",), f"file is for engine {file_engine!r}, expected {engine!r}")
    if not data.signature:
        raise source.error(("signature",), "expected one or more [[signature]] tables")
    seen: set[str] = set()
    for index, signature in enumerate(data.signature):
        at = ("signature", index)
        if signature.harness_assigned and signature.patterns:
            raise source.error((*at, "patterns"), "a harness-assigned signature matches no log line: leave it empty")
        if not signature.harness_assigned and not signature.patterns:
            raise source.error((*at, "patterns"), "needs at least one pattern")
        if signature.id in seen:
            raise source.error((*at, "id"), f"duplicate signature id {signature.id!r}")
        seen.add(signature.id)
    return Signatures(
        engine=file_engine, source=str(source.path), signatures=data.signature, prefilter=Prefilter(data.signature)
    )


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
    literals, ignore_case = required_literals(pattern)
    if literals is None or min(map(len, literals)) < MIN_LITERAL_LEN:
        return _Probe(pattern=pattern, literals=(), ignore_case=False, signature=signature, evidence=evidence)
    return _Probe(
        pattern=pattern,
        literals=tuple(sorted(literals)),
        ignore_case=ignore_case,
        signature=signature,
        evidence=evidence,
    )


# ---- the literals a pattern requires ---------------------------------------------------------------
#
# Read from the pattern's text, by Python's regex syntax (re's own parser is private and may change).
# Only what every match must contain counts: classes, anchors, look-arounds and optional parts require
# nothing, and a construct this reader does not follow (back-references, conditionals, verbose
# patterns) leaves the whole pattern without literals, so it is searched on every line: slower, never
# wrong.

_Requirement = tuple[frozenset[str], bool]  # any-of literals, and whether they are case-folded
_ESCAPED_CHARACTERS = {"a": "\a", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_ESCAPED_CLASSES = frozenset("AbBZdDsSwW")  # anchors and character classes: no one literal
_HEX_WIDTH = {"x": 2, "u": 4, "U": 8}
_QUANTIFIER = re.compile(r"\{(\d*)(,\d*)?\}")
_FLAGS_GROUP = re.compile(r"\(\?([aiLmsux]*)(?:-([imsx]+))?([:)])")


def required_literals(pattern: re.Pattern[str]) -> tuple[frozenset[str] | None, bool]:
    """Strings of which every match of `pattern` contains at least one, and whether they are lowercased
    (to be looked for in a lowercased line); None when the pattern requires no literal this reader sees."""
    if pattern.flags & re.VERBOSE:
        return None, False
    folded = bool(pattern.flags & re.IGNORECASE)
    reader = _LiteralReader(pattern.pattern)
    try:
        branches = reader.branches(folded)
        if reader.pos != len(pattern.pattern):
            raise _Unsupported(pattern.pattern[reader.pos :])
    except _Unsupported:
        return None, False
    return _best(_group_required(branches, folded))


class _Unsupported(Exception):
    """A construct the literal reader does not follow."""


@dataclass(frozen=True, kw_only=True)
class _Atom:
    """One item of a pattern: a literal character, a group, or something that requires no literal."""

    literal: str | None = None
    branches: tuple[tuple[_Atom, ...], ...] | None = None  # a group's alternatives
    folded: bool = False  # a group's literals match case-insensitively
    quantified: bool = False  # a quantifier follows: not part of the literal run around it
    required: bool = True  # False when the quantifier allows zero (?, *, {0,n})


class _LiteralReader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def branches(self, folded: bool) -> tuple[tuple[_Atom, ...], ...]:
        """The alternatives from here to the end of the enclosing group (or of the pattern)."""
        found: list[tuple[_Atom, ...]] = []
        atoms: list[_Atom] = []
        while self.pos < len(self.text) and self.text[self.pos] != ")":
            if self.text[self.pos] == "|":
                found.append(tuple(atoms))
                atoms = []
                self.pos += 1
                continue
            atom = self._atom(folded)
            if atom is not None:
                atoms.append(self._quantified(atom))
        found.append(tuple(atoms))
        return tuple(found)

    def _atom(self, folded: bool) -> _Atom | None:
        char = self.text[self.pos]
        if char == "(":
            return self._group(folded)
        if char == "\\":
            return self._escape()
        if char == "[":
            self._skip_class()
            return _Atom()
        if char in "*+?" or (char == "{" and self._quantifier() is not None):
            raise _Unsupported("a quantifier with nothing to repeat")
        self.pos += 1
        return _Atom() if char in ".^$" else _Atom(literal=char)

    def _quantifier(self) -> re.Match[str] | None:
        found = _QUANTIFIER.match(self.text, self.pos)
        # `{}` is two literal characters; `{,}` and `{,3}` are quantifiers (as re reads them).
        return found if found is not None and (found.group(1) or found.group(2)) else None

    def _quantified(self, atom: _Atom) -> _Atom:
        char = self.text[self.pos : self.pos + 1]
        if char in ("*", "?"):
            least = 0
            self.pos += 1
        elif char == "+":
            least = 1
            self.pos += 1
        elif char == "{" and (bounds := self._quantifier()) is not None:
            least = int(bounds.group(1) or 0)
            self.pos = bounds.end()
        else:
            return atom
        if self.text[self.pos : self.pos + 1] in ("?", "+"):  # lazy or possessive
            self.pos += 1
        return replace(atom, quantified=True, required=least >= 1)

    def _escape(self) -> _Atom:
        char = self.text[self.pos + 1 : self.pos + 2]
        self.pos += 2
        if char in _ESCAPED_CLASSES:
            return _Atom()
        if char in _ESCAPED_CHARACTERS:
            return _Atom(literal=_ESCAPED_CHARACTERS[char])
        if char in _HEX_WIDTH:
            digits = self.text[self.pos : self.pos + _HEX_WIDTH[char]]
            if len(digits) != _HEX_WIDTH[char] or digits.strip(string.hexdigits):
                raise _Unsupported(f"\\{char}{digits}")
            self.pos += len(digits)
            return _Atom(literal=chr(int(digits, 16)))
        if char.isdigit() and char.isascii():
            return self._numbered(char)
        if not char or (char.isascii() and char.isalpha()):
            raise _Unsupported(f"\\{char}")  # named characters, and anything newer
        return _Atom(literal=char)

    def _numbered(self, first: str) -> _Atom:
        """`\\0`, `\\0oo` and `\\ooo` are octal characters; any other `\\n` or `\\nn` is a back-reference."""
        more = self.text[self.pos : self.pos + 2]
        if first == "0":
            digits = first + "".join(itertools.takewhile(lambda c: c in "01234567", more))
        elif first in "01234567" and len(more) == 2 and all(c in "01234567" for c in more):
            digits = first + more
        else:
            self.pos += 1 if more[:1].isdigit() and more[:1].isascii() else 0
            return _Atom()  # a back-reference: its text is a group's, already counted
        self.pos += len(digits) - 1
        return _Atom(literal=chr(int(digits, 8)))

    def _skip_class(self) -> None:
        pos = self.pos + 1
        if self.text[pos : pos + 1] == "^":
            pos += 1
        if self.text[pos : pos + 1] == "]":  # a leading ] is a member
            pos += 1
        while pos < len(self.text) and self.text[pos] != "]":
            pos += 2 if self.text[pos] == "\\" else 1
        if pos >= len(self.text):
            raise _Unsupported("an unterminated class")
        self.pos = pos + 1

    def _after(self, char: str, start: int) -> int:
        end = self.text.find(char, start)
        if end < 0:
            raise _Unsupported(f"no {char!r} after {self.text[start:]!r}")
        return end + 1

    def _group(self, folded: bool) -> _Atom | None:
        text, start = self.text, self.pos
        counts = True  # a look-around's text need not be in the match
        if text.startswith("(?#", start):
            self.pos = self._after(")", start)
            return None
        if text.startswith("(?P=", start):
            self.pos = self._after(")", start)
            return _Atom()
        if text.startswith(("(?:", "(?>", "(?=", "(?!"), start):
            counts = text[start + 2] in ":>"
            self.pos = start + 3
        elif text.startswith(("(?<=", "(?<!"), start):
            counts = False
            self.pos = start + 4
        elif text.startswith("(?P<", start):
            self.pos = self._after(">", start)
        elif text.startswith("(?", start):
            flags = _FLAGS_GROUP.match(text, start)
            if flags is None:
                raise _Unsupported(text[start : start + 4])  # conditionals and anything newer
            self.pos = flags.end()
            if flags.group(3) == ")":
                return None  # the pattern's own flags, which pattern.flags holds
            # A scoped (?-i:...) inside a folded pattern stays folded, which only widens the filter.
            folded = folded or "i" in flags.group(1)
        else:
            self.pos = start + 1
        branches = self.branches(folded)
        if self.text[self.pos : self.pos + 1] != ")":
            raise _Unsupported("an unterminated group")
        self.pos += 1
        return _Atom(branches=branches, folded=folded) if counts else _Atom()


def _required(atoms: tuple[_Atom, ...], folded: bool) -> list[_Requirement]:
    """Literal sets that every match of this sequence must contain (sound, not complete)."""
    found: list[_Requirement] = []
    run: list[str] = []

    def flush() -> None:
        if run:
            text = "".join(run)
            found.append((frozenset({text.lower() if folded else text}), folded))
            run.clear()

    pending = list(reversed(atoms))
    while pending:
        atom = pending.pop()
        if atom.literal is not None and not atom.quantified:
            run.append(atom.literal)
            continue
        if atom.branches is not None and len(atom.branches) == 1 and not atom.quantified and atom.folded == folded:
            pending.extend(reversed(atom.branches[0]))  # (ab)cd needs "abcd": the group joins the run
            continue
        flush()
        if not atom.required:
            continue
        if atom.literal is not None:
            found.append((frozenset({atom.literal.lower() if folded else atom.literal}), folded))
        elif atom.branches is not None:
            found.extend(_group_required(atom.branches, atom.folded))
    flush()
    return found


def _group_required(branches: tuple[tuple[_Atom, ...], ...], folded: bool) -> list[_Requirement]:
    if len(branches) == 1:
        return _required(branches[0], folded)
    alternatives: set[str] = set()
    any_folded = folded
    for branch in branches:
        best, branch_folded = _best(_required(branch, folded))
        if best is None:
            return []  # one alternative needs no literal, so the group needs none
        alternatives |= best
        any_folded = any_folded or branch_folded
    # Mixed case sensitivity across branches: fold all, which only widens the filter.
    return [(frozenset(a.lower() for a in alternatives) if any_folded else frozenset(alternatives), any_folded)]


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
        self._evidence_text: dict[tuple[str, str], str] = {}  # labels with placeholders, filled
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
                elif (probe.signature, probe.evidence) not in self._evidence_seen:
                    self._evidence_seen.add((probe.signature, probe.evidence))
                    self._fill_evidence(probe, text)
            if matched:
                fatal = self._record_classes(number, text, matched)
        self._before.append(text)
        if fatal is None:
            return None
        self._fatal_reported = True
        return self._match(fatal)

    def _fill_evidence(self, probe: _Probe, text: str) -> None:
        """An evidence label with placeholders, filled from its first matching line."""
        signature = self.signatures.get(probe.signature)
        evidence = next((e for e in signature.evidence if e.label == probe.evidence), None) if signature else None
        found = probe.pattern.search(text)
        if evidence is not None and found is not None and _PLACEHOLDER.search(evidence.label):
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
            self._evidence_text.get((signature.id, evidence.label), evidence.label)
            for evidence in signature.evidence
            if (signature.id, evidence.label) in self._evidence_seen
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
    found = match_file(path, engine, env=env)
    return found.to_contract() if found is not None else dict(NO_MATCH)


def match_file(
    path: Path | str, engine: str | Signatures = "sglang", *, env: Mapping[str, str] | None = None
) -> Match | None:
    """The most specific known cause in a log file, with its evidence, or None."""
    try:
        with open(path, "rb") as log:
            scanner = scan_stream(log, engine, env=env)
    except OSError as exc:
        raise InputError(f"cannot read log file: {exc.strerror}", Location(file=path)) from None
    if scanner.truncation_note:
        print(f"warning: {path}: {scanner.truncation_note}", file=sys.stderr)
    return scanner.best()


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
