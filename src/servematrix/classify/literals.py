"""The literals a regex requires: strings of which every match contains at least one.

Read from the pattern's text, by Python's regex syntax (re's own parser is private and may change).
Only what every match must contain counts: classes, anchors, look-arounds and optional parts require
nothing, and a construct this reader does not follow (back-references, conditionals, verbose
patterns) leaves the whole pattern without literals, so it is searched on every line: slower, never
wrong.
"""

from __future__ import annotations

import itertools
import re
import string
from dataclasses import dataclass, replace

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
