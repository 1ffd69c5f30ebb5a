"""What a run shows while it works: plain lines in a log, a bar on a terminal, a summary that never cuts."""

from __future__ import annotations

import io
from dataclasses import replace

from rich.console import Console

from servematrix.planning.plan import make_plan
from servematrix.run.progress import RunProgress, print_summary
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


def _beats(text: str) -> list[str]:
    return [line for line in text.splitlines() if "still running" in line]


def test_a_long_stage_in_a_log_gets_a_heartbeat_with_its_step_and_bytes_downloaded():
    import threading
    import time

    plan = make_plan(MATRIX / "cpu-smoke.toml", [], None)
    out = io.StringIO()
    received = iter(range(0, 10**12, 3_000_000))  # a byte counter that grows 3 MB per reading
    lock = threading.Lock()

    def downloaded() -> int:
        with lock:
            return next(received)

    progress = RunProgress(
        Console(file=out, force_terminal=False, width=80), title="t", total=1, heartbeat_s=0.3, downloaded=downloaded
    )
    cell = plan.cells[0]
    with progress.shown():
        progress.stage(cell, "build")
        time.sleep(1.2)
        progress.finished(cell, "pass")
        time.sleep(0.8)  # between cells: still a sign of life
    lines = out.getvalue().splitlines()
    beats = _beats(out.getvalue())
    assert len(beats) >= 2, lines
    assert all(": build still running: " in b and " MB downloaded" in b for b in beats)
    after = lines[lines.index(next(line for line in lines if line.endswith(": pass"))) + 1 :]
    assert after and all("preparing the next cell: " in line and "downloaded" in line for line in after), lines
    assert "\x1b[" not in out.getvalue()


def test_lines_of_the_run_itself_count_as_signs_of_life():
    import time

    plan = make_plan(MATRIX / "cpu-smoke.toml", [], None)
    out = io.StringIO()
    progress = RunProgress(
        Console(file=out, force_terminal=False, width=80), title="t", total=4, heartbeat_s=0.6, downloaded=lambda: 0
    )
    with progress.shown():
        for cell in plan.cells:  # a new stage every 0.2 s: never silent for 0.6 s
            progress.stage(cell, "serve")
            time.sleep(0.2)
    assert _beats(out.getvalue()) == []


def test_a_broken_byte_counter_does_not_stop_the_run():
    def broken() -> int:
        raise OSError("no /proc/net here")

    progress = RunProgress(Console(file=io.StringIO()), title="t", total=1, downloaded=broken)
    cell = make_plan(MATRIX / "cpu-smoke.toml", [], None).cells[0]
    progress.stage(cell, "import")
    assert "0 kB downloaded" in (progress.heartbeat_text() or "")


def _work(**changes):
    from servematrix.run.progress import Step, Work

    fields = dict(
        matrix="matrix/glm5-nvfp4.toml",
        cells=52,
        environments=26,
        host="no NVIDIA GPU found",
        to_run=52,
        not_run={"unchanged since their last finished run": 0},
        stages=("resolve", "import", "probe"),
        steps=(
            Step(
                stage="import",
                count=22,
                maybe=4,
                what="lock(s) installed",
                cost="about 9 GB and 1.5-2 min each",
                each_gb=9,
                each_minutes=(1.5, 2.0),
            ),
        ),
        free_disk_gb=54.2,
    )
    return Work(**{**fields, **changes})


def test_the_announcement_totals_the_costly_steps():
    from servematrix.run.progress import announce

    lines = announce(_work())
    assert lines[1] == "will run 52 cell(s), stages resolve,import,probe"
    assert lines[2].startswith("import: 22 lock(s) installed, and up to 4 more once resolved")
    assert "33-52 min in all" in lines[2]  # 22 x 1.5 min at least, (22 + 4) x 2 min at most
    assert (
        lines[-1]
        == "in all: about 33-52 min of installs and checks, about 9 GB of disk at a time, 54.2 GB free on this disk now"
    )


def test_checks_side_by_side_are_announced_in_rounds_with_their_disk_together():
    from servematrix.run.progress import announce

    work = _work()
    lines = announce(replace(work, steps=(replace(work.steps[0], at_once=2),)))
    assert lines[2].startswith("import: 22 lock(s) installed, and up to 4 more once resolved, 2 at once")
    # 11 rounds of 1.5 min at least, 13 rounds of 2 min at most; two checks' disk at a time.
    assert lines[-1] == (
        "in all: about 16-26 min of installs and checks, about 18 GB of disk at a time, 54.2 GB free on this disk now"
    )


def test_an_unchanged_rerun_announces_nothing_to_do():
    from servematrix.run.progress import announce

    lines = announce(_work(to_run=0, not_run={"unchanged since their last finished run": 52}))
    assert lines[1:] == ["nothing to run: 52 unchanged since their last finished run"]
    assert not any("import" in line or "GB of disk" in line for line in lines)


def test_a_step_with_nothing_to_do_is_not_announced():
    from servematrix.run.progress import Step, announce

    lines = announce(_work(steps=(Step(stage="import", count=0, what="lock(s)", each_minutes=(1.5, 2.0)),)))
    assert not any(line.startswith("import:") for line in lines)
    assert lines[-1] == "54.2 GB free on this disk now"


def test_the_counts_by_verdict_fold_between_counts_at_80_columns():
    from servematrix.run.progress import counts_lines

    verdicts = {f"c{i}": v for i, v in enumerate(["skipped:no-gpu"] * 26 + ["predicted-fail:dynamo-untraceable"] * 14)}
    verdicts |= {f"d{i}": v for i, v in enumerate(["unresolvable"] * 6 + ["skipped:not-applicable"] * 4 + ["pass"] * 2)}
    verdicts |= {"e": "fail:unknown-flag", "f": "predicted-fail:import-dependency-conflict"}
    lines = counts_lines(verdicts)
    assert lines[0].startswith("54 cell(s): 26 skipped:no-gpu, 14 predicted-fail:dynamo-untraceable,")
    assert max(map(len, lines)) <= 80 and len(lines) > 1
    text = " ".join(lines)
    for count in ("6 unresolvable", "4 skipped:not-applicable", "2 pass", "1 fail:unknown-flag"):
        assert count in text


def test_the_skip_message_is_never_folded():
    from servematrix.run.progress import skip_message, wrap_free

    out = io.StringIO()
    wrap_free(Console(file=out, force_terminal=False, width=40), skip_message(52))
    assert out.getvalue() == skip_message(52) + "\n"
    assert "(--rerun to force)" in out.getvalue()
