"""What a run shows while it works: plain lines in a log, a bar on a terminal, a summary that never cuts."""

from __future__ import annotations

import io

from rich.console import Console

from servematrix.plan import make_plan
from servematrix.progress import RunProgress, print_summary
from tests.conftest import MATRIX


def test_without_a_terminal_each_cell_and_stage_is_one_plain_line():
    plan = make_plan(MATRIX / "cpu-smoke.toml", [], None)
    out = io.StringIO()
    progress = RunProgress(Console(file=out, force_terminal=False, width=80), title="cpu-smoke.toml", total=4)
    first, second = plan.cells[:2]
    with progress.shown():
        progress.stage(first, "resolve")
        progress.finished(first, "pass")
        progress.stage(second, "serve")
    lines = out.getvalue().splitlines()
    axes = " ".join(f"{k}={v}" for k, v in first.env.axes.items())
    assert lines[0].startswith("[0/4") and lines[0].endswith(f"{first.id} {axes} mode={first.mode}: resolve")
    assert lines[1].startswith("[1/4") and lines[1].endswith(f"mode={first.mode}: pass")
    assert lines[2].startswith("[1/4") and lines[2].endswith(
        f"{second.id} {' '.join(f'{k}={v}' for k, v in second.env.axes.items())} mode={second.mode}: serve"
    )
    assert "\x1b[" not in out.getvalue()  # no terminal codes in a log


def test_on_a_terminal_one_bar_counts_the_cells_and_no_line_per_stage():
    plan = make_plan(MATRIX / "cpu-smoke.toml", [], None)
    out = io.StringIO()
    progress = RunProgress(Console(file=out, force_terminal=True, width=120), title="cpu-smoke.toml", total=2)
    with progress.shown():
        for cell in plan.cells[:2]:
            progress.stage(cell, "serve")
            progress.finished(cell, "pass")
    text = out.getvalue()
    assert "2/2" in text and "cpu-smoke.toml" in text
    assert "mode=" not in text  # the plain per-stage lines are for logs only


def test_the_summary_never_cuts_a_verdict_at_80_columns():
    plan = make_plan(MATRIX / "glm5-nvfp4.toml", [], None)
    out = io.StringIO()
    verdicts = ["predicted-fail:dynamo-untraceable", "fail:unknown-flag", "skipped:not-applicable", "unresolvable"]
    ran = {cell.id: verdicts[i % len(verdicts)] for i, cell in enumerate(plan.cells[:8])}
    print_summary(Console(file=out, force_terminal=False, width=80), "r", {c.id: c for c in plan.cells}, ran)
    text = out.getvalue()
    assert "…" not in text
    for verdict in verdicts:
        assert verdict in text
    assert max(len(line) for line in text.splitlines()) <= 80
    for cell_id in ran:
        assert cell_id in text
