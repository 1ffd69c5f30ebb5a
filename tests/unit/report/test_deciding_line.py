"""The line a failure page and the table's details show for a failing cell: the one that says why, read from
excerpts the harness made of real logs, not the excerpt's last line (the next frame, "Received sigquit", a
hint)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servematrix.classify import match_file
from servematrix.records.row import Row
from servematrix.report.markdown import deciding_line

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def _row_from(log: str, engine: str = "sglang") -> Row:
    """A failing row as the harness stores it: the class and excerpt its live classification gives."""
    found = match_file(LOGS / log, engine)
    assert found is not None
    return Row.of({"engine": engine, "verdict": f"fail:{found.cls}", "excerpt": found.excerpt})


@pytest.mark.parametrize(
    ("log", "wanted"),
    [
        # Named from a traceback's frames: the exception the frames lead to, not what the server said after.
        (
            "h200-sglang-0.5.12-glm5-breakable-warmup.log",
            "RuntimeError: Unknown keyword argument 'topk_indices' for operator",
        ),
        # Named by a line: the signature's own line, not sglang's hint and the traceback after it.
        ("graph-capture-failed.log", "[2026-01-01 10:04:32 TP0] Piecewise CUDA Graph failed with error: PCG"),
        ("moe-runner-unsupported-sglang-0.5.12.log", "NotImplementedError: Unsupported runner backend:"),
        ("kernel-fault-capture-sglang-0.5.12.log", "RuntimeError: CUDA error: an illegal memory access"),
    ],
)
def test_the_line_that_decided_a_real_failure(log, wanted):
    row = _row_from(log)
    line = deciding_line(row)
    assert line.startswith(wanted)
    lines = [x for x in str(row.excerpt).strip().splitlines() if x.strip()]
    assert line != lines[-1].strip()[:200]  # the excerpt's last line was what the pages showed
    assert line in (x.strip()[:200] for x in lines)


def test_a_signature_line_is_preferred_to_the_exception_after_it():
    excerpt = (
        "[2026-12-05 02:27:49] Piecewise CUDA Graph failed with error: Unknown keyword argument 'topk_indices'\n"
        "To work around this error, add --disable-piecewise-cuda-graph to your launch command.\n"
        "Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File ".../scheduler.py", line 4025, in run_scheduler_process\n'
        "RuntimeError: Unknown keyword argument 'topk_indices'\n"
    )
    row = Row.of({"engine": "sglang", "verdict": "fail:graph-capture-failed", "excerpt": excerpt})
    assert deciding_line(row).startswith("[2026-12-05 02:27:49] Piecewise CUDA Graph failed with error:")


def test_a_pre_flights_note_after_its_error_is_not_the_line():
    excerpt = (
        'File "sglang/srt/layers/moe/moe_runner/runner.py", line 67, in __init__\n'
        "NotImplementedError: Unsupported runner backend: MoeRunnerBackend.CUTLASS\n"
        "faked: torch.cuda device queries answer sm_120 (capability, properties, memory)\n"
    )
    # A class no signature names by a line of this text: the exception line decides.
    row = Row.of({"engine": "sglang", "verdict": "predicted-fail:load-failed", "excerpt": excerpt})
    assert deciding_line(row) == "NotImplementedError: Unsupported runner backend: MoeRunnerBackend.CUTLASS"


def test_without_a_signature_or_an_exception_the_last_line_stands():
    excerpt = (
        "No solution found when resolving dependencies\nwe can conclude that your requirements are unsatisfiable.\n"
    )
    row = Row.of({"engine": "sglang", "verdict": "unresolvable", "excerpt": excerpt})
    assert deciding_line(row) == "we can conclude that your requirements are unsatisfiable."
    assert deciding_line(Row.of({"engine": "nosuch", "verdict": "fail:x", "excerpt": ""})) == ""
    unknown_engine = Row.of({"engine": "no-such-engine", "verdict": "fail:x", "excerpt": "a\nValueError: b\n"})
    assert deciding_line(unknown_engine) == "ValueError: b"
