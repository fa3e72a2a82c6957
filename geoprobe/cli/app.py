"""The geoprobe command line: every command registered on the root app, the entry point, the
one-line error contract, and `invoke`, which runs one command in the caller's process."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import typer

# each command module registers its commands on the root app when imported
from geoprobe.cli import baseline, bridge, dsl, evaluate, extract, report, sample, scan  # noqa: F401
from geoprobe.cli.root import INTERRUPTED, ORDER, app, global_first  # noqa: F401  (the app and its command order)

from geoprobe.cli.options import state
from geoprobe.errors import GeoprobeError, Interrupted
from geoprobe.files import disk_full_message, is_disk_full


def main(argv: list[str] | None = None) -> None:
    try:
        _run(argv)
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def invoke(args) -> None:
    """Run one `geoprobe` command in this process, through the app's own parser and command
    function, and raise if it fails: what the command raised (a GeoprobeError such as BadInput or
    Interrupted, any other exception), a usage error (Typer's click: a bad flag or value), or
    typer.Exit with the nonzero exit code the command returned. `main` and in-process callers
    (experiments.smollm2_results) share it.

    Args:
        args: the words after `geoprobe`, each as its str; the root's options (--debug, -q,
            --format) may come before or after the command's name (global_first).
    """
    code = app(args=global_first([str(a) for a in args]), standalone_mode=False)
    if isinstance(code, int) and code:  # outside standalone mode Typer returns an Exit's code instead of raising it
        if code == 130:  # its own Ctrl-C while it parsed the arguments
            raise Interrupted(INTERRUPTED)
        raise typer.Exit(code)


def _run(argv: list[str] | None) -> None:
    try:
        invoke(sys.argv[1:] if argv is None else argv)
    except Interrupted as exc:  # Ctrl-C: 130 and the one line, with --debug after the traceback
        if state.debug:
            traceback.print_exc()
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except GeoprobeError as exc:
        if state.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:  # outside a command (while the arguments are parsed)
        print(f"error: {INTERRUPTED}", file=sys.stderr)
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(1)
    except Exception as exc:
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):  # a usage error (Typer's click)
            print(f"error: {exc.format_message()}", file=sys.stderr)
            sys.exit(exc.exit_code)
        if state.debug:
            raise

        if is_disk_full(exc):  # where no command caught it with a better estimate
            print(f"error: {disk_full_message(Path(exc.filename or '.'))}", file=sys.stderr)
            sys.exit(2)
        print(f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} (use --debug for the traceback)",
              file=sys.stderr)
        sys.exit(1)
