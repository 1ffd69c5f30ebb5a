"""Failure signatures: the data file's schema (pydantic, unknown keys forbidden, errors located by
`tomlsource`) and its loader, with the checks that span keys (engine, harness-assigned classes, unique ids).

The signatures are data (`servematrix/data/signatures/<engine>.toml`); an engine without a file has none.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, StrictBool, StrictInt, ValidationInfo, field_validator, model_validator

from servematrix.classify.prefilter import Prefilter
from servematrix.errors import InputError, Location
from servematrix.formats import tomlsource
from servematrix.formats.tomlsource import DataTable, TomlSource

SCHEMA = 1
_ID = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
IMPORT_CONFLICT = "import-dependency-conflict"  # assigned from a traceback (tracebacks.py), not a pattern


class SignatureDataError(InputError):
    """A signature data file is missing or malformed; the message names the file, line and key."""


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
PLACEHOLDER = re.compile(r"\{(\w+)(?:([+-])(\d+))?\}")


class FrameRule(DataTable):
    """Traceback frames as evidence (`classify/frames.py`): regexes searched in `path:function` of each frame,
    in call order with gaps allowed, and optionally the exception line that ends that traceback."""

    label: Text
    frames: tuple[Regex, ...]
    raises: Regex | None = None

    @field_validator("frames")
    @classmethod
    def _frames_not_empty(cls, frames: tuple[re.Pattern[str], ...]) -> tuple[re.Pattern[str], ...]:
        if not frames:
            raise ValueError("needs at least one frame pattern")
        return frames


class Evidence(DataTable):
    label: Text
    # Frame sequences that show this evidence as well as (or instead of) lines.
    frames: tuple[tuple[Regex, ...], ...] = ()
    patterns: tuple[Regex, ...] = Field(default=(), validate_default=True)
    # Of the evidence entries of one signature that share a group, only the first found (in data order) is
    # shown: a kernel fault's phase is capture, or replay, or a forward.
    group: Name | None = None

    @field_validator("frames")
    @classmethod
    def _sequences_not_empty(cls, frames: tuple[tuple[re.Pattern[str], ...], ...]) -> tuple:
        if any(not sequence for sequence in frames):
            raise ValueError("a frame sequence needs at least one frame pattern")
        return frames

    @field_validator("patterns")
    @classmethod
    def _not_empty(cls, patterns: tuple[re.Pattern[str], ...], info: ValidationInfo) -> tuple[re.Pattern[str], ...]:
        if not patterns and not info.data.get("frames"):
            raise ValueError("needs at least one pattern (or frames)")
        return patterns

    @property
    def frame_rules(self) -> tuple[FrameRule, ...]:
        return tuple(
            FrameRule.model_construct(label=self.label, frames=sequence, raises=None) for sequence in self.frames
        )

    @model_validator(mode="after")
    def _placeholders_are_groups(self) -> Evidence:
        for name in (found.group(1) for found in PLACEHOLDER.finditer(self.label)):
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

        return PLACEHOLDER.sub(fill, self.label)


class PackageFix(DataTable):
    """A package pin that fixes a failing cell: when the cell's evidence or excerpt matches `when` and its
    axes match `axes` (axis -> version specifier), pin `package` to `version`."""

    package: Name
    version: Text
    when: Regex
    axes: dict[str, Text] = Field(default_factory=dict)
    why: Text


class Signature(DataTable):
    id: Name
    title: Text
    explanation: Text
    workaround: Text
    fatal: StrictBool
    priority: StrictInt
    patterns: tuple[Regex, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    # Tracebacks that decide the class by their frames, as its `patterns` do by a line.
    traceback: tuple[FrameRule, ...] = ()
    # Public reports of the failure (issue threads): where it was seen, never pasted.
    sources: tuple[Text, ...] = ()
    # Package pins a matrix can express that fix a cell failing with this class (the failure page says so).
    fix: tuple[PackageFix, ...] = ()
    # Assigned by the harness from outside the log (server-timeout); such a signature has no patterns.
    harness_assigned: StrictBool = False
    # A server that passed, yet whose log shows this, fails with it: it served, but not the stack asked for
    # (sglang's Transformers fallback in place of its own model code).
    fails_a_pass: StrictBool = False


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
    # (signature id, evidence label or None for a class-deciding rule, rule), for classify.frames.FrameTracker
    frame_rules: tuple[tuple[str, str | None, FrameRule], ...] = field(default=(), repr=False, compare=False)

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


@functools.cache
def load_signatures(engine: str) -> Signatures:
    """The packaged signatures of an engine (servematrix/data/signatures/<engine>.toml)."""
    shown = f"servematrix/data/signatures/{engine}.toml"
    if not _ID.match(engine):
        raise SignatureDataError(f"not an engine name: {engine!r}", Location(file=shown))
    resource = resources.files("servematrix.data") / "signatures" / f"{engine}.toml"
    if not resource.is_file():
        # An engine may come without signatures (a new one, or one defined outside servematrix): its logs are
        # then classified by nothing: a server that exits is `fail:server-exited`, with its last lines.
        from servematrix.engines import available_engines

        if engine not in available_engines():
            raise SignatureDataError(f"no failure signatures for engine {engine!r}", Location(file=shown))
        return Signatures(engine=engine, source=shown, signatures=(), prefilter=Prefilter(()))
    with _signature_errors():
        return _signatures(tomlsource.parse(resource.read_bytes(), shown), engine=engine, default_engine=engine)


def parse_signatures(
    data: str | bytes, *, source: str, engine: str | None = None, default_engine: str = ""
) -> Signatures:
    """Validate and compile signature data (a file's text or bytes, named `source` in errors). `engine`, when
    given, must agree with the file's `engine`."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with _signature_errors():
        return _signatures(tomlsource.parse(raw, source), engine=engine, default_engine=default_engine)


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
        if signature.harness_assigned and signature.traceback:
            raise source.error((*at, "traceback"), "a harness-assigned signature matches no traceback: leave it out")
        if not signature.harness_assigned and not signature.patterns and not signature.traceback:
            raise source.error((*at, "patterns"), "needs at least one pattern (or a [[signature.traceback]])")
        if signature.fails_a_pass and (signature.fatal or signature.harness_assigned):
            raise source.error(
                (*at, "fails_a_pass"),
                "a signature that fails a pass is read from a passing log: fatal = false, not harness-assigned",
            )
        if signature.id in seen:
            raise source.error((*at, "id"), f"duplicate signature id {signature.id!r}")
        seen.add(signature.id)
    return Signatures(
        engine=file_engine,
        source=str(source.path),
        signatures=data.signature,
        prefilter=Prefilter(_patterns(data.signature)),
        frame_rules=frame_rules(data.signature),
    )


def frame_rules(signatures: tuple[Signature, ...]) -> tuple[tuple[str, str | None, FrameRule], ...]:
    rules: list[tuple[str, str | None, FrameRule]] = []
    for signature in signatures:
        rules += [(signature.id, None, rule) for rule in signature.traceback]
        for evidence in signature.evidence:
            rules += [(signature.id, evidence.label, rule) for rule in evidence.frame_rules]
    return tuple(rules)


def _patterns(signatures: Sequence[Signature]) -> Iterator[tuple[re.Pattern[str], str, str | None]]:
    """Each signature's class patterns, then its evidence patterns with their label: the pre-filter's input."""
    for signature in signatures:
        for pattern in signature.patterns:
            yield pattern, signature.id, None
        for evidence in signature.evidence:
            for pattern in evidence.patterns:
                yield pattern, signature.id, evidence.label
