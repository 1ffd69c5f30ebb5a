"""What a run shows while it works: the work it will do, with its totals, said before it starts
(`announce`); one live bar on a terminal; in a log (CI, no terminal) a plain line per cell and stage as it
happens, with the count and the time since the start, and a heartbeat inside a long stage; then the
summary, readable at 80 columns and never cut, with the counts by verdict.

The announcement is a function of the work to be done, given as data (`Work`): whoever decides what a run
will skip (unchanged cells, reused results) hands over what is left, and the announcement says that and
nothing else.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psutil
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from servematrix.records.cell import Cell

# A log line at least this often while a stage runs: CI systems kill jobs that are silent for minutes, and a
# person reading a log cannot tell a slow install from a hang. Below 30 s with room for a busy host.
HEARTBEAT_S = 20.0
GB = 1e9


# ------------------------------------------------------------------------------------- the announcement


@dataclass(frozen=True, kw_only=True)
class Step:
    """One kind of costly work a run will do, counted: e.g. 20 environment locks installed on this CPU."""

    stage: str
    count: int  # how many will run
    maybe: int = 0  # how many more may run: those decided by an earlier stage of this run (a lock not made yet)
    what: str  # what one is, in words: "environment lock(s) installed on this CPU and sglang imported"
    cost: str = ""  # what one costs, as the engine's data says it (measured)
    each_gb: float | None = None  # disk one takes while it runs
    each_minutes: tuple[float, float] | None = None  # how long one takes, low and high
    at_once: int = 1  # how many run side by side (each with its own core and disk)
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class Work:
    """What a run will do, after everything it will not do again is taken out."""

    matrix: str
    cells: int  # in the plan
    environments: int
    host: str  # the host's GPUs, in words
    to_run: int  # cells that will run
    not_run: Mapping[str, int]  # why the others will not run -> how many ("unchanged since their last run")
    stages: tuple[str, ...]  # the stages at least one cell will run, in pipeline order
    lacking: tuple[str, ...] = ()  # the cells that need GPUs this host lacks, and what they run here
    steps: tuple[Step, ...] = ()
    notes: tuple[str, ...] = ()  # an engine's own lines (its pre-flights' downloads)
    free_disk_gb: float | None = None  # on the filesystem of the work directory


def announce(work: Work) -> list[str]:
    """The lines said before a run starts: what will run, which stages, and the totals of its costly steps."""
    lines = [f"{work.matrix}: {work.cells} cell(s) in {work.environments} environment(s); this host: {work.host}"]
    skipped = "; ".join(f"{count} {why}" for why, count in work.not_run.items() if count)
    if not work.to_run:  # the notes still say why (e.g. how many cells the published results decide)
        return [*lines, *work.notes, f"nothing to run: {skipped or 'no cell selected'}"]
    lines.append(
        f"will run {work.to_run} cell(s), stages {','.join(work.stages) or 'none'}"
        + (f"; not run: {skipped}" if skipped else "")
    )
    lines += work.lacking
    low = high = 0.0
    peak_gb = 0.0
    timed = False
    for step in work.steps:
        if not step.count and not step.maybe:
            continue
        line = f"{step.stage}: {step.count} {step.what}"
        if step.maybe:
            line += f", and up to {step.maybe} more once resolved"
        if step.at_once > 1:
            line += f", {step.at_once} at once"
        if step.cost:
            line += f" ({step.cost})"
        if step.each_minutes is not None:
            timed = True
            # Side by side, the steps take as long as their longest file of `at_once` rounds.
            least = -(-step.count // step.at_once) * step.each_minutes[0]
            most = -(-(step.count + step.maybe) // step.at_once) * step.each_minutes[1]
            low, high = low + least, high + most
            line += f": {_minutes(least, most)} in all"
        if step.each_gb is not None:
            peak_gb = max(peak_gb, step.each_gb * step.at_once)
        if step.note:
            line += f"; {step.note}"
        lines.append(line)
    lines += work.notes
    totals = []
    if timed:
        totals.append(f"about {_minutes(low, high)} of installs and checks")
    if peak_gb:
        totals.append(f"about {peak_gb:.0f} GB of disk at a time")
    free = f"{work.free_disk_gb:.1f} GB free on this disk now" if work.free_disk_gb is not None else ""
    if totals:
        lines.append("in all: " + ", ".join([*totals, free] if free else totals))
    elif free:
        lines.append(free)
    return lines


def _minutes(low: float, high: float) -> str:
    if round(low) == round(high):
        return f"{low:.0f} min" if low >= 1 else f"{low:.1f} min"
    return f"{low:.0f}-{high:.0f} min"


def free_disk_gb(path: Path) -> float | None:
    """Free space on the filesystem that holds `path` (or its nearest existing parent)."""
    for candidate in (path, *path.resolve().parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free / GB
    return None


# -------------------------------------------------------------------------------------------- the run

# A job of a concurrent pre-flight (run/pool.py) is a process of its own, whose output its harness reads: there
# each cell's stages and verdict are events on a line of their own, which the harness shows in its one display
# with the run's own count (its lines name their cell and environment, whichever job sent them).
RELAY_MARK = "servematrix-progress "
_relay: list[IO[str]] = []  # where this process's events go, once `relay_to` is called (a job's stdout)


def relay_to(stream: IO[str] | None) -> None:
    """This process is a job of a concurrent run: its progress goes to `stream` as events, and no summary
    (None: shown here again)."""
    _relay[:] = [stream] if stream is not None else []


def relay(event: Mapping[str, Any]) -> bool:
    """Send an event to the harness, if this process is a job of one (`relay_to`); whether it was sent."""
    if not _relay:
        return False
    print(RELAY_MARK + json.dumps(event, separators=(",", ":")), file=_relay[0], flush=True)
    return True


def relayed(line: str) -> dict[str, Any] | None:
    """The event a job's line carries, or None for any other line of its output."""
    if not line.startswith(RELAY_MARK):
        return None
    try:
        event = json.loads(line[len(RELAY_MARK) :])
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def received_bytes() -> int:
    """Bytes this host has received over its network interfaces (loopback left out: that is the benchmark
    talking to its own server). What a stage downloads is the difference over the stage."""
    counters = psutil.net_io_counters(pernic=True)
    return sum(c.bytes_recv for name, c in counters.items() if name != "lo")


