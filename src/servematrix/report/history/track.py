"""The pre-flight's track record: CPU predictions against later GPU observations of the same inputs.

A CPU verdict predicts a GPU run: `skipped:no-gpu` (every pre-flight passed) predicts a pass, `predicted-fail:<class>`
and a pre-flight's `fail:<class>` a failure. A GPU entry of a cell's history (a pass or a fail decided on a GPU) is
compared with the newest earlier CPU entry of the same cell with the same inputs (`record.same_inputs` but for
where it was decided); a row that carries its own `prediction` counts too. Whether the outcome (pass or fail)
held is counted by the predicted class; a contradicted prediction is listed with both entries.

A GPU run pre-flights itself first, on the interpreter it serves with (issue 47, `run/pipeline.py`), and
stores that prediction (`prediction`) and each pre-flight stage's outcome (`preflight`) beside what it
observed. `scored` reads those pairs, per engine and per pre-flight: confirmed, contradicted, or not
comparable and why (the run decided nothing, the pre-flight could not run there, it passed and the server
failed for a cause it may not check).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servematrix.records.history import History, HistoryEntry
from servematrix.report.escape import code, text
from servematrix.report.history.record import HISTORY, decided_on, entry_of, known_same, load_history, verdict_kind
from servematrix.store.rowschema import Row


@dataclass(frozen=True, kw_only=True)
class Contradiction:
    cell_id: str
    predicted: HistoryEntry  # the CPU entry
    observed: HistoryEntry  # the GPU entry


CONFIRMED, CONTRADICTED, NOT_COMPARABLE = "confirmed", "contradicted", "not comparable"
SERVED = "served"  # where a GPU run's own prediction was made: the interpreter it served with


def predicted_on(entry: HistoryEntry) -> str:
    """Where a contradicted prediction was made, as the page and the table say it."""
    return "the served interpreter" if entry.on == SERVED else "a CPU"


def score(predicted: str, observed: str) -> str:
    """One pair: `confirmed`, `contradicted`, or `not comparable: <why>`."""
    kind = verdict_kind(observed)
    if kind not in ("pass", "fail"):
        return f"{NOT_COMPARABLE}: the GPU run decided nothing ({observed})"
    found = ("pass", "") if predicted == "pass" else _prediction(predicted)
    if found is None:
        return f"{NOT_COMPARABLE}: {predicted} predicts nothing about serving"
    return CONFIRMED if found[0] == kind else CONTRADICTED


def stage_score(outcome: Mapping[str, Any], observed: str) -> str:
    """One pre-flight stage's outcome against the observation."""
    how = str(outcome.get("outcome") or "")
    if how == "verdict":
        return score(str(outcome.get("verdict") or ""), observed)
    if how != "passed":
        why = next(iter(outcome.get("evidence") or []), how or "no outcome")
        return f"{NOT_COMPARABLE}: it could not run there ({str(why)[:120]})"
    found = score("pass", observed)
    if found == CONTRADICTED:
        return f"{NOT_COMPARABLE}: it passed, and the server failed with {observed} (a cause it may not check)"
    return found


@dataclass(frozen=True, kw_only=True)
class Scores:
    """The pairs of GPU runs that pre-flighted themselves: per engine (the whole prediction) and per
    (engine, pre-flight), the count of each score; `why`: the reasons of the not comparable ones."""

    by_engine: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    by_preflight: Mapping[tuple[str, str], Mapping[str, int]] = field(default_factory=dict)
    why: Mapping[str, int] = field(default_factory=dict)

    def lines(self) -> list[str]:
        def counts(found: Mapping[str, int]) -> str:
            return ", ".join(f"{found.get(k, 0)} {k}" for k in (CONFIRMED, CONTRADICTED, NOT_COMPARABLE))

        out = [f"GPU runs' own CPU predictions, {engine}: {counts(c)}" for engine, c in sorted(self.by_engine.items())]
        out += [
            f"  {stage} pre-flight ({engine}): {counts(c)}" for (engine, stage), c in sorted(self.by_preflight.items())
        ]
        out += [f"  not comparable ({n}): {why}" for why, n in sorted(self.why.items())]
        return out


