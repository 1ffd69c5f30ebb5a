"""Evidence: what the project knows about a cell beyond its own run, derived again on every report and
recommendation from the rows themselves (the published record, a store's lanes) and the advisories.

- `model.py`: `Piece` (one piece of evidence: a sibling GPU's observation, a nearby release's, an advisory; what
  it says: supports, predicts a failure, or marks the cell at risk) and `CellEvidence` (a cell's pieces and the
  verdict shown);
- `carry.py` with `carry.toml`: when an observed failure on one GPU kind predicts the same failure on another
  (the rules, the refusals), the judgement of one pair;
- `derive.py`: `derive` (every cell's evidence), `apply` (the rows as the report and `recommend` show them).

The evidence never changes a stored row, nor a verdict a GPU observed on the cell's own kind: an open cell
(`skipped:no-gpu`) is shown as `predicted-fail:<class>` when a carried failure or an advisory predicts it, and
the record keeps what its run decided. So a run that reuses a published pre-flight verdict, or a rule refined
later, never leaves a stale derived verdict behind. It owns neither the advisories (`advisories/`), nor the
verdicts a run reaches (`run/`), nor how the report lays the evidence out (`report/`).
"""

from __future__ import annotations

from servematrix.evidence.derive import apply, derive
from servematrix.evidence.model import AGAINST, CellEvidence, Piece

__all__ = ["AGAINST", "CellEvidence", "Piece", "apply", "derive"]
