"""Advisories: known failures from public reports, as package data, and which cells they touch.

One OSV-shaped JSON record per known failure lives in `data/advisories/` (like the PyPA advisory database or
RustSec): its id, summary, references (issue and PR links), the PyPI packages and version ranges it affects,
and, in `database_specific`, what OSV has no field for: the failure class, GPU archs, server flags and
environment, modes, model architectures, how certain the match is, what fixed it and what a user does instead.

- `model.py`: the record's schema (pydantic) and `Advisory`, the checked record the rest of servematrix reads;
- `load.py`: `load_advisories`, every record of a folder (the packaged one by default), a malformed one an
  `InputError` naming the file, the record and the key;
- `match.py`: `CellFacts` (what a cell is made of: its lock's pins, GPU arch, mode, argv, model architectures,
  server environment), `facts_for` (those facts from a plan's cell and its lock) and `match` (which
  advisories touch a cell: `affected`, a predicted failure citing the advisory, or `at-risk`, a visible mark
  where the advisory's condition may or may not hold for the cell);
- `command.py`: `servematrix advisories [MATRIX]`, the list and the cells each one touches.

It owns none of the verdicts a run reaches, nor how the report shows a match (`report/`), nor the failure
classes themselves (`data/signatures/`): an advisory names a class, the signature data explains it.
"""

from __future__ import annotations

from servematrix.advisories.load import ADVISORIES_DIR, load_advisories
from servematrix.advisories.match import AdvisoryMatch, CellFacts, facts_for, match
from servematrix.advisories.model import Advisory, AffectedPackage, VersionRange

__all__ = [
    "ADVISORIES_DIR",
    "Advisory",
    "AdvisoryMatch",
    "AffectedPackage",
    "CellFacts",
    "VersionRange",
    "facts_for",
    "load_advisories",
    "match",
]
