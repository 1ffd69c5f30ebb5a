"""Naming a pre-flight failure's cause again from its stored evidence, with today's signatures.

Which class a failure belongs to is not a pre-flight stage's result: the stage decided that the stack fails
(and kept the output that shows it); the classifier names why. So a stored or published pre-flight verdict
is named again from its excerpt whenever it is reused (`run/reuse.py`) or published (`report/publish.py`),
in seconds, and no stage's key covers the classifier or the signatures: a classifier change leaves every
stored pre-flight result reusable and renames what it names differently.

The stage whose failure the classifier names is the import check (`importcheck.import_failure`); a hook's
own classes (sglang's `unknown-flag`, the load pre-flight's) are its code's result and in its key. The
deciding stage is read from a row's `preflight` outcomes, or, for a row stored before those, from the import
check's evidence line. A published excerpt's host paths were shortened (`.../site-packages/x.py`,
`report.regressions.scrub_host_paths`): they are read back as absolute paths, as the check saw them, so the
traceback frames that name a dependency conflict still parse.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

from servematrix.engines import Engine, available_engines, load_engine
from servematrix.stages.importcheck import import_failure

IMPORT = "import"
RENAMED_PREFIX = "cause named again from the stored excerpt by today's signatures"
_IMPORT_NOTE = re.compile(r"^import check(?: \(cached\))?: fail ")
_SHORTENED = re.compile(r'(File ")\.\.\./')


def readable(excerpt: str) -> str:
    """A stored excerpt with its shortened host paths made absolute again (`File ".../x.py"` → `File "/.../x.py"`)."""
    return _SHORTENED.sub(r"\1/.../", excerpt)


@functools.cache
def _engine(name: str) -> Engine | None:
    return load_engine(name) if name in available_engines() else None


def deciding_stage(row: Mapping[str, Any]) -> str | None:
    """The pre-flight stage whose verdict a row carries: its `preflight` outcomes say it; a row stored before
    them is the import check's when the check's failure note is in its evidence and nothing was served."""
    outcomes = row.get("preflight") or {}
    for stage, outcome in outcomes.items():
        if isinstance(outcome, Mapping) and outcome.get("outcome") == "verdict":
            return str(stage)
    if outcomes:
        return None
    if str(row.get("verdict") or "").startswith("predicted-fail:") and any(
        _IMPORT_NOTE.match(str(e)) for e in row.get("evidence") or []
    ):
        return IMPORT
    return None


def import_class(excerpt: str, engine: Engine) -> str | None:
    """The class today's signatures give an import failure's output, or None when it is no failure now."""
    outcome, klass, _ = import_failure(readable(excerpt), engine, returncode=1)
    return klass if outcome == "fail" else None


def named_now(row: Mapping[str, Any]) -> str:
    """The row's verdict with its pre-flight failure's class as today's signatures name it (the same verdict
    where the classifier does not name it)."""
    verdict = str(row.get("verdict") or "")
    kind = verdict.partition(":")[0]
    if kind != "predicted-fail" or deciding_stage(row) != IMPORT:
        return verdict
    engine = _engine(str(row.get("engine") or ""))
    excerpt = str(row.get("excerpt") or "")
    klass = import_class(excerpt, engine) if engine is not None and excerpt else None
    return f"{kind}:{klass}" if klass else verdict


def renamed(values: Mapping[str, Any]) -> dict[str, Any]:
    """A row's values with `named_now`'s verdict, and a note of the earlier class where it changed."""
    now = named_now(values)
    if now == values.get("verdict"):
        return dict(values)
    note = f"{RENAMED_PREFIX} (was {values.get('verdict')})"
    evidence = [e for e in values.get("evidence") or [] if not str(e).startswith(RENAMED_PREFIX)]
    return {**values, "verdict": now, "evidence": [*evidence, note]}
