"""How the library tells what it is doing without printing. A note goes to the `geoprobe` logger
(Python's logging); long work asks `progress(label, unit)` for a bar. The caller decides what they
become: the CLI renders notes on stderr and draws bars with rate and ETA (cli/output.py installs
both); a notebook or script gets log records and silent bars unless it installs its own factory."""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger("geoprobe")


class Silent:
    """The bar of a caller that asked for none: start, advance and stop do nothing."""

    def start(self, total: int, completed: int = 0) -> None:
        pass

    def advance(self, n: int) -> None:
        pass

    def stop(self) -> None:
        pass


_bars: Callable[[str, str], object] | None = None


def note(message: str) -> None:
    """One line for the person running the work (not a result): the CLI shows it on stderr."""
    log.info(message)


def use_progress(factory: Callable[[str, str], object] | None) -> None:
    """Install `factory(label, unit) -> bar` for work that makes its own bars (None: silent)."""
    global _bars
    _bars = factory


def progress(label: str, unit: str):
    """A bar (start/advance/stop) from the installed factory, or a silent one."""
    return _bars(label, unit) if _bars is not None else Silent()