# Stages of a row's `preflight` that predict nothing about serving: a cell that did not resolve is never served.
NOT_PREDICTIONS = frozenset({"resolve"})
NOTHING_RAN = "no pre-flight ran on the served interpreter (each could not run there)"


def _stages(row: Row) -> dict[str, Mapping[str, Any]]:
    """The row's pre-flight stages that predict serving, by name, with their stored outcomes."""
    outcomes = row.preflight or {}
    return {
        str(stage): found
        for stage, found in outcomes.items()
        if isinstance(found, Mapping) and stage not in NOT_PREDICTIONS
    }


def ran(row: Row) -> bool:
    """Whether the row's own prediction rests on a pre-flight that ran: a predicted failure, or a pre-flight
    that passed or gave a verdict. A `pass` where each could not run (or none is stored) predicts nothing."""
    if str(row.prediction or "") != "pass":
        return True
    return any(found.get("outcome") in ("passed", "verdict") for found in _stages(row).values())


def scored(rows: Iterable[Row]) -> Scores:
    """Every row that carries its own prediction, scored (see the module doc)."""
    by_engine: dict[str, Counter[str]] = {}
    by_preflight: dict[tuple[str, str], Counter[str]] = {}
    why: Counter[str] = Counter()
    for row in rows:
        predicted, observed = row.prediction, str(row.verdict or "")
        if not predicted or decided_on(row) == "cpu":
            continue
        engine = str(row.engine or "")
        whole = score(str(predicted), observed) if ran(row) else f"{NOT_COMPARABLE}: {NOTHING_RAN}"
        pairs: list[tuple[str | None, str]] = [(None, whole)]
        pairs += [(stage, stage_score(found, observed)) for stage, found in _stages(row).items()]
        for stage, found in pairs:
            head, _, reason = found.partition(": ")
            target = (
                by_engine.setdefault(engine, Counter())
                if stage is None
                else by_preflight.setdefault((engine, stage), Counter())
            )
            target[head] += 1
            if reason:
                why[reason] += 1
    return Scores(by_engine=by_engine, by_preflight=by_preflight, why=dict(why))


@dataclass(frozen=True, kw_only=True)
class TrackRecord:
    """CPU predictions against later GPU observations of the same inputs, by predicted class."""

    by_class: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # class -> (held, compared)
    contradicted: tuple[Contradiction, ...] = ()
    scores: Scores = field(default_factory=Scores)  # GPU runs that pre-flighted themselves (`scored`)

    @property
    def held(self) -> int:
        return sum(h for h, _ in self.by_class.values())

    @property
    def compared(self) -> int:
        return sum(n for _, n in self.by_class.values())

    def line(self) -> str:
        return "\n".join([self._line(), *self.scores.lines()])

    def _line(self) -> str:
        if not self.compared:
            return (
                "CPU predictions confirmed on a GPU: no cell has both a CPU prediction and a later GPU run of the "
                "same inputs yet (insufficient data)"
            )
        classes = "; ".join(f"{cls} {h} of {n}" for cls, (h, n) in sorted(self.by_class.items()))
        return f"CPU predictions confirmed on a GPU: {self.held} of {self.compared} ({classes})"


def _prediction(verdict: str) -> tuple[str, str] | None:
    """(predicted outcome kind, class) of a CPU verdict, or None when it predicts nothing about serving."""
    kind, _, detail = verdict.partition(":")
    if verdict == "skipped:no-gpu":
        return "pass", "passed the pre-flights"
    if kind in ("predicted-fail", "fail"):
        return "fail", detail or kind
    return None


