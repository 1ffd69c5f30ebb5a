"""A bisection: check both ends stage by stage until a stage tells them apart, then search the releases
between them with that stage alone, and leave a note on the failing side's rows for the report.

An end that cannot be installed (`unresolvable`) is bad input: it is neither good nor bad. An end the harness
could not check (a network fault, an import check without an answer) stops the bisection; running it again
reuses every check already stored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from packaging.version import Version

from servematrix.bisection.checks import Check, Checker, Target
from servematrix.bisection.search import Found, max_steps, search
from servematrix.errors import InputError
from servematrix.report.bisectnote import NOTE_PREFIX
from servematrix.report.markdown import failure_class
from servematrix.store.store import Store

Label = Literal["good", "bad", "skip"]
# What a noted row does not take from the row it repeats: its run, times, processes, and the evidence it extends.
_NOT_COPIED = frozenset(
    {"run_id", "status", "started_at", "finished_at", "harness_pid", "server_pid", "server_pgid", "evidence"}
)


class Undecided(Exception):
    """An end could not be checked for a reason that is not the user's (a fault: retried next time)."""


@dataclass(frozen=True, kw_only=True)
class Bisection:
    target: Target
    good: str
    bad: str
    candidates: tuple[str, ...]  # oldest first, both ends included
    stage: str  # the cheapest stage whose verdicts differ between the ends
    found: Found
    checks: tuple[Check, ...]  # every check, in the order run, cheaper stages' included
    labels: dict[str, Label]  # each release checked at the deciding stage

    @property
    def regression(self) -> bool:
        """The good end is the older one: the search finds what broke it (else what fixed it)."""
        return Version(self.good) < Version(self.bad)

    @property
    def first_bad(self) -> str:
        return self.found.first_new if self.regression else self.found.last_old

    @property
    def last_good(self) -> str:
        return self.found.last_old if self.regression else self.found.first_new

    def at_stage(self, version: str) -> Check:
        return next(c for c in self.checks if c.version == version and c.stage == self.stage)

    @property
    def deciding_checks(self) -> list[Check]:
        return [c for c in self.checks if c.stage == self.stage]

    @property
    def note(self) -> str:
        """What the failing side's rows carry, for the report's failure pages."""
        package, low, high = self.target.package, self.candidates[0], self.candidates[-1]
        axes = " ".join(f"{k}={v}" for k, v in self.target.env.axes.items() if k != self.target.axis)
        where = f"{self.target.spec.path} {axes}"
        searched = f"{len(self.candidates)} releases {low} to {high}, decided at {self.stage}"
        maybe = (
            f"; skipped between them, so maybe theirs: {', '.join(self.found.ambiguous)}"
            if self.found.ambiguous
            else ""
        )
        if self.regression:
            return (
                f"{package} {self.first_bad} introduced it in {where} (last good {self.last_good}; {searched}{maybe})"
            )
        return f"{package} {self.last_good} fixed it in {where} (last bad {self.first_bad}; {searched}{maybe})"

    def to_dict(self) -> dict[str, Any]:
        deciding = self.deciding_checks
        first_bad, last_good = self.at_stage(self.first_bad), self.at_stage(self.last_good)
        return {
            "matrix": str(self.target.spec.path),
            "environment": dict(self.target.env.axes) | {self.target.axis: "*"},
            "modes": list(self.target.modes),
            "axis": self.target.axis,
            "package": self.target.package,
            "good": self.good,
            "bad": self.bad,
            "direction": "regression" if self.regression else "fix",
            "stage": self.stage,
            "first_bad": {"version": self.first_bad, "evidence": first_bad.evidence},
            "last_good": {"version": self.last_good, "evidence": last_good.evidence},
            "ambiguous": list(self.found.ambiguous),
            "candidates": list(self.candidates),
            "tried": [{**c.to_dict(), "label": self.labels.get(c.version)} for c in deciding],
            "skipped": list(self.found.skipped),
            "checks": {
                "run": sum(not c.reused for c in self.checks),
                "reused": sum(c.reused for c in self.checks),
                "at_stage": {"run": sum(not c.reused for c in deciding), "reused": sum(c.reused for c in deciding)},
                "at_most": max_steps(len(self.candidates)) + 2,
                "all": [c.to_dict() for c in self.checks],
            },
            "note": NOTE_PREFIX + self.note,
        }


