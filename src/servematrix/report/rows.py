"""What the report reads from a stored row, shared by the table, the plots and the recommendations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from packaging.version import InvalidVersion, Version

from servematrix.stages import bench
from servematrix.store.store import Row

if TYPE_CHECKING:
    from servematrix.engines import Engine
    from servematrix.stages.bench import ModeComparison, Speedup


def tok_s(row: Row) -> dict[int, float]:
    metrics = row.metrics or {}
    out: dict[int, float] = {}
    for level in metrics.get("levels", []):
        median = (level.get("output_tok_s") or {}).get("median")
        if median is not None and level.get("completion_tokens"):
            out[int(level["concurrency"])] = float(median)
    return out


def version_key(value: str) -> tuple[int, Version | str]:
    """`pinned` first, then versions in order, then anything else by name."""
    if value == "pinned":
        return (0, "")
    try:
        return (1, Version(value))
    except InvalidVersion:
        return (2, value)


def ttft_ms(row: Row) -> dict[int, float]:
    """The prefill profile's median time to first token (ms) at each level it measured, for a passed row."""
    prefill = (row.metrics or {}).get("prefill") or {}
    out: dict[int, float] = {}
    for level in prefill.get("levels", []) if isinstance(prefill, dict) else []:
        median = (level.get("ttft_mean_s") or {}).get("median")
        if median is not None:
            out[int(level["concurrency"])] = float(median) * 1000
    return out


def prefill_input_len(rows: Sequence[Row]) -> int | None:
    """The prefill profile's input length, as its rows recorded it (the first that did)."""
    for row in rows:
        prefill = (row.metrics or {}).get("prefill") or {}
        value = (prefill.get("workload") or {}).get("input_len") if isinstance(prefill, dict) else None
        if isinstance(value, int):
            return value
    return None


def comparison(engine: Engine, first: Row | None, second: Row | None) -> ModeComparison | None:
    """`second`'s mode against `first` (the baseline) on the figures of the phase the mode changes, when both
    passed and measured them; None otherwise (`markdown.no_speedup` says why)."""
    if first is None or second is None or first.verdict != "pass" or second.verdict != "pass":
        return None
    try:
        found = bench.compare(
            first.metrics or {},
            second.metrics or {},
            engine.phase_of(second.mode),
            unjudged=unchecked_output(second),
        )
    except (ValueError, KeyError, TypeError):  # a row from a merged store whose figures are not figures
        return None
    return found if found.headline is not None else None


def unchecked_output(row: Row) -> str:
    """Why a passing mode's speed is not judged: "" when its answers matched the baseline's (`stages/bench/
    correctness.py`), else what was missing. Rows measured before the check existed have no record of it."""
    record = (row.metrics or {}).get("correctness")
    if not isinstance(record, dict):
        return "output not checked against the baseline's"
    result = record.get("result")
    if isinstance(result, dict) and result.get("ok") is True:
        return ""
    return "output not checked: no baseline answers to compare with"


def speedup_text(found: Speedup, *, bold: bool = True) -> str:
    """`**1.22×** TTFT @1, 1024 in (1.10–1.35, faster)`: the ratio, its interval over server starts and the
    verdict (`stages/bench/compare.py`)."""
    ratio = f"{found.ratio:.2f}×"
    return f"{'**' + ratio + '**' if bold else ratio} {found.heading} ({found.range_text})"


NOT_CHECKED = "correctness: not checked (measured before servematrix checked answers)"


def measured_notes(row: Row) -> list[tuple[str, str]]:
    """A measured row's (label, text) lines for its cell's details: whether its answers were right, and each
    graph capture's seconds per server start (the start-up cost the mode adds)."""
    measured = row.metrics or {}
    if not measured:
        return []
    out: list[tuple[str, str]] = []
    checked = measured.get("correctness")
    summary = str(checked.get("summary") or "") if isinstance(checked, dict) else ""
    if summary or row.verdict == "pass":
        out.append(("correctness", (summary or NOT_CHECKED).removeprefix("correctness: ")))
    seconds: dict[str, list[str]] = {}
    for start in measured.get("capture_s_by_start") or [measured.get("capture_s")]:
        for what, value in start.items() if isinstance(start, dict) else ():
            seconds.setdefault(str(what), []).append(f"{float(value):.1f}")
    if seconds:
        out.append(
            (
                "graph capture, s per server start",
                "; ".join(f"{what} {', '.join(v)}" for what, v in sorted(seconds.items())),
            )
        )
    return out


# Evidence lines that say where a result came from rather than what decided it.
PROVENANCE_NOTES = (
    "existing environment ",
    "differs from the lock: ",
    "import check",
    "start ",
    "2 interleaved",
    "1 interleaved",
)


def deciding_evidence(row: Row) -> str:
    """What decided the verdict (a signature's label, a mode's proof), for a table cell: provenance notes (the
    installed set, the lock's differences, the number of starts) stay in the cell's details."""
    evidence = [str(e) for e in row.evidence or [] if not str(e).startswith(PROVENANCE_NOTES)]
    measured = row.metrics or {}
    if row.verdict == "pass" and measured and not isinstance(measured.get("correctness"), dict):
        evidence.insert(1, NOT_CHECKED)  # measured, but nothing says its answers were right
    return ", ".join(e if len(e) <= 90 else e[:89] + "…" for e in evidence[:2])
