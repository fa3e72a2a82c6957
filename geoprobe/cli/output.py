"""The CLI's one output path: a command's result goes to stdout as JSON (`--format json`) or
as tables for people (unless `-q`), and its progress bar shows only for people."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

from geoprobe.cli.options import state


def emit_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def show(result, for_people: Callable[[], None]) -> None:
    """`result` as JSON with --format json; otherwise `for_people()` prints it, unless --quiet."""
    if state.format == "json":
        emit_json(result)
    elif not state.quiet:
        for_people()


def progress(label: str, unit: str):
    """A progress bar (rate, ETA) that stays silent for scripts (--quiet, --format json)."""
    from geoprobe.report.terminal import Bar

    return Bar(label, unit, quiet=state.quiet or state.format == "json")
