"""A GPU run's own pre-flights (issue 47): before a cell is served, the CPU pre-flights run on the interpreter
and packages it is served with, so the prediction and the observation share their inputs; the runner stores
the prediction beside what the server showed, and the track record scores the pair
(`report/history/track.py`). The hooks get that interpreter as their environment where it is a host path
(venv, existing; in a container the load pre-flight has none). Here: the import check of that interpreter."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from servematrix.engines import Engine
from servematrix.formats.verdict import Verdict
from servematrix.stages import importcheck
from servematrix.util import run_captured

# (the verdict it ended the cell with, the evidence it added, `unavailable`/`error` or "")
Outcome = tuple[Verdict | None, tuple[str, ...], str]


def host_python(prefix: Sequence[str]) -> Path | None:
    """The interpreter of a backend's `python` command as a host path; None for a container's command."""
    return Path(prefix[0]) if len(prefix) == 1 else None


def import_on_built(prefix: Sequence[str], engine: Engine, *, timeout_s: float = 900) -> Outcome | None:
    """The engine's import check (its modules imported, `--help` run) by the served interpreter `prefix`, no
    lock installed: a failure, classified as the import check classifies one, predicts the cell's. None when
    the engine has no import check."""
    check = engine.import_check
    if "import" not in engine.preflight or not check.modules:
        return None
    commands = [[*prefix, "-c", f"import {module}"] for module in check.modules]
    if check.help:
        commands.append([x for a in check.help for x in (prefix if a in ("python", "python3") else [a])])
    for command in commands:
        done = run_captured(command, env={**os.environ, **check.env}, timeout_s=timeout_s)
        if done.timed_out:
            return None, (f"the import check took more than {timeout_s:.0f} s",), "unavailable"
        if done.returncode != 0:
            text = done.stdout + "\n" + done.stderr
            outcome, klass, deciding = importcheck.import_failure(text, engine, returncode=done.returncode)
            if outcome != "fail":
                return None, (f"import check: {outcome} {klass}: {deciding}",), "unavailable"
            note = f"import check on the served interpreter: fail {klass}: {deciding}"
            return Verdict(kind="predicted-fail", detail=klass, excerpt=text[-3000:], evidence=(note,)), (), ""
    return None, (f"import check on the served interpreter: pass: imported {', '.join(check.modules)}",), ""
