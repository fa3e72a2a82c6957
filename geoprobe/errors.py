"""Errors a user can act on. The CLI prints `error: <message>` and exits with `exit_code`."""


class GeoprobeError(Exception):
    """A failure that is not the user's input (exit code 1)."""

    exit_code = 1


class BadInput(GeoprobeError):
    """The user asked for something that cannot be done as given (exit code 2)."""

    exit_code = 2


class Interrupted(GeoprobeError):
    """The user pressed Ctrl-C (SIGINT): exit code 130, as a shell reports a process it interrupted."""

    exit_code = 130


def short(exc: BaseException) -> str:
    """An exception as a few words for a one-line message."""
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
