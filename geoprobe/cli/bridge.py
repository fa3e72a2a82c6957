"""`geoprobe bridge` (one layer) and `geoprobe sweep` (one bridge per layer + Spearman)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from geoprobe.cli.app import app
from geoprobe.cli.output import progress, show
from geoprobe.cli.options import BatchSize, Device, DeviceMap, Dtype, Force, Layers, Precision, Seed, SeqLen, Steps

Run = Annotated[Path | None, typer.Option("--run", help="A scanned run directory (model, corpus and scores).")]
Model = Annotated[str | None, typer.Option("--model", help="Backbone, when there is no --run.")]
CorpusOpt = Annotated[str | None, typer.Option("--corpus", help="Text source, when there is no --run.")]
Lr = Annotated[float, typer.Option("--lr", help="Peak learning rate.")]
DModel = Annotated[int, typer.Option("--d-model", min=8, help="Bridge transformer width.")]
NLayers = Annotated[int, typer.Option("--n-layers", min=1, help="Bridge transformer blocks.")]
NHeads = Annotated[int, typer.Option("--n-heads", min=1, help="Bridge attention heads.")]
SigmaB = Annotated[float, typer.Option("--sigma-b", min=0.0, help="Bridge noise (0 = deterministic path).")]
BridgeSteps = Annotated[int, typer.Option("--bridge-steps", min=1, help="Bridge sampling steps K.")]
Until = Annotated[str, typer.Option("--until", help="plateau: train until the validation nmse stops improving "
                                    "(< 2% better over the last 20% of steps; --steps is the cap); steps: exactly "
                                    "--steps.")]
Vocab = Annotated[str, typer.Option("--vocab", help="The converter's tokens: corpus (those the corpus contains, "
                                   "and the specials: exact, ~5x faster on a 49k vocabulary) or all.")]
EvalEvery = Annotated[int, typer.Option("--eval-every", min=0, help="Steps between plateau checks (0: --steps/40).")]


def _configs(source, layer, steps, batch_size, lr, d_model, n_layers, n_heads, sigma_b, bridge_steps, seed, until,
             eval_every, vocab, precision):
    from bridges.fit import bridge_training
    from bridges.hidden import BridgeConfig

    train_cfg = bridge_training(steps, batch_size, lr, sigma_b, seed, until, eval_every, vocab, precision)
    cfg = BridgeConfig(layer=layer, vocab_size=source.backbone.config.vocab_size,
                       hidden_size=source.backbone.hidden_size, d_model=d_model, n_layers=n_layers,
                       n_heads=n_heads, sigma_b=sigma_b, bridge_steps=bridge_steps, vocab=vocab,
                       precision=precision)
    return cfg, train_cfg


def _fit(source, layer, root, args, force=False):
    from bridges.fit import fit_bridge
    from geoprobe.distributed import world_from
    from geoprobe.rundir import clear, holding
    from geoprobe.sweep import bridge_dir, check_layer, identity

    check_layer(source, layer)
    cfg, train_cfg = _configs(source, layer, *args)
    out = bridge_dir(root, layer)
    world = world_from()
    with holding(out, "geoprobe bridge", world.rank):
        if force and world.is_main:
            clear(out)
        world.barrier()
        bar = progress(f"bridge layer {layer}", "step")
        try:
            return fit_bridge(source.backbone, layer, source.train_blocks, source.val_blocks, cfg, train_cfg, out,
                              identity(source, layer), progress=bar, world=world), out
        finally:
            bar.stop()


@app.command(epilog="Examples:\n\n  geoprobe bridge --run runs/demo            # at the layer the scan chose\n\n"
                    "  geoprobe bridge --run runs/demo --layer 3 --steps 500\n\n"
                    "  geoprobe bridge --model builtin:smollm2 --corpus kjv --layer 2 --out runs/b\n\n"
                  "  torchrun --nproc-per-node 4 -m geoprobe -- bridge --run runs/llama8b --batch-size 64")
def bridge(
    layer: Annotated[int | None, typer.Option("--layer", help="Layer to replace (default: the scan's choice).")] = None,
    run: Run = None, model: Model = None, corpus: CorpusOpt = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Root for bridges/layer-NN (default: --run).")] = None,
    steps: Steps = 2000, batch_size: BatchSize = 8, seq_len: SeqLen = 128, lr: Lr = 1e-3, d_model: DModel = 128,
    n_layers: NLayers = 2, n_heads: NHeads = 4, sigma_b: SigmaB = 0.0, bridge_steps: BridgeSteps = 8,
    seed: Seed = 0, until: Until = "plateau", eval_every: EvalEvery = 0, vocab: Vocab = "corpus",
    precision: Precision = "auto",
    device: Device = "auto",
    dtype: Dtype = "auto", force: Force = False, device_map: DeviceMap = None,
):
    """Train a diffusion bridge that reconstructs one layer's hidden state (upper stack frozen).
    Data parallel under torchrun (--batch-size is the global batch); --device-map auto spreads a
    large frozen backbone over the GPUs while the bridge trains on the first."""
    from bridges.fit import bridge_training
    from geoprobe.distributed import world_from
    from geoprobe.backbone import check_device_map
    from geoprobe.errors import BadInput
    from geoprobe.rundir import holding
    from geoprobe.sweep import bridge_dir, chosen_layer, open_source

    if run is None and out is None:
        raise BadInput("pass --run RUN, or --out DIR with --model and --corpus")
    if layer is None:
        if run is None:
            raise BadInput("without --run, pass --layer")
        layer = chosen_layer(run)
    if layer < 0:
        raise BadInput(f"--layer must be >= 0, got {layer}")
    args = (steps, batch_size, lr, d_model, n_layers, n_heads, sigma_b, bridge_steps, seed, until, eval_every, vocab,
            precision)
    bridge_training(steps, batch_size, lr, sigma_b, seed, until, eval_every, vocab, precision)  # flags checked first
    check_device_map(device_map)
    with holding(bridge_dir(out or run, layer), "geoprobe bridge", world_from().rank):  # before the slow load
        source = open_source(run, model, corpus, seq_len, seed, world_from().device(device, device_map), dtype,
                             device_map=device_map)
        metrics, folder = _fit(source, layer, out or run, args, force)
    from geoprobe.report.terminal import print_table

    show({**metrics, "dir": str(folder)}, lambda: print_table(
        f"bridge at layer {layer} → {folder}", ["key", "value"],
        [[k, v] for k, v in metrics.items() if not isinstance(v, dict)]))


@app.command(epilog="Examples:\n\n  geoprobe sweep --run runs/demo       # every scanned layer, each to its plateau\n\n"
                    "  geoprobe sweep --run runs/demo --layers 0-8 --steps 3000 --eval-every 50\n\n"
                    "  geoprobe --format json sweep --run runs/demo --layers 0,3,6,9 --until steps --steps 200")
def sweep(
    run: Annotated[Path, typer.Option("--run", help="A scanned run directory (its ranking gives the scores).")],
    layers: Layers = "all",
    steps: Steps = 2000, batch_size: BatchSize = 8, seq_len: SeqLen = 128, lr: Lr = 1e-3, d_model: DModel = 128,
    n_layers: NLayers = 2, n_heads: NHeads = 4, sigma_b: SigmaB = 0.0, bridge_steps: BridgeSteps = 8,
    seed: Seed = 0, until: Until = "plateau", eval_every: EvalEvery = 0, vocab: Vocab = "corpus",
    precision: Precision = "auto",
    device: Device = "auto",
    dtype: Dtype = "auto", force: Force = False,
):
    """One bridge per layer, each trained to its plateau under one step cap; Spearman ρ between
    the geometry score and each validation loss (nmse, nmse_dim, delta_ce, nmse_noisy)."""
    from bridges.fit import bridge_training
    from geoprobe.distributed import world_from
    from geoprobe.backbone import parse_layers
    from geoprobe.rundir import holding
    from geoprobe.sweep import open_source, ranking_rows, summarise, write_sweep

    args = (steps, batch_size, lr, d_model, n_layers, n_heads, sigma_b, bridge_steps, seed, until, eval_every, vocab,
            precision)
    bridge_training(steps, batch_size, lr, sigma_b, seed, until, eval_every, vocab, precision)  # flags checked first
    scores = {r["layer"]: r for r in ranking_rows(run)}
    with holding(run / "bridges", "geoprobe sweep", world_from().rank):  # one sweep at a time on a run
        source = open_source(run, None, None, seq_len, seed, world_from().device(device), dtype)
        chosen = parse_layers(layers, source.backbone.num_layers - 1)
        if layers.strip() == "all":  # every layer that was scanned and has blocks above it
            chosen = [l for l in chosen if l in scores]
        rows = []
        for layer in chosen:
            metrics, _ = _fit(source, layer, run, args, force)
            rows.append({**metrics, "score": scores[layer]["score"], "rank": scores[layer]["rank"]})
        if not world_from().is_main:  # data-parallel ranks: rank 0 writes the sweep
            return
        summary = summarise(rows, seed)
        plot = write_sweep(run, rows, summary, source.model)
    show({"rows": rows, "correlations": summary, "plot": str(plot)}, lambda: _print_sweep(run, rows, summary, plot))


def _print_sweep(run, rows, summary, plot) -> None:
    from geoprobe.metrics.correlation import describe
    from geoprobe.report.terminal import print_table

    keys = ["layer", "score", "rank", "nmse", "nmse_dim", "delta_ce", "nmse_noisy", "steps_run", "stop"]
    print_table(f"sweep of {run}", keys, [[r[k] for k in keys] for r in rows])
    for loss in ("nmse", "nmse_dim", "delta_ce", "nmse_noisy"):
        print(describe(loss, summary[loss]))
    print(f"geometry-chosen layer {summary['chosen_layer']}, oracle layer {summary['oracle_layer']}, "
          f"worst layer {summary['worst_layer']}; {summary['depth']['statement']}   plot: {plot}")
