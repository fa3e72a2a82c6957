"""`geoprobe bridge` (one layer) and `geoprobe sweep` (one bridge per layer + Spearman)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from geoprobe.bridges.hidden import ATTENTIONS, VOCABS
from geoprobe.cli.options import (BatchSize, Deterministic, Device, DeviceMap, Dtype, EvalEvery, Force, Layers, LogTo,
    Precision, Seed, Steps, Until, choices, plain, with_settings)
from geoprobe.cli.output import progress, show
from geoprobe.cli.root import app
from geoprobe.report.terminal import print_table
from geoprobe.workflows.sweep import (BridgeSettings, NETWORK as DEFAULT, bridge_run, bridge_settings, parse_seeds,
    sweep_run)

Run = Annotated[Path | None, typer.Option("--run", help="A scanned run directory (model, corpus and scores).")]
Model = Annotated[str | None, typer.Option("--model", help="Backbone, when there is no --run.")]
CorpusOpt = Annotated[str | None, typer.Option("--corpus", help="Text source, when there is no --run.")]

# The flags that make a BridgeSettings, shared by `bridge` and `sweep`: each declared here once.
# Their defaults are the settings classes' own (BridgeSettings, BridgeConfig); `bridge_settings`
# turns their values into the settings.
SETTINGS = {
    "steps": Steps,
    "batch_size": BatchSize,
    "seq_len": Annotated[int | None, typer.Option("--seq-len", min=2, help="Tokens per training and validation "
                                                  "block, BOS included (default: the scan's; 128 without --run).")],
    "lr": Annotated[float, typer.Option("--lr", help="Peak learning rate.")],
    "d_model": Annotated[int, typer.Option("--d-model", min=0, help="Bridge transformer width (0: set by d and the "
                                           "layer, docs/reference.md).")],
    "n_layers": Annotated[int, typer.Option("--n-layers", min=0, help="Bridge transformer blocks (0: set by the layer, "
                                            "docs/reference.md).")],
    "n_heads": Annotated[int, typer.Option("--n-heads", min=0, help="Bridge attention heads (0: width / 64).")],
    "sigma_b": Annotated[float, typer.Option("--sigma-b", min=0.0, help="Bridge noise in standardised units (0: a "
                                             "deterministic path).")],
    "bridge_steps": Annotated[int, typer.Option("--bridge-steps", min=1, help="Bridge sampling steps K.")],
    "conv_window": Annotated[int, typer.Option("--conv-window", min=0, max=64, help="Previous positions a causal "
                                               "convolution over the network's input reads (0: none).")],
    "attention": Annotated[choices("Attention", ATTENTIONS), typer.Option("--attention", help="The network's "
                                                                         "attention (causal: for --sampler ltr).")],
    "tau_zero": Annotated[float, typer.Option("--tau-zero", min=0.0, max=1.0, help="Share of training sequences at "
                                              "tau = 0 (the source alone).")],
    "regression_frac": Annotated[float, typer.Option("--regression-frac", min=0.0, max=1.0, help="Share of training "
                                                     "sequences that are the plain regression (clean, tau = 0).")],
    "carry": Annotated[str, typer.Option("--carry", help="What the update is added to: lookup (each token's mean "
                                         "state) or channel (layer 0, channel by channel).")],
    "regression": Annotated[bool, typer.Option("--regression", help="Train the deterministic regression E[h_l | z] "
                                               "instead (docs/reference.md).")],
    "train_tokens": Annotated[int, typer.Option("--train-tokens", min=1, help="Training pool in tokens; its teacher "
                                                "states are held in RAM.")],
    "seed": Seed,
    "until": Until,
    "eval_every": EvalEvery,
    "vocab": Annotated[choices("Vocab", VOCABS), typer.Option("--vocab", help="The converter's tokens: "
                                                                        "the corpus's, the training blocks', or all.")],
    "precision": Precision,
    "log_to": LogTo,
    "deterministic": Deterministic,
}
DEFAULTS = {**vars(DEFAULT), **vars(BridgeSettings(DEFAULT)), "regression": False}
bridge_flags = with_settings(SETTINGS, DEFAULTS, bridge_settings)


def _bars(label: str):
    return progress(label, "step")


@app.command(epilog="Examples:\n\n  geoprobe bridge --run runs/demo            # at the layer the scan chose\n\n"
                    "  geoprobe bridge --run runs/demo --layer 3 --steps 500\n\n"
                    "  geoprobe bridge --model builtin:smollm2 --corpus kjv --layer 2 --out runs/b\n\n"
                  "  torchrun --nproc-per-node 4 -m geoprobe -- bridge --run runs/llama8b --batch-size 64")
@bridge_flags
def bridge(
    *,
    layer: Annotated[int | None, typer.Option("--layer", help="Layer to replace (default: the scan's choice).")] = None,
    run: Run = None, model: Model = None, corpus: CorpusOpt = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Root for bridges/layer-NN (default: --run).")] = None,
    device: Device = "auto", dtype: Dtype = "auto", force: Force = False, device_map: DeviceMap = None,
    settings: BridgeSettings,
):
    """Train a diffusion bridge that reconstructs one layer's hidden state (upper stack frozen).
    It stops by its plateau on its validation objective; --regression trains the deterministic
    regression instead.
    Data parallel under torchrun (--batch-size is the global batch); --device-map auto spreads a
    large frozen backbone over the GPUs while the bridge trains on the first."""

    metrics, folder = bridge_run(settings, layer, run, model=model, corpus=corpus, out=out, device=device, dtype=plain(dtype),
                                 device_map=plain(device_map), force=force, bars=_bars)
    if metrics is None:  # data-parallel ranks: rank 0 validates and reports
        return
    from geoprobe.verdict import bridge_lines  # scipy: imported when a bridge has trained, not at start-up

    said = bridge_lines(metrics)

    def printed():
        print_table(f"bridge at layer {metrics['layer']} → {folder}", ["key", "value"],
                    [[k, v] for k, v in metrics.items() if not isinstance(v, dict)])
        print("\n".join(said))

    show({**metrics, "dir": str(folder), "summary": said}, printed)


@app.command(epilog="Examples:\n\n  geoprobe sweep --run runs/demo       # every scanned layer, each to its plateau\n\n"
                    "  geoprobe sweep --run runs/demo --layers 0-8 --steps 3000 --eval-every 50\n\n"
                    "  geoprobe sweep --run runs/demo --layers 1-12 --seeds 0,1,2   # three replicates per layer\n\n"
                    "  geoprobe --format json sweep --run runs/demo --layers 1,3,6,9 --until steps --steps 200")
@bridge_flags
def sweep(
    *,
    run: Annotated[Path, typer.Option("--run", help="A scanned run directory (its ranking gives the scores).")],
    layers: Layers = "all",
    seeds: Annotated[str, typer.Option("--seeds", help="Training seeds, each a replicate of every layer (0,1,2 or "
                                       "0-2; default: --seed).")] = "",
    include_source: Annotated[bool, typer.Option("--include-source", help="Test layer 0 too (its loss is ~0 by "
                                                 "construction).")] = False,
    ceiling: Annotated[bool, typer.Option("--ceiling", help="Also train the ceiling control per layer (the same "
                                          "network as a plain clean regression).")] = False,
    spread: Annotated[bool, typer.Option("--spread/--no-spread", help="Under torchrun, split the bridges over the "
                                         "ranks, each trained by one rank alone (--no-spread: each bridge data "
                                         "parallel over every rank).")] = True,
    device: Device = "auto", dtype: Dtype = "auto", force: Force = False,
    settings: BridgeSettings,
):
    """One bridge per layer and seed, each trained to its plateau under one step cap; then the
    pre-registered test (one-sided Spearman ρ of the geometry score against the seed-mean
    per-channel nmse, layer 0 excluded), the secondary losses (Holm), the seed noise and the
    controls (depth, massive channels, other ways to compute the score).
    Under torchrun the ranks split the bridges and share one teacher pass."""

    chosen_seeds = parse_seeds(seeds) if seeds else [settings.seed]
    result = sweep_run(run, settings, layers, device=device, dtype=plain(dtype), force=force, bars=_bars, seeds=chosen_seeds,
                       include_source=include_source, ceiling=ceiling, spread=spread)
    if result is not None:  # several ranks: rank 0 reports
        show(result, lambda: print_verdict(f"sweep of {run}", result["verdict"], result["plot"]))


def print_verdict(title: str, verdict: dict, plot: str | None = None) -> None:
    """The per-layer table (seed mean ± sd) and the verdict's plain lines."""
    from geoprobe.workflows.sweep_page import layer_columns, layer_rows

    rows = layer_rows(verdict)
    keys = [k for k in layer_columns(rows) if k not in ("nmse_noisy", "objective")]
    print_table(title, keys, [["—" if r[k] is None else r[k] for k in keys] for r in rows])
    for line in verdict.get("statement", []):
        print(line)
    if plot:
        print(f"plot: {plot}")
