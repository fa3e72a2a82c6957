"""Flags with one meaning everywhere. Every command takes its shared flags from here."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated

import typer

from geoprobe.backbone import DEVICE_MAPS, DTYPES
from geoprobe.device import Precision as PrecisionChoice
from geoprobe.extract import ExtractConfig


@dataclass
class GlobalState:
    debug: bool = False
    quiet: bool = False
    format: str = "table"


state = GlobalState()


def defaults_of(call) -> SimpleNamespace:
    """A library call's keyword defaults, read by the flags that mirror them: the signature of the
    call a command makes is their one owner (where no settings dataclass holds them)."""
    return SimpleNamespace(**{name: p.default for name, p in inspect.signature(call).parameters.items()
                              if p.default is not inspect.Parameter.empty})


def choices(name: str, values) -> type[Enum]:
    """A flag's choices as an Enum (Typer lists them in --help and refuses any other value), made
    from the tuple or dict of the library module that owns them."""
    return Enum(name, [(str(v), str(v)) for v in values], type=str)


def plain(value):
    """A flag's value as the library takes it: a choice's string, anything else as it is."""
    return value.value if isinstance(value, Enum) else value


def with_settings(flags: dict, defaults: dict, make):
    """A decorator: the command gets the options `flags` (parameter name -> Annotated option type),
    each defaulting to `defaults[name]` (the settings dataclass's own default), after its own
    parameters, and is called with `settings=make(**their values)` instead. Commands that share a
    settings class share these declarations.

    Args:
        flags: the options, in the order --help lists them.
        defaults: each option's default, by name.
        make: builds the settings from the options' values (choices as plain strings)."""

    def decorate(command):
        own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "settings"]
        added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=kind, default=defaults[name])
                 for name, kind in flags.items()]

        @functools.wraps(command)
        def wrapper(**values):
            chosen = {name: plain(values.pop(name)) for name in flags}
            return command(**values, settings=make(**chosen))

        wrapper.__signature__ = inspect.Signature([p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + added)
        wrapper.__annotations__ = {p.name: p.annotation for p in wrapper.__signature__.parameters.values()}
        return wrapper

    return decorate

Out = Annotated[Path, typer.Option("--out", "-o", help="Run directory this command writes (created if missing).")]
Seed = Annotated[int, typer.Option("--seed", min=0, help="Seed for every random choice; recorded in the outputs.")]
Device = Annotated[str, typer.Option("--device", help="auto (CUDA when present), cpu, cuda or cuda:N.")]
Dtype = Annotated[choices("Dtype", ("auto", *DTYPES)), typer.Option("--dtype", help="Model weights (auto: the "
                                                                       "checkpoint's on a GPU, float32 on a CPU).")]
BatchSize = Annotated[int, typer.Option("--batch-size", min=1, help="Sequences per forward pass.")]
SeqLen = Annotated[int, typer.Option("--seq-len", min=2, help="Tokens per packed sequence (BOS included).")]
Tokens = Annotated[int, typer.Option("--tokens", help="Token states to store per layer (rows).")]
Layers = Annotated[str, typer.Option("--layers", help="all, a range 0-8, a list 0,3,7, or a mix 0-3,7. "
                                                      "0 = embedding output, l = after block l.")]
DocBlocks = Annotated[int | None, typer.Option("--doc-blocks", min=0, help="At most N blocks per document (0 = all; "
                                             "default: 1 for scan's default corpus, else 0).")]
Positions = Annotated[str, typer.Option("--positions", help="all, or random:K positions per sequence.")]
SkipFirst = Annotated[int, typer.Option("--skip-first", min=0, help="Skip the first N positions (the attention sink).")]
Storage = Annotated[choices("Storage", ("float16", "float32")), typer.Option("--storage", help="Stored states "
                                                                              "(float16: float32 where it would overflow).")]
TextField = Annotated[str, typer.Option("--text-field", help="Text field of JSONL/Parquet corpora.")]
ShardRows = Annotated[int, typer.Option("--shard-rows", min=0, help="Approximate rows per Parquet shard (0: about "
                                        "64 MiB of float32 states, docs/reference.md).")]
EXTRACT = ExtractConfig(model="", corpus="")  # the extraction flags' defaults, read by extract and scan alike
Steps = Annotated[int, typer.Option("--steps", min=1, help="Optimizer steps (training budget).")]
Corpus = Annotated[str, typer.Option("--corpus", help="kjv, a .txt/.jsonl/.parquet file, a folder, a glob, "
                                                      "or hf:NAME?split=train.")]
Force = Annotated[bool, typer.Option("--force", help="Discard a different run (or sample set) in --out and start "
                                                    "over.")]
DeviceMap = Annotated[choices("DeviceMap", DEVICE_MAPS) | None, typer.Option("--device-map", help="Spread a model "
                                                                               "larger than one GPU over the devices "
                                                                               "(accelerate).")]
TrustRemoteCode = Annotated[bool, typer.Option("--trust-remote-code", help="Allow a model's own Python code "
                                                                         "(never implied).")]
Rank = Annotated[int | None, typer.Option("--rank", help="This process's rank when several share the work by hand "
                                                        "(torchrun sets it itself).")]
WorldSize = Annotated[int | None, typer.Option("--world-size", help="Processes sharing the work (torchrun sets it "
                                                                   "itself).")]
Precision = Annotated[PrecisionChoice, typer.Option("--precision", help="The trained network's arithmetic "
                                                    "(bfloat16: dsl train only; docs/reference.md).")]
Fsdp = Annotated[bool, typer.Option("--fsdp", help="Shard the weights, gradients, AdamW state and EMA over the "
                                   "ranks (FSDP2, under torchrun; docs/reference.md).")]
GradAccum = Annotated[int, typer.Option("--grad-accum", min=1, help="Micro-batches per step (--batch-size stays the "
                                        "global batch).")]
ActivationCheckpointing = Annotated[bool, typer.Option("--activation-checkpointing", help="Recompute each decoder "
                                                       "block in backward (less memory, one more forward).")]
Deterministic = Annotated[bool, typer.Option("--deterministic/--no-deterministic", help="Deterministic CUDA "
                                            "kernels, so that reruns on one GPU give the same bits.")]
LogTo = Annotated[str, typer.Option("--log-to", help="none, or tensorboard: training curves as event files under "
                                    "each trained model's directory.")]
Until = Annotated[choices("Until", ("plateau", "steps")) | None, typer.Option("--until", help="plateau: until the "
                  "held-out score stops improving (--steps is the cap); steps: exactly --steps.")]
EvalEvery = Annotated[int, typer.Option("--eval-every", min=0, help="Steps between the plateau rule's checks "
                                        "(0: --steps/40, at most 50).")]
Warmup = Annotated[int | None, typer.Option("--warmup", min=0, help="Warmup steps (default: a tenth of --steps, at "
                                           "most 100).")]