def track_record(history: History | None, rows: Iterable[Row] = ()) -> TrackRecord:
    """For each GPU observation (pass or fail) with an earlier CPU prediction of the same inputs, in a cell's
    history, or in a row's own `prediction` field: whether the prediction held, by its class."""
    rows = list(rows)  # read twice: the pairs of history, and the rows' own predictions (`scored`)
    by_class: dict[str, list[int]] = {}
    contradicted: list[Contradiction] = []
    seen: set[tuple[str, str]] = set()
    for cell_id, cell in sorted((history.cells if history is not None else {}).items()):
        entries = cell.entries
        for index, observed in enumerate(entries):
            if observed.on in ("cpu", None) or verdict_kind(str(observed.verdict)) not in ("pass", "fail"):
                continue
            earlier = next(
                (
                    e
                    for e in reversed(entries[:index])
                    if e.on == "cpu"
                    and _prediction(str(e.verdict)) is not None
                    and e.inputs is not None
                    and e.inputs == observed.inputs
                    and known_same(e, observed, "lock")
                ),
                None,
            )
            if earlier is None:
                continue
            outcome, cls = _prediction(str(earlier.verdict)) or ("", "")
            held = outcome == verdict_kind(str(observed.verdict))
            counts = by_class.setdefault(cls, [0, 0])
            counts[0] += int(held)
            counts[1] += 1
            seen.add((cell_id, str(observed.run_id)))
            if not held:
                contradicted.append(Contradiction(cell_id=cell_id, predicted=earlier, observed=observed))
    for row in rows:
        predicted, verdict = row.prediction, str(row.verdict or "")
        if not predicted or decided_on(row) == "cpu" or verdict_kind(verdict) not in ("pass", "fail"):
            continue
        if (str(row.cell_id), str(row.run_id)) in seen or not ran(row):
            continue
        found = _prediction(str(predicted)) or (("pass", "passed the pre-flights") if predicted == "pass" else None)
        if found is None:
            continue
        outcome, cls = found
        held = outcome == verdict_kind(verdict)
        counts = by_class.setdefault(cls, [0, 0])
        counts[0] += int(held)
        counts[1] += 1
        if not held:
            observed = entry_of(row)
            contradicted.append(
                Contradiction(
                    cell_id=str(row.cell_id),
                    # made by the same run, on the interpreter it then served with
                    predicted=HistoryEntry(verdict=predicted, on=SERVED, run_id=row.run_id, date=observed.date),
                    observed=observed,
                )
            )
    return TrackRecord(
        by_class={k: (v[0], v[1]) for k, v in by_class.items()},
        contradicted=tuple(contradicted),
        scores=scored(rows),
    )


def track_record_markdown(history: History | None, rows: Sequence[Row]) -> str:
    """The track record for the recommendation: one line, then each contradicted prediction with both rows."""
    found = track_record(history, rows)
    head, *scores = found.line().splitlines()  # the scores of GPU runs' own predictions: a line each
    lines = [text(head) + "\n", *(f"- {text(line.strip())}" for line in scores), *([""] if scores else [])]
    for c in found.contradicted:
        p, o = c.predicted, c.observed
        lines.append(
            f"- {code(c.cell_id)}: predicted {code(str(p.verdict))} on {text(predicted_on(p))} "
            f"({text(str(p.date or '')[:10])}, run {code(str(p.run_id))}); observed "
            f"{code(str(o.verdict))} on {text(str(o.on))} ({text(str(o.date or '')[:10])}, "
            f"run {code(str(o.run_id))})"
        )
    return "\n".join(lines) + ("\n" if found.contradicted else "")


def published_line(site: Path, rows: Sequence[Row]) -> str:
    """The track record of a published site (its `results/history.json`; none yet: no pair) for `recommend`."""
    try:
        found = load_history(site / HISTORY)
    except (OSError, ValueError):
        found = None
    return track_record(found, rows).line()
