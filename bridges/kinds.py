"""The model kinds: the one table of what a checkpoint directory can hold.

Each kind's module owns its network config, its save and load (through bridges/checkpoint.py's
one record), its fit and its TokenDenoiser; this table is the only place that lists the kinds,
and `geoprobe sample`, `nll`, `eval` and `compare` ask it instead of branching on a kind's name.
Adding a kind is one module and one entry here (docs/architecture.md, "How to add").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from geoprobe.bridges.checkpoint import read_config
from geoprobe.bridges.dsl import dsl_generator_backbone, dsl_oracle_start, load_dsl_denoiser
from geoprobe.bridges.embedding_diffusion import PRESETS, TITLES, baseline_oracle_start, load_baseline_denoiser, no_backbone
from geoprobe.bridges.hidden import bridge_generator_backbone, bridge_oracle_start, load_bridge_denoiser
from geoprobe.errors import BadInput
from geoprobe.samplers import BRIDGE_SAMPLERS, EMBEDDING_SAMPLERS, TOKEN_SAMPLERS


@dataclass(frozen=True)
class ModelKind:
    name: str  # config.json's "kind"
    title: str  # how a message names it ("a DSL model")
    # (folder, device, decode) -> (TokenDenoiser, tokenizer): what the samplers run
    load_denoiser: Callable
    # config record -> the causal LM its text passes through (None: none); Gen.PPL under that
    # same model measures agreement with itself, so eval flags it
    generator_backbone: Callable[[dict], str | None]
    # (config record, document length) -> where the testbed's HMM starts its samples
    oracle_start: Callable[[dict, int], str]
    # whether its likelihood is defined on the text alone (`geoprobe nll`); a bridge's passes
    # through the frozen backbone and is not
    text_likelihood: bool
    # the --sampler values that apply: the TokenDenoiser samplers (a bridge's also `ltr`, left to right
    # through its upper stack), or the embedding baselines' ancestral one
    samplers: tuple[str, ...] = TOKEN_SAMPLERS
    # the legend's name for this kind where the comparison's plot sets its rows apart (None: drawn
    # with the other trained generators)
    highlight: str | None = None


KINDS: dict[str, ModelKind] = {kind.name: kind for kind in (
    ModelKind("dsl", "a DSL model", load_dsl_denoiser, dsl_generator_backbone, dsl_oracle_start,
              text_likelihood=True),
    ModelKind("bridge", "a bridge", load_bridge_denoiser, bridge_generator_backbone, bridge_oracle_start,
              text_likelihood=False, samplers=BRIDGE_SAMPLERS, highlight="bridges"),
    # the DiHAL comparison's embedding-diffusion baselines: one model class, one preset each
    *(ModelKind(name, TITLES[name], load_baseline_denoiser, no_backbone, baseline_oracle_start,
                text_likelihood=False, samplers=EMBEDDING_SAMPLERS) for name in PRESETS),
)}


def kind_of(record: dict, folder: Path | str = "") -> ModelKind:
    """The kind of a checkpoint's config record, or one line naming the kinds there are."""
    kind = KINDS.get(record.get("kind"))
    if kind is None:
        raise BadInput(f"{folder} holds a {record.get('kind')!r} checkpoint, which this version does not know "
                       f"(kinds: {', '.join(KINDS)})")
    return kind


def open_checkpoint(folder: Path) -> tuple[ModelKind, dict]:
    """(its kind, its config record) of a checkpoint directory, or one line saying why not."""
    record = read_config(folder)
    return kind_of(record, folder), record


def load_denoiser(folder: Path, device: str = "auto", decode: str = "stack"):
    """(TokenDenoiser, tokenizer) from any kind's checkpoint directory."""
    kind, _ = open_checkpoint(folder)
    return kind.load_denoiser(folder, device, decode)


def highlight_of(name: str | None) -> str | None:
    """How the comparison's plot sets a kind's rows apart (`ModelKind.highlight`; None for none or
    for no kind, the plain LM)."""
    kind = KINDS.get(name) if name is not None else None
    return None if kind is None else kind.highlight