class RunProgress:
    def __init__(
        self,
        console: Console,
        *,
        title: str,
        total: int,
        heartbeat_s: float = HEARTBEAT_S,
        downloaded: Callable[[], int] = received_bytes,
    ) -> None:
        self.console = console
        self.title = title
        self.total = total
        self.done = 0
        self.heartbeat_s = heartbeat_s
        self._downloaded = downloaded
        self._started = time.monotonic()
        self._bar: tuple[Progress, TaskID] | None = None
        self._lock = threading.Lock()
        # The stage now running: its cell, name, when it began and the byte counter then.
        self._current: tuple[Cell, str, float, int] | None = None
        # Between cells (the next one not in a stage yet): since when, and the byte counter then.
        self._idle: tuple[float, int] | None = None
        self._last_line = self._started

    @contextlib.contextmanager
    def shown(self) -> Iterator[RunProgress]:
        """The live bar on a terminal for the duration, and the heartbeat inside long stages."""
        if not self.console.is_terminal:
            with self._beating():
                yield self
            return
        progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[stage]}"),
            console=self.console,
            transient=False,
        )
        with progress:
            self._bar = (progress, progress.add_task(self.title, total=self.total, stage=""))
            try:
                with self._beating():
                    yield self
            finally:
                self._bar = None

    @contextlib.contextmanager
    def _beating(self) -> Iterator[None]:
        """The heartbeat thread, running for the duration."""
        stop = threading.Event()
        beat = threading.Thread(target=self._beat, args=(stop,), name="servematrix-heartbeat", daemon=True)
        beat.start()
        try:
            yield
        finally:
            stop.set()
            beat.join()

    def stage(self, cell: Cell, name: str) -> None:
        """A cell entered a stage."""
        with self._lock:
            self._current = (cell, name, time.monotonic(), self._safe_downloaded())
        if relay({"cell": cell.id, "stage": name}):
            self._last_line = time.monotonic()
            return
        if self._bar is None:
            self.line(cell, name)
            return
        progress, task = self._bar
        progress.update(task, stage=f"{cell.id} {cell.env.version} {cell.mode}: {name}")

    def finished(self, cell: Cell, verdict: str) -> None:
        """A cell is finished with this verdict."""
        with self._lock:
            self.done += 1
            self._current = None
            self._idle = (time.monotonic(), self._safe_downloaded())
        if relay({"cell": cell.id, "verdict": verdict}):
            self._last_line = time.monotonic()
            return
        if self._bar is not None:
            self._bar[0].advance(self._bar[1])
        else:
            self.line(cell, verdict)

    def note(self, cell: Cell, what: str) -> None:
        """What a cell's stage is doing (a job's heartbeat, run/pool.py): on the bar on a terminal, else a line."""
        if self._bar is None:
            self.line(cell, what)
            return
        progress, task = self._bar
        progress.update(task, stage=f"{cell.id} {cell.env.version} {cell.mode}: {what}")

    def line(self, cell: Cell, what: str) -> None:
        if relay({"cell": cell.id, "line": what}):
            self._last_line = time.monotonic()
            return
        elapsed = time.monotonic() - self._started
        axes = " ".join(f"{k}={v}" for k, v in cell.env.axes.items())
        with self._lock:
            print(
                f"[{self.done}/{self.total} {elapsed:6.0f}s] {cell.id} {axes} mode={cell.mode}: {what}",
                file=self.console.file,
                flush=True,
            )
            self._last_line = time.monotonic()

    def heartbeat_text(self) -> str | None:
        """What the stage now running has done so far: its step, time in it and bytes downloaded."""
        current = self._current
        if current is None:
            return None
        _cell, name, began, received = current
        got = max(0, self._safe_downloaded() - received)
        return (
            f"{name} still running: {time.monotonic() - began:.0f}s in this stage, {_size(got)} downloaded by this host"
        )

    def _beat(self, stop: threading.Event) -> None:
        tick = min(1.0, self.heartbeat_s / 4)
        while not stop.wait(tick):
            current = self._current
            if self._bar is not None:
                text = self.heartbeat_text()
                if current is not None and text is not None:
                    progress, task = self._bar
                    progress.update(task, stage=f"{current[0].id} {current[0].env.version} {current[0].mode}: {text}")
            elif time.monotonic() - self._last_line >= self.heartbeat_s:
                text = self.heartbeat_text()
                if current is not None and text is not None:
                    self.line(current[0], text)
                elif self._idle is not None:
                    self._idle_line(*self._idle)

    def _idle_line(self, since: float, received: int) -> None:
        """A heartbeat between cells: the next cell is being prepared, no stage of it has begun."""
        if _relay:  # a job's harness has its own
            return
        now = time.monotonic()
        got = max(0, self._safe_downloaded() - received)
        with self._lock:
            print(
                f"[{self.done}/{self.total} {now - self._started:6.0f}s] preparing the next cell: "
                f"{now - since:.0f}s since the last one finished, {_size(got)} downloaded by this host",
                file=self.console.file,
                flush=True,
            )
            self._last_line = time.monotonic()

    def _safe_downloaded(self) -> int:
        try:
            return self._downloaded()
        except (OSError, psutil.Error):  # no counters here (a container without /proc/net): say 0, run on
            return 0


