"""Settings from flags. Every default lives in a settings dataclass (ExtractConfig, GeometrySettings,
BridgeConfig, TrainConfig, SampleSettings, ...); the CLI's options read their defaults from those
classes, and the Python API and the demo build the same classes from keyword arguments here, so a
default has one owner whoever calls."""

from __future__ import annotations

import dataclasses

from geoprobe.errors import BadInput


def field_names(kind) -> set[str]:
    return {f.name for f in dataclasses.fields(kind)}


def split_flags(flags: dict, *groups) -> list[dict]:
    """`flags` split into one dict per group (a dataclass, or a set of names): each flag goes to
    every group that has a field of its name; a flag that no group takes is refused, naming the
    valid ones."""
    names = [field_names(g) if dataclasses.is_dataclass(g) else set(g) for g in groups]
    unknown = sorted(set(flags) - set().union(*names))
    if unknown:
        valid = ", ".join(sorted(set().union(*names)))
        raise BadInput(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} (valid: {valid})")
    return [{k: v for k, v in flags.items() if k in group} for group in names]

