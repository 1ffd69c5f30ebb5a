"""What the report reads from a stored row, shared by the table, the plots and the recommendations."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from servematrix.store import Row


def tok_s(row: Row) -> dict[int, float]:
    metrics = row.get("metrics") or {}
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
