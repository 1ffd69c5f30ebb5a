"""TOML files that remember where each key was written.

tomllib gives values without positions. Errors must name the line, so this module re-reads the text and
maps every key path (tables, array-of-table indexes, list items) to the line that wrote it. It is a
locator for messages, not a parser: values always come from tomllib.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from servematrix.errors import InputError, Location

KeyPath = tuple[str | int, ...]
_Model = TypeVar("_Model", bound=BaseModel)

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


def load(path: Path) -> TomlSource:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read matrix file: {exc.strerror}", Location(file=path)) from None
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


def _index_lines(source: TomlSource) -> None:
    table: KeyPath = ()
    array_counts: dict[KeyPath, int] = {}
    text_lines = source.text.splitlines()
    for number, raw in enumerate(text_lines, start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        header = _HEADER.match(raw)
        if header and not _KEY.match(raw):
            names = tuple(_split_dotted(header.group(2)))
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


def validate(source: TomlSource, model: type[_Model]) -> _Model:
    """`source.data` as a pydantic `model`; the first error is an InputError at its file, line and key."""
    try:
        return model.model_validate(source.data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise source.error(tuple(first["loc"]), pydantic_message(first)) from None


def pydantic_message(error: Any) -> str:
    """A pydantic error in the words of a TOML file."""
    kind = error.get("type", "")
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    return str(error.get("msg", "invalid value"))
