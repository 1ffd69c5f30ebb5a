"""What a failed `uv pip compile` says: whose fault it is (`unresolvable`, the versions; `error`, the day: the
network, an offline cache miss, anything unrecognised) by the patterns of data/harness_faults.toml [resolve], and
the resolver's own explanation, trimmed."""

from __future__ import annotations

import re
from typing import Literal

from servematrix.formats.verdict import harness_faults

Status = Literal["resolved", "unresolvable", "error"]

_MAX_REASON_LINES = 15


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)


def trim_reason(stderr: str, *, max_lines: int = _MAX_REASON_LINES) -> str:
    """The resolver's own explanation, without warnings and hint noise, at most `max_lines` lines."""
    kept: list[str] = []
    in_hint = False
    for raw in _strip_ansi(stderr).splitlines():
        line = raw.strip()
        if not line:
            in_hint = False
            continue
        lowered = line.lower()
        if lowered.startswith("warning:") or re.match(r"^resolved \d+ packages", lowered):
            in_hint = False
            continue
        if lowered.startswith("hint:"):
            # The platform hint names the tags that do exist, which is the useful half of that failure.
            in_hint = "platform" not in lowered
            if in_hint:
                continue
        elif in_hint:
            continue
        for prefix in ("error: ", "cause: ", "hint: "):
            if line.startswith(prefix):
                line = line[len(prefix) :]
                break
        kept.append(line)
    if len(kept) > max_lines:
        dropped = len(kept) - (max_lines - 1)
        kept = [*kept[: max_lines - 1], f"… ({dropped} more lines)"]
    return "\n".join(kept)


def failure_kind(stderr: str) -> Literal["network", "offline-miss", "conflict", "other"]:
    """Which kind of failure uv's stderr shows, by the patterns of data/harness_faults.toml [resolve]."""
    text = _strip_ansi(stderr)
    rules = harness_faults().resolve
    if any(p.search(text) for p in rules.network_patterns):
        return "network"
    if any(p.search(text) for p in rules.offline_miss_patterns):
        return "offline-miss"
    if any(p.search(text) for p in rules.conflict_patterns):
        return "conflict"
    return "other"


def classify_failure(stderr: str) -> tuple[Status, str]:
    """(status, trimmed reason) for a failed uv run.

    Only a resolver conflict is `unresolvable`; network trouble, an offline cache miss and anything
    unrecognised are `error`, so that they are retried rather than published as a verdict.
    """
    kind = failure_kind(stderr)
    status: Status = "unresolvable" if kind == "conflict" else "error"
    reason = trim_reason(stderr)
    if not reason:
        reason = "uv failed without an explanation"
    return status, reason
