"""Errors the command line turns into exit codes.

Bad input is the user's to fix, so it must say where: file, line and key. Everything else is a bug
or an infrastructure fault and keeps its traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

EXIT_BAD_INPUT = 2


@dataclass(frozen=True, kw_only=True)
class Location:
    file: Path | str
    line: int | None = None
    key: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else f"{self.file}"
        return f"{where}: {self.key}" if self.key else where


class InputError(Exception):
    """Bad input (a matrix file, a select expression, a log path): exit code 2, one line."""

    def __init__(self, message: str, location: Location | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.location = location

    def __str__(self) -> str:
        return f"{self.location}: {self.message}" if self.location else self.message
