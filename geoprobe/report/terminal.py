"""Terminal output: progress bars with rate and ETA, and tables."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.table import Table
from rich.text import Text

console = Console(stderr=True)


class RateColumn(ProgressColumn):
    def __init__(self, unit: str):
        super().__init__()
        self.unit = unit

    def render(self, task) -> Text:
        return Text(rate_text(task.finished_speed or task.speed, self.unit), style="cyan")


def rate_text(speed: float | None, unit: str) -> str:
    """A loop's pace in words that keep their digits: "1,234 tok/s", "2.5 step/s", or below one
    per second the seconds each takes, "3.2 s/layer" (not "0 layer/s")."""
    if not speed:
        return f"? {unit}/s"
    if speed >= 10:
        return f"{speed:,.0f} {unit}/s"
    return f"{speed:.1f} {unit}/s" if speed >= 1 else f"{1 / speed:.1f} s/{unit}"


class Bar:
    """A progress bar for one long loop; silent when `quiet`."""

    def __init__(self, description: str, unit: str = "tok", quiet: bool = False):
        self.description, self.unit, self.quiet = description, unit, quiet
        self.progress = None

    def start(self, total: int, completed: int = 0):
        if self.quiet or not console.is_terminal:  # a log file gets no bar frames
            return
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 RateColumn(self.unit), TimeElapsedColumn(), TextColumn("ETA"),
                                 TimeRemainingColumn(), console=console)
        self.progress.start()
        self.task = self.progress.add_task(self.description, total=total, completed=completed)

    def advance(self, n: int):
        if self.progress is not None:
            self.progress.advance(self.task, n)

    def stop(self):
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def stdout_console(out=None) -> Console:
    """The console for results: a pipe or log file gets the whole table, not an 80-column squeeze."""
    target = Console(file=out or sys.stdout)
    return target if target.is_terminal else Console(file=out or sys.stdout, width=140)


def print_table(title: str, columns: list[str], rows: list[list], out=None):
    table = Table(title=title)
    for name in columns:
        # fold, never "…": a cut number reads as another number (1.477e-15 shown as "1.477e-…")
        table.add_column(name, justify="right" if name not in ("key", "file") else "left", overflow="fold")
    for row in rows:
        table.add_row(*[f"{v:.4g}" if isinstance(v, float) else str(v) for v in row])
    stdout_console(out).print(table)
