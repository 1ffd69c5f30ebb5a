"""TOML files that remember where each key was written.

tomllib gives values without positions. Errors must name the line, so this module re-reads the text and
maps every key path (tables, array-of-table indexes, list items) to the line that wrote it. It is a
locator for messages, not a parser: values always come from tomllib, and `validate` checks them against
a pydantic schema, naming the file, line and key of the first mistake.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from servematrix.errors import InputError, Location

KeyPath = tuple[str | int, ...]

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"""^\s*((?:"[^"]*"|'[^']*'|[A-Za-z0-9_\-]+)(?:\s*\.\s*(?:"[^"]*"|'[^']*'|[A-Za-z0-9_\-]+))*)\s*=""")
_PART = re.compile(r"""\s*("([^"]*)"|'([^']*)'|([A-Za-z0-9_\-]+))\s*""")


def _split_dotted(text: str) -> list[str]:
    parts = []
    for piece in re.finditer(_PART, text):
        parts.append(piece.group(2) if piece.group(2) is not None else piece.group(3) or piece.group(4))
    return parts


@dataclass
class TomlSource:
    path: Path
    text: str
    data: dict[str, Any]
    lines: dict[KeyPath, int] = field(default_factory=dict)

    def line_of(self, keypath: KeyPath) -> int | None:
        """The line of the longest prefix of keypath that was written down."""
        for end in range(len(keypath), 0, -1):
            found = self.lines.get(tuple(keypath[:end]))
            if found:
                return found
        return None

    def location(self, keypath: KeyPath) -> Location:
        return Location(file=self.path, line=self.line_of(keypath), key=dotted(keypath))

    def error(self, keypath: KeyPath, message: str) -> InputError:
        return InputError(message, self.location(keypath))


def dotted(keypath: KeyPath) -> str:
    out = ""
    for part in keypath:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def load(path: Path, *, what: str = "matrix file") -> TomlSource:
    """Read and parse the TOML file at `path`; `what` names it in the error when it cannot be read."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror}", Location(file=path)) from None
    return parse(raw, path)


def parse(raw: bytes, path: Path | str) -> TomlSource:
    """Parse TOML bytes that came from `path` (the name its errors show), with every key's line indexed."""
    path = Path(path)
    raw = raw.removeprefix(b"\xef\xbb\xbf")  # a byte order mark, as some editors write UTF-8: not TOML's business
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        column = exc.start - raw.rfind(b"\n", 0, exc.start)
        raise InputError(
            f"not valid UTF-8: byte 0x{raw[exc.start]:02x} at column {column} (TOML files are UTF-8)",
            Location(file=path, line=raw.count(b"\n", 0, exc.start) + 1),
        ) from None
    try:
        data = tomllib.loads(text)
    except RecursionError:
        # tomllib parses nested arrays and inline tables recursively; no matrix nests more than a few levels.
        raise InputError("arrays or inline tables nested too deeply", Location(file=path)) from None
    except tomllib.TOMLDecodeError as exc:
        # Python < 3.14 keeps the position only in the message: "... (at line 20, column 8)".
        found = re.search(r"\(at line (\d+), column \d+\)", str(exc))
        line = int(found.group(1)) if found else None
        message = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc))
        raise InputError(f"invalid TOML: {message}", Location(file=path, line=line)) from None
    source = TomlSource(path=path, text=text, data=data)
    _index_lines(source)
    return source


class DataTable(BaseModel):
    """A table of a data file: unknown keys are mistakes, and the values are read, never changed."""

    model_config = ConfigDict(extra="forbid", frozen=True)


Model = TypeVar("Model", bound=BaseModel)


def validate(source: TomlSource, model: type[Model]) -> Model:
    """`source`'s data as `model` (pydantic), or an InputError naming the file, line and key of a mistake."""
    try:
        return model.model_validate(source.data)
    except ValidationError as exc:
        errors = exc.errors()
        # A misspelt key is also a missing one: name the spelling, which is the mistake.
        first = next((error for error in errors if error["type"] == "extra_forbidden"), errors[0])
        raise source.error(tuple(first["loc"]), validation_message(first)) from None


# pydantic's error types, in the words of a data file (its own say "Input should be a valid dictionary").
_MESSAGES = {
    "extra_forbidden": "unknown key",
    "missing": "required key is missing",
    "bool_type": "must be true or false, got {input!r}",
    "int_type": "must be an integer, got {input!r}",
    "string_type": "must be a string, got {input!r}",
    "model_type": "expected a table",
    "dict_type": "expected a table",
    "tuple_type": "expected a list",
    "list_type": "expected a list",
    "literal_error": "must be {expected}, got {input!r}",
}


def validation_message(error: Any) -> str:
    """One pydantic error as a message for a person: a validator's own words, or the file's terms."""
    if error.get("type") == "value_error" and "error" in error.get("ctx", {}):
        return str(error["ctx"]["error"])
    template = _MESSAGES.get(error.get("type", ""))
    if template is not None:
        return template.format(input=error.get("input"), **error.get("ctx", {}))
    return str(error.get("msg", "invalid value"))


def _index_lines(source: TomlSource) -> None:
    table: KeyPath = ()
    # Each array of tables, by its key path (indexes included), and how many tables it has so far.
    array_counts: dict[KeyPath, int] = {}
    text_lines = source.text.splitlines()
    for number, raw in enumerate(text_lines, start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        header = _HEADER.match(raw)
        if header and not _KEY.match(raw):
            names = _table_path(_split_dotted(header.group(2)), array_counts)
            if header.group(1) == "[[":
                index = array_counts.get(names, 0)
                array_counts[names] = index + 1
                table = (*names, index)
            else:
                table = names
            source.lines.setdefault(table, number)
            source.lines.setdefault(names, number)
            continue
        key = _KEY.match(raw)
        if not key:
            continue
        keypath = (*table, *_split_dotted(key.group(1)))
        source.lines.setdefault(keypath, number)
        _index_list_items(source, keypath, text_lines, number)


def _table_path(names: list[str], array_counts: dict[KeyPath, int]) -> KeyPath:
    """A header's key path: a name that is an array of tables means its latest table, as in TOML itself
    (`[[signature.evidence]]` belongs to the last `[[signature]]`, so it is `signature[i].evidence`)."""
    path: KeyPath = ()
    for name in names[:-1]:
        path = (*path, name)
        if path in array_counts:
            path = (*path, array_counts[path] - 1)
    return (*path, *names[-1:])


def _index_list_items(source: TomlSource, keypath: KeyPath, text_lines: list[str], start: int) -> None:
    """Give each item of a list value the line it sits on, so `axes.sglang[3]` points at its line."""
    value: Any = source.data
    for part in keypath:
        container: Any = value  # dict keyed by str, or list indexed by int: checked just below
        if (isinstance(value, dict) and part in value) or (
            isinstance(value, list) and isinstance(part, int) and part < len(value)
        ):
            value = container[part]
        else:
            return
    if not isinstance(value, list):
        return
    line = start
    for index, item in enumerate(value):
        needle = item if isinstance(item, str) else None
        if needle is not None:
            for candidate in range(line, min(len(text_lines), line + 200) + 1):
                if needle in text_lines[candidate - 1]:
                    line = candidate
                    break
        source.lines.setdefault((*keypath, index), line)
