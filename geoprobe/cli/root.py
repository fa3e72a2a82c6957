"""The root Typer application: its global flags (--debug, --quiet, --format) and the order
`geoprobe --help` lists the commands in. Command modules register themselves on `app`;
`geoprobe.cli.app` imports them all and owns the entry point."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer
from typer.core import TyperGroup

from geoprobe.cli.options import choices, plain, state
from geoprobe.cli.output import render_events
from geoprobe.errors import Interrupted

# `geoprobe --help` lists the commands in the order a user runs them
ORDER = ("scan", "extract", "geometry", "rank", "bridge", "sweep", "dsl", "baseline", "sample", "nll", "eval", "compare", "report",
         "demo")


INTERRUPTED = "interrupted; what was saved is kept (shards, checkpoints): rerun the same command to resume"


class InUserOrder(TyperGroup):
    def list_commands(self, ctx):
        return sorted(super().list_commands(ctx), key=lambda name: ORDER.index(name) if name in ORDER else len(ORDER))

    def invoke(self, ctx):
        """The command; Ctrl-C becomes `Interrupted`, which Typer passes on (outside standalone mode it
        turns a KeyboardInterrupt into a plain exit code 130 that says nothing)."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            raise Interrupted(INTERRUPTED) from exc


app = typer.Typer(
    cls=InUserOrder,
    name="geoprobe",
    help="Where can diffusion enter a pretrained language model?\n\n"
         "Examples:\n\n"
         "  geoprobe extract builtin:smollm2 --corpus kjv --tokens 2000 --out runs/kjv\n\n"
         "  geoprobe extract meta-llama/Llama-3.1-8B-Instruct --corpus data/*.jsonl --tokens 100000 "
         "--layers 0-16 --out runs/llama\n\n"
         "  geoprobe --format json extract ./my-model --corpus book.txt --tokens 5000 --out runs/x\n\n"
         "  geoprobe scan builtin:smollm2 --corpus kjv --tokens 4000 --out runs/demo\n\n"
         "  geoprobe rank runs/demo --weights 1,1,0 --log",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


Format = choices("Format", ("table", "json"))


@app.callback()
def main_options(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks instead of one-line errors.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars or tables, only results.")] = False,
    format: Annotated[Format, typer.Option("--format", help="Output: table (for people) or json (for scripts).")]
    = "table",
):
    state.debug, state.quiet, state.format = debug, quiet, plain(format)

    render_events()
    if int(os.environ.get("RANK", "0")) > 0:  # under torchrun, rank 0 alone reports (errors still show)
        state.quiet = True
        sys.stdout = open(os.devnull, "w")
    if not debug:
        _quiet_libraries()


def global_first(args: list[str]) -> list[str]:
    """`args` with the root's own options (--debug, --quiet/-q, --format) moved before the command
    where they were given after it: `geoprobe scan ... --format json` means `geoprobe --format json
    scan ...` (no command has options of those names). Nothing after a `--` moves."""
    options = {name: not param.is_flag for param in typer.main.get_command(app).params
               for name in (*param.opts, *param.secondary_opts)}
    end = args.index("--") if "--" in args else len(args)
    first = next((i for i, a in enumerate(args[:end]) if not a.startswith("-")), end)  # the command's name
    moved, rest, i = [], list(args[:first]), first
    while i < end:
        name = args[i].split("=", 1)[0]
        takes = options.get(name)
        if takes is None:
            rest.append(args[i])
        else:
            value = takes and "=" not in args[i] and i + 1 < end
            moved += args[i:i + 1 + value]
            i += value
        i += 1
    return moved + rest + args[end:]


def _quiet_libraries() -> None:
    """Library progress bars and warnings would break the one-line error contract."""
    import warnings

    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    disable_progress_bars()
    warnings.filterwarnings("ignore")