def _size(count: int) -> str:
    if count >= GB:
        return f"{count / GB:.2f} GB"
    return f"{count / 1e6:.0f} MB" if count >= 1e6 else f"{count / 1e3:.0f} kB"


# ---------------------------------------------------------------------------------------- the summary


def verdict_counts(verdicts: Mapping[str, str]) -> list[tuple[str, int]]:
    """How many cells ended with each verdict, the most common first (then by name, so the order is stable)."""
    return sorted(Counter(verdicts.values()).items(), key=lambda item: (-item[1], item[0]))


def print_summary(console: Console, run_id: str, cells: Mapping[str, Cell], verdicts: Mapping[str, str]) -> None:
    """Each run cell, its mode and its verdict on one line, never cut; its environment on the next, folded;
    then the counts by verdict. A job of a concurrent run says none: its harness says the run's."""
    if not verdicts or _relay:
        return
    console.print(Text(f"run {run_id}", style="bold"))
    mode_width = max(len(cells[cell_id].mode) for cell_id in verdicts)
    for cell_id, result in verdicts.items():
        cell = cells[cell_id]
        line = Text(f"{cell_id}  {cell.mode:<{mode_width}}  ")
        line.append(result, style=_colour(result))
        console.print(line, overflow="fold")
        axes = " ".join(f"{k}={v}" for k, v in cell.env.axes.items())
        console.print(Text(f"    {axes}", style="dim"), overflow="fold")
    for counted in counts_lines(verdicts, width=max(40, min(console.width, 80))):
        console.print(Text(counted), overflow="fold")


def counts_lines(verdicts: Mapping[str, str], width: int = 80) -> list[str]:
    """`52 cell(s): 26 skipped:no-gpu, 20 predicted-fail:dynamo-untraceable, 6 unresolvable`, folded between
    counts (never inside one) at `width` columns."""
    head = f"{len(verdicts)} cell(s): "
    parts = [f"{count} {verdict}" for verdict, count in verdict_counts(verdicts)]
    lines, line = [], head
    for index, part in enumerate(parts):
        piece = part + ("," if index < len(parts) - 1 else "")
        if line not in (head, "    ") and len(line) + len(piece) > width:
            lines.append(line.rstrip())
            line = "    "
        line += piece + " "
    lines.append(line.rstrip())
    return lines


def _colour(result: str) -> str:
    return "green" if result == "pass" else "red" if result.startswith(("fail", "unres", "error")) else "yellow"


def skip_message(unchanged: int) -> str:
    """The line a run says for the cells it does not run again (printed whole: never folded mid-bracket)."""
    return f"{unchanged} cell(s) unchanged since their last finished run: not run again (--rerun to force)"


def wrap_free(console: Console, text: str) -> None:
    """A line printed as it is, never folded at the console's width (a log reader greps for it whole)."""
    console.print(text, soft_wrap=True, markup=False, highlight=False)
