"""One piece of evidence about a cell, and a cell's evidence with the verdict it is shown with."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Kind = Literal["sibling", "nearby", "advisory"]
Stance = Literal["supports", "predicts-fail", "at-risk"]
# The stances that are evidence against a cell: no recommendation rests on a cell that has one.
AGAINST: tuple[Stance, ...] = ("predicts-fail", "at-risk")


@dataclass(frozen=True, kw_only=True)
class Piece:
    """What another observation or a public report says about a cell.

    `kind`: `sibling` (the same release and mode observed on a GPU of another kind), `nearby` (a GPU lane observed
    a release this cell's matrix does not hold: shown on the nearest releases it does hold), `advisory` (a known
    failure from a public report). `stance`: `supports` (a pass: ranking only, never a pass), `predicts-fail` (a
    carried failure or an advisory that matches), `at-risk` (a failure that may or may not hold here)."""

    kind: Kind
    stance: Stance
    text: str  # one line, as the table, the page and `recommend --all` show it
    headline: str = ""  # the same, short: what was seen where, or the advisory's id, class and summary
    detail: str = ""  # what the line leaves out: an advisory's condition, its fix and what to do instead
    cls: str | None = None  # the failure class it predicts or puts the cell at risk of
    source: str = ""  # the observed cell's id, or the advisory's id
    gpu: str = ""  # the GPU kind that observed it
    matrix: str = ""
    release: str = ""  # the release observed (or the advisory's range, as it says)
    frames: tuple[str, ...] = ()  # the deciding frames of an observed failure
    link: str = ""  # an advisory's source
    rule: str = ""  # the carry rule that carried a failure (`carry.toml`), or why it was not carried

    @property
    def against(self) -> bool:
        return self.stance in AGAINST

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class CellEvidence:
    cell_id: str
    own_verdict: str  # what the cell's own run (or pre-flight) decided, as the record keeps it
    verdict: str  # as shown: the own verdict, or predicted-fail:<class> on an open cell a piece predicts
    pieces: tuple[Piece, ...] = ()

    @property
    def against(self) -> tuple[Piece, ...]:
        return tuple(p for p in self.pieces if p.against)

    @property
    def supports(self) -> tuple[Piece, ...]:
        return tuple(p for p in self.pieces if p.stance == "supports")

    @property
    def changed(self) -> bool:
        return self.verdict != self.own_verdict

    def to_dict(self) -> dict[str, Any]:
        return {
            "cell_id": self.cell_id,
            "own_verdict": self.own_verdict,
            "verdict": self.verdict,
            "pieces": [p.to_dict() for p in self.pieces],
        }
