"""`geoprobe bridge` (one layer) and `geoprobe sweep` (one bridge per layer + Spearman)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from geoprobe.cli.options import (BatchSize, Deterministic, Device, DeviceMap, Dtype, EvalEvery, Force, Layers, LogTo,
    Precision, Seed, Steps, Until)
from geoprobe.cli.output import progress, show
from geoprobe.cli.root import app
from geoprobe.report.terminal import print_table
from geoprobe.workflows.sweep import BridgeSettings, NETWORK as DEFAULT, bridge_run, parse_seeds, sweep_run

Run = Annotated[Path | None, typer.Option("--run", help="A scanned run directory (model, corpus and scores).")]
Model = Annotated[str | None, typer.Option("--model", help="Backbone, when there is no --run.")]
CorpusOpt = Annotated[str | None, typer.Option("--corpus", help="Text source, when there is no --run.")]
Lr = Annotated[float, typer.Option("--lr", help="Peak learning rate.")]
DModel = Annotated[int, typer.Option("--d-model", min=0, help="Bridge transformer width (0: 1.6 x (d/2 "
                                     "rounded up to 64, within 128..1024), to the nearest multiple of 64: "
                                     "192..1664, 512 at d = 576; docs/bridge-design.md).")]
NLayers = Annotated[int, typer.Option("--n-layers", min=0, help="Bridge transformer blocks (0: 2 + layer // 4, "
                                      "at most 6).")]
NHeads = Annotated[int, typer.Option("--n-heads", min=0, help="Bridge attention heads (0: width / 64).")]
RegressionFrac = Annotated[float, typer.Option("--regression-frac", min=0.0, max=1.0, help="Share of training "
                                               "sequences that are the plain regression validation scores (clean "
                                               "condition and tau = 0).")]
TrainTokens = Annotated[int, typer.Option("--train-tokens", min=1, help="Training pool: its teacher states are "
                                          "computed once and held in RAM for every layer and seed.")]
Ceiling = Annotated[bool, typer.Option("--ceiling", help="Also train the ceiling control per layer: the same "
                                       "network as a plain clean regression (what the diffusion part costs).")]
Carry = Annotated[str, typer.Option("--carry", help="What the bridge's update is added to: lookup (each token's "
                                    "mean training state at the layer, the token-lookup control) or channel (layer "
                                    "0 carried channel by channel).")]
ConvWindow = Annotated[int, typer.Option("--conv-window", min=0, max=64, help="Previous positions a causal "
                                        "convolution over the bridge network's input reads (0: none).")]
Attention = Annotated[str, typer.Option("--attention", help="The bridge network's attention: bidirectional "
                                        "(each position reads every other) or causal (positions to the left only: "
                                        "left-to-right decoding, `sample --sampler ltr`, then keeps the prefix).")]
SigmaB = Annotated[float, typer.Option("--sigma-b", min=0.0, help="Bridge noise in standardised units "
                                      "(0: a deterministic path).")]
TauZero = Annotated[float, typer.Option("--tau-zero", min=0.0, max=1.0, help="Share of training sequences at "
                                        "tau = 0, the regression from the source alone that sampling starts from.")]
SeqLen = Annotated[int | None, typer.Option("--seq-len", min=2, help="Tokens per training and validation block "
                                            "(BOS included; default: the scan's, so the bridge is scored on the "
                                            "states the geometry measured; 128 without --run).")]
Seeds = Annotated[str, typer.Option("--seeds", help="Training seeds, each a replicate of every layer (0,1,2 or 0-2): "
                                    "they vary initialisation and training noise, not the validation data.")]
IncludeSource = Annotated[bool, typer.Option("--include-source", help="Test layer 0 too (its clean source is its "
                                             "own state, so its loss is ~0 by construction).")]
TRAINING = BridgeSettings(DEFAULT)  # the defaults live in the settings classes
BridgeSteps = Annotated[int, typer.Option("--bridge-steps", min=1, help="Bridge sampling steps K.")]
Vocab = Annotated[str, typer.Option("--vocab", help="The converter's tokens: corpus (those the corpus contains, "
                                   "and the specials: exact, ~5x faster on a 49k vocabulary) or all.")]
RegressionFlag = Annotated[bool, typer.Option("--regression", help="Train the deterministic regression "
                                              "E[h_l | z] instead of the diffusion bridge (sets --sigma-b 0 "
                                              "--tau-zero 1 --bridge-steps 1 --regression-frac 0.5).")]


def _settings(**flags):
    from geoprobe.workflows.sweep import bridge_settings

    return bridge_settings(**flags)


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
    steps: Steps = TRAINING.steps, batch_size: BatchSize = TRAINING.batch_size, seq_len: SeqLen = TRAINING.seq_len,
    lr: Lr = TRAINING.lr,
    d_model: DModel = DEFAULT.d_model, n_layers: NLayers = DEFAULT.n_layers, n_heads: NHeads = DEFAULT.n_heads,
    sigma_b: SigmaB = DEFAULT.sigma_b, bridge_steps: BridgeSteps = DEFAULT.bridge_steps,
    conv_window: ConvWindow = DEFAULT.conv_window, attention: Attention = DEFAULT.attention,
    tau_zero: TauZero = DEFAULT.tau_zero, regression_frac: RegressionFrac = DEFAULT.regression_frac,
    carry: Carry = DEFAULT.carry, regression: RegressionFlag = False,
    train_tokens: TrainTokens = TRAINING.train_tokens, seed: Seed = TRAINING.seed, until: Until = TRAINING.until,
    eval_every: EvalEvery = TRAINING.eval_every,
    vocab: Vocab = DEFAULT.vocab, precision: Precision = DEFAULT.precision,
    device: Device = "auto",
    dtype: Dtype = "auto", force: Force = False, device_map: DeviceMap = None, log_to: LogTo = TRAINING.log_to,
    deterministic: Deterministic = TRAINING.deterministic,
):
    """Train a diffusion bridge that reconstructs one layer's hidden state (upper stack frozen).
    It stops by its plateau on its validation objective; --regression trains the deterministic
    regression instead.
    Data parallel under torchrun (--batch-size is the global batch); --device-map auto spreads a
    large frozen backbone over the GPUs while the bridge trains on the first."""

    settings = _settings(steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, d_model=d_model,
                         n_layers=n_layers, n_heads=n_heads, sigma_b=sigma_b, bridge_steps=bridge_steps, seed=seed,
                         until=until, eval_every=eval_every, vocab=vocab, precision=precision, tau_zero=tau_zero,
                         regression_frac=regression_frac, carry=carry, conv_window=conv_window,
                         train_tokens=train_tokens, regression=regression, log_to=log_to,
                         deterministic=deterministic, attention=attention)
    metrics, folder = bridge_run(settings, layer, run, model, corpus, out, device, dtype, device_map, force, _bars)
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
def sweep(
    run: Annotated[Path, typer.Option("--run", help="A scanned run directory (its ranking gives the scores).")],
    layers: Layers = "all", seeds: Seeds = "", include_source: IncludeSource = False,
    steps: Steps = TRAINING.steps, batch_size: BatchSize = TRAINING.batch_size, seq_len: SeqLen = TRAINING.seq_len,
    lr: Lr = TRAINING.lr,
    d_model: DModel = DEFAULT.d_model, n_layers: NLayers = DEFAULT.n_layers, n_heads: NHeads = DEFAULT.n_heads,
    sigma_b: SigmaB = DEFAULT.sigma_b, bridge_steps: BridgeSteps = DEFAULT.bridge_steps,
    conv_window: ConvWindow = DEFAULT.conv_window, attention: Attention = DEFAULT.attention,
    tau_zero: TauZero = DEFAULT.tau_zero, regression_frac: RegressionFrac = DEFAULT.regression_frac,
    carry: Carry = DEFAULT.carry, regression: RegressionFlag = False,
    train_tokens: TrainTokens = TRAINING.train_tokens, seed: Seed = TRAINING.seed, until: Until = TRAINING.until,
    eval_every: EvalEvery = TRAINING.eval_every,
    vocab: Vocab = DEFAULT.vocab, precision: Precision = DEFAULT.precision,
    device: Device = "auto",
    dtype: Dtype = "auto", force: Force = False, ceiling: Ceiling = False, log_to: LogTo = TRAINING.log_to,
    deterministic: Deterministic = TRAINING.deterministic,
):
    """One bridge per layer and seed, each trained to its plateau under one step cap; then the
    pre-registered test (one-sided Spearman ρ of the geometry score against the seed-mean
    per-channel nmse, layer 0 excluded), the secondary losses (Holm), the seed noise and the
    controls (depth, massive channels, other ways to compute the score)."""

    settings = _settings(steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, d_model=d_model,
                         n_layers=n_layers, n_heads=n_heads, sigma_b=sigma_b, bridge_steps=bridge_steps, seed=seed,
                         until=until, eval_every=eval_every, vocab=vocab, precision=precision, tau_zero=tau_zero,
                         regression_frac=regression_frac, carry=carry, conv_window=conv_window,
                         train_tokens=train_tokens, regression=regression, log_to=log_to,
                         deterministic=deterministic, attention=attention)
    chosen_seeds = parse_seeds(seeds) if seeds else [seed]
    result = sweep_run(run, settings, layers, device, dtype, force, _bars, chosen_seeds, include_source, ceiling)
    if result is not None:  # data-parallel ranks: rank 0 reports
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
