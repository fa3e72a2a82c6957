"""`geoprobe bridge` (one layer) and `geoprobe sweep` (one bridge per layer + Spearman)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from geoprobe.cli.root import app
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


def _settings(steps, batch_size, seq_len, lr, d_model, n_layers, n_heads, sigma_b, bridge_steps, seed, until,
              eval_every, vocab, precision):
    from bridges.hidden import BridgeConfig
    from geoprobe.sweep import BridgeSettings

    network = BridgeConfig(layer=0, vocab_size=0, hidden_size=0, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                           sigma_b=sigma_b, bridge_steps=bridge_steps, vocab=vocab, precision=precision)
    return BridgeSettings(network, steps, batch_size, seq_len, lr, seed, until, eval_every)


def _bars(label: str):
    return progress(label, "step")


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
    from geoprobe.report.terminal import print_table
    from geoprobe.sweep import bridge_run

    settings = _settings(steps, batch_size, seq_len, lr, d_model, n_layers, n_heads, sigma_b, bridge_steps, seed, until,
                         eval_every, vocab, precision)
    metrics, folder = bridge_run(settings, layer, run, model, corpus, out, device, dtype, device_map, force, _bars)
    show({**metrics, "dir": str(folder)}, lambda: print_table(
        f"bridge at layer {metrics['layer']} → {folder}", ["key", "value"],
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
    from geoprobe.sweep import sweep_run

    settings = _settings(steps, batch_size, seq_len, lr, d_model, n_layers, n_heads, sigma_b, bridge_steps, seed, until,
                         eval_every, vocab, precision)
    result = sweep_run(run, settings, layers, device, dtype, force, _bars)
    if result is not None:  # data-parallel ranks: rank 0 reports
        show(result, lambda: _print_sweep(run, result["rows"], result["correlations"], result["plot"]))


def _print_sweep(run, rows, summary, plot) -> None:
    from geoprobe.metrics.correlation import describe
    from geoprobe.report.terminal import print_table

    keys = ["layer", "score", "rank", "nmse", "nmse_dim", "delta_ce", "nmse_noisy", "steps_run", "stop"]
    print_table(f"sweep of {run}", keys, [[r[k] for k in keys] for r in rows])
    for loss in ("nmse", "nmse_dim", "delta_ce", "nmse_noisy"):
        print(describe(loss, summary[loss]))
    print(f"geometry-chosen layer {summary['chosen_layer']}, oracle layer {summary['oracle_layer']}, "
          f"worst layer {summary['worst_layer']}; {summary['depth']['statement']}   plot: {plot}")
