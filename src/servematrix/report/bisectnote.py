"""The note a finished bisection leaves in the evidence of the cells on the failing side of the change, so
the report's failure page for their class names the release that introduced (or fixed) it. It lives with the
report, which reads it, below the bisection, which writes it (`bisection/runner.py`): the report imports no
bisection and no pipeline.
"""

from __future__ import annotations

from collections.abc import Iterable

from servematrix.records.row import Row

NOTE_PREFIX = "bisect: "


def notes(rows: Iterable[Row]) -> list[str]:
    """The bisection notes in these rows' evidence, each once, without the prefix."""
    found = (str(e) for row in rows for e in row.evidence or () if str(e).startswith(NOTE_PREFIX))
    return list(dict.fromkeys(note.removeprefix(NOTE_PREFIX) for note in found))
