"""`servematrix bisect`: the release of one package where an environment's verdict flips, found with the
cheapest stage that tells the two ends apart (search.py: the search; releases.py: the versions; checks.py:
one release at one stage; runner.py: the bisection; command.py: the command line).

A finished bisection leaves a note in the evidence of the cells on the failing side of the change, so the
report's failure page for their class names the release that introduced (or fixed) it. This module is only
that note, so the report can read it without importing the pipeline.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

NOTE_PREFIX = "bisect: "


def notes(rows: Iterable[Any]) -> list[str]:
    """The bisection notes in these rows' evidence (store rows or mappings), each once, without the prefix."""
    found = (str(e) for row in rows for e in row.get("evidence") or () if str(e).startswith(NOTE_PREFIX))
    return list(dict.fromkeys(note.removeprefix(NOTE_PREFIX) for note in found))
