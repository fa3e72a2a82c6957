"""The CLI's one output path: a command's result goes to stdout as JSON (`--format json`) or
as tables for people (unless `-q`), its progress bar shows only for people, and the library's
notes (geoprobe.events) go to stderr."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable

from geoprobe import events
from geoprobe.cli.options import state
from geoprobe.report.terminal import Bar


def emit_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def show(result, for_people: Callable[[], None], quiet: str | None = None) -> None:
    """`result` as JSON with --format json; otherwise `for_people()` prints it, or with --quiet
    only `quiet` (a command's one result a script needs, e.g. the file it wrote), if any."""
    if state.format == "json":
        emit_json(result)
    elif not state.quiet:
        for_people()
    elif quiet is not None:
        sys.stdout.write(quiet + "\n")


def progress(label: str, unit: str):
    """A progress bar (rate, ETA) that stays silent for scripts (--quiet, --format json)."""

    return Bar(label, unit, quiet=state.quiet or state.format == "json")


class _Notes(logging.Handler):
    """The library's notes, one line each on stderr (they are not results: --format json keeps stdout clean)."""

    def emit(self, record: logging.LogRecord) -> None:
        from geoprobe.report.terminal import console

        console.print(record.getMessage(), markup=False, highlight=False, soft_wrap=True)


def render_events() -> None:
    """Show what the library says (geoprobe.events) the CLI's way: notes on stderr, bars like the commands' own."""

    if not any(isinstance(h, _Notes) for h in events.log.handlers):
        events.log.addHandler(_Notes())
        events.log.setLevel(logging.INFO)
        events.log.propagate = False
    events.use_progress(progress)
