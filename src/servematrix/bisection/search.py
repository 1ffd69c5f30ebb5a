"""The search itself: a binary search over ordered versions for the first one on the far side of a change.

Pure: versions in, a `decide(version)` callable that says which end a version behaves like, a result out.
The two ends are known already (the caller checked them to find the stage that tells them apart), so only
versions strictly between them are decided here:

    search(["0.14.1", "0.15.1", "0.16.0", "0.17.2"], decide)   # decide -> "old" | "new" | "skip"

`old` means "behaves like the first version", `new` "like the last one", `skip` "cannot say" (a version that
does not install, a harness fault). A skipped version is reported, and its nearest untried neighbour is
tried instead, as `git bisect skip` does; skipped versions left between the boundary pair are the ones the
change may also have come with (`ambiguous`).

With no skips the search decides at most ceil(log2(n - 1)) versions for n versions, ends included.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

Outcome = Literal["old", "new", "skip"]
OUTCOMES: tuple[Outcome, ...] = ("old", "new", "skip")


@dataclass(frozen=True, kw_only=True)
class Found:
    """Where the behaviour changes: the last version like the first end and the first like the last end."""

    last_old: str
    first_new: str
    decided: tuple[tuple[str, Outcome], ...]  # the versions between the ends, in the order they were decided
    ambiguous: tuple[str, ...]  # skipped versions between last_old and first_new: the change may be theirs

    @property
    def skipped(self) -> tuple[str, ...]:
        return tuple(version for version, outcome in self.decided if outcome == "skip")


def max_steps(n: int) -> int:
    """How many versions between the ends a search over n versions decides at most, when none is skipped."""
    return (n - 2).bit_length() if n > 2 else 0  # ceil(log2(n - 1))


def search(versions: Sequence[str], decide: Callable[[str], Outcome]) -> Found:
    """The boundary between versions[0]'s behaviour and versions[-1]'s (see the module doc)."""
    if len(versions) < 2:
        raise ValueError("a search needs at least the two ends")
    if len(set(versions)) != len(versions):
        raise ValueError("versions must be distinct")
    low, high = 0, len(versions) - 1
    skipped: set[int] = set()
    decided: list[tuple[str, Outcome]] = []
    while True:
        index = _middle(low, high, skipped)
        if index is None:
            break
        outcome = decide(versions[index])
        if outcome not in OUTCOMES:
            raise ValueError(f"decide({versions[index]!r}) returned {outcome!r}, not one of {OUTCOMES}")
        decided.append((versions[index], outcome))
        if outcome == "old":
            low = index
        elif outcome == "new":
            high = index
        else:
            skipped.add(index)
    return Found(
        last_old=versions[low],
        first_new=versions[high],
        decided=tuple(decided),
        ambiguous=tuple(versions[i] for i in range(low + 1, high) if i in skipped),
    )


def _middle(low: int, high: int, skipped: set[int]) -> int | None:
    """The untried index nearest the middle of (low, high), the lower one on a tie; None when none is left."""
    middle = (low + high) // 2
    open_ = [i for i in range(low + 1, high) if i not in skipped]
    if not open_:
        return None
    return min(open_, key=lambda i: (abs(i - middle), i))
