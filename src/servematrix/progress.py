"""What a run shows while it works: one live bar on a terminal; in a log (CI, no terminal) a plain line per
cell and stage as it happens, with the count and the time since the start; then the summary, readable at 80
columns and never cut."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from servematrix.cells import Cell


class RunProgress:
    def __init__(self, console: Console, *, title: str, total: int) -> None:
        self.console = console
        self.title = title
        self.total = total
        self.done = 0
        self._started = time.monotonic()
        self._bar: tuple[Progress, TaskID] | None = None

    @contextlib.contextmanager
    def shown(self) -> Iterator[RunProgress]:
        """The live bar on a terminal for the duration; nothing to open in a log."""
        if not self.console.is_terminal:
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
                yield self
            finally:
                self._bar = None

    def stage(self, cell: Cell, name: str) -> None:
        """A cell entered a stage."""
        if self._bar is None:
            self.line(cell, name)
            return
        progress, task = self._bar
        progress.update(task, stage=f"{cell.id} {cell.env.version} {cell.mode}: {name}")

    def finished(self, cell: Cell, verdict: str) -> None:
        """A cell is finished with this verdict."""
        self.done += 1
        if self._bar is not None:
            self._bar[0].advance(self._bar[1])
        else:
            self.line(cell, verdict)

    def line(self, cell: Cell, what: str) -> None:
        elapsed = time.monotonic() - self._started
        axes = " ".join(f"{k}={v}" for k, v in cell.env.axes.items())
        print(
            f"[{self.done}/{self.total} {elapsed:6.0f}s] {cell.id} {axes} mode={cell.mode}: {what}",
            file=self.console.file,
            flush=True,
        )


def print_summary(console: Console, run_id: str, cells: Mapping[str, Cell], verdicts: Mapping[str, str]) -> None:
    """Each run cell, its mode and its verdict on one line, never cut; its environment on the next, folded."""
    if not verdicts:
        return
    console.print(Text(f"run {run_id}", style="bold"))
    mode_width = max(len(cells[cell_id].mode) for cell_id in verdicts)
    for cell_id, result in verdicts.items():
        cell = cells[cell_id]
        colour = "green" if result == "pass" else "red" if result.startswith(("fail", "unres", "error")) else "yellow"
        axes = " ".join(f"{k}={v}" for k, v in cell.env.axes.items())
        line = Text(f"{cell_id}  {cell.mode:<{mode_width}}  ")
        line.append(result, style=colour)
        console.print(line, overflow="fold")
        console.print(Text(f"    {axes}", style="dim"), overflow="fold")