def bisect(
    target: Target,
    candidates: Sequence[str],
    *,
    good: str,
    bad: str,
    checker: Checker,
    stage: str | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> Bisection:
    """Find the deciding stage from the ends, then the release where the verdict flips (see module doc)."""
    here = checker.stages_here()
    if stage is not None and stage not in here:
        raise InputError(f"--stage {stage}: this host decides at {', '.join(here) or 'no stage'} for this environment")
    checks: list[Check] = []

    def run(version: str, at: str, role: str = "") -> Check:
        check = checker.check(version, at)
        checks.append(check)
        cost = "reused" if check.reused else f"{check.seconds:.0f} s"
        say(f"{target.package} {version} at {at}{role}: {check.evidence} [{cost}]")
        return check

    deciding = None
    for at in (stage,) if stage else here:
        good_check = _end(run(good, at, " (--good)"), "--good")
        bad_check = _end(run(bad, at, " (--bad)"), "--bad")
        if good_check.verdict != bad_check.verdict:
            deciding = at
            break
        say(f"{good} and {bad} agree at {at}: {good_check.verdict}")
    if deciding is None:
        raise InputError(
            f"{target.package} {good} and {bad} get the same verdicts at every stage this host decides "
            f"({', '.join((stage,) if stage else here)}): nothing to bisect here"
            + ("" if "serve" in here else "; serving decides on a host with the environment's GPUs")
        )
    say(f"deciding stage: {deciding}; {len(candidates)} releases from {candidates[0]} to {candidates[-1]}")
    good_is_old = Version(good) < Version(bad)
    labels: dict[str, Label] = {good: "good", bad: "bad"}

    def decide(version: str) -> Literal["old", "new", "skip"]:
        check = run(version, deciding)
        label: Label = "skip" if check.undecided else "good" if check.verdict == good_check.verdict else "bad"
        labels[version] = label
        if label == "skip":
            return "skip"
        return "old" if (label == "good") == good_is_old else "new"

    found = search(list(candidates), decide)
    return Bisection(
        target=target,
        good=good,
        bad=bad,
        candidates=tuple(candidates),
        stage=deciding,
        found=found,
        checks=tuple(checks),
        labels=labels,
    )


def _end(check: Check, flag: str) -> Check:
    why = check.undecided
    if why is None:
        return check
    if why.startswith("unresolvable"):
        raise InputError(
            f"{flag} {check.version} cannot be installed in this environment ({why}); an unresolvable release is "
            "neither good nor bad: give another"
        )
    raise Undecided(
        f"{flag} {check.version} could not be checked at {check.stage}: {why} (run again: faults are retried)"
    )


def record_note(bisection: Bisection, store_path: Path, run_id: str) -> int:
    """The bisection's note on the failing side's failed cells, as new rows of those cells (same verdict and
    inputs, this bisection's run id), so the report's failure page of their class names the release. Returns
    how many rows were written."""
    side = bisection.at_stage(bisection.first_bad)
    note = NOTE_PREFIX + bisection.note
    written = 0
    with Store(store_path) as store:
        rows = {(r.run_id, r.cell_id): r for r in store.all_rows()}
        for cell in side.cells:
            row = rows.get((cell.run_id, cell.cell_id))
            if row is None or failure_class(cell.verdict) is None or note in (row.evidence or []):
                continue  # no failure to explain, or a row this bisection already noted (a run read back)
            kept = {k: v for k, v in row.values.items() if k not in _NOT_COPIED}
            store.record(**kept, run_id=run_id, evidence=[*(row.evidence or []), note])
            written += 1
    return written
