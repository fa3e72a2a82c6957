"""`geoprobe baseline train KIND`: an embedding-diffusion baseline of the DiHAL comparison
(Diffusion-LM, SED or CoDAR; geoprobe.bridges.embedding_diffusion)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from geoprobe.bridges.embedding_diffusion import PRESETS, BaselineTrainSettings, EmbeddingDiffusionConfig, \
    baseline_settings, fit_baseline
from geoprobe.backbone import resolve_device
from geoprobe.cli.dsl import _report
from geoprobe.cli.options import (BatchSize, Corpus, Deterministic, Device, EvalEvery, Force, LogTo, Precision, Seed,
    SeqLen, Steps, Until, Warmup, defaults_of, plain)
from geoprobe.cli.output import progress
from geoprobe.cli.root import app
from geoprobe.distributed import world_from

RUN = BaselineTrainSettings()
TRAIN = RUN.train
SHAPE = defaults_of(EmbeddingDiffusionConfig)  # the network's size: the kinds' presets set the rest
FIT = defaults_of(fit_baseline)  # --log-to's and --deterministic's defaults: fit_baseline's signature

baseline_app = typer.Typer(help="Embedding-diffusion baselines (Diffusion-LM, SED, CoDAR) for the DiHAL comparison.",
                           no_args_is_help=True)
app.add_typer(baseline_app, name="baseline")


@baseline_app.command("train", epilog="Examples:\n\n"
                      "  geoprobe baseline train diffusion-lm --corpus kjv --steps 2000 --out runs/diffusion-lm\n\n"
                      "  geoprobe baseline train sed --corpus kjv --eval-every 50 --steps 4000 --out runs/sed\n\n"
                      "  geoprobe sample --model runs/sed --sampler ancestral --steps 32 --num 16 --length 64")
def train_cmd(
    *,
    kind: Annotated[str, typer.Argument(help=", ".join(PRESETS) + ": each paper's schedule, embeddings, loss "
                                             "and rounding (docs/method.md).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Checkpoint directory (resumed when it exists).")],
    corpus: Corpus = "kjv",
    tokenizer: Annotated[str | None, typer.Option(help="A model or tokenizer, train:V (byte-level BPE on the "
                                                       "corpus), words or char. Default: train:4096.")] = None,
    steps: Steps = TRAIN.steps, batch_size: BatchSize = TRAIN.batch_size, seq_len: SeqLen = RUN.seq_len,
    lr: Annotated[float, typer.Option(help="Peak learning rate (AdamW, warmup then cosine).")] = TRAIN.lr,
    warmup: Warmup = None,
    until: Until = None,
    eval_every: EvalEvery = TRAIN.eval_every,
    min_steps: Annotated[int, typer.Option(min=0, help="Never stop on a plateau before this step.")] = TRAIN.min_steps,
    save_every: Annotated[int, typer.Option(min=0, help="Write the resumable checkpoint every N steps.")]
    = TRAIN.save_every,
    d_emb: Annotated[int | None, typer.Option(min=2, help="Embedding dimension (default: the kind's paper's: "
                                                          + ", ".join(f"{k} {v['d_emb']}" for k, v in PRESETS.items())
                                                          + ").")] = None,
    d_model: Annotated[int, typer.Option(min=8, help="Transformer width.")] = SHAPE.d_model,
    n_layers: Annotated[int, typer.Option(min=1, help="Transformer blocks.")] = SHAPE.n_layers,
    n_heads: Annotated[int, typer.Option(min=1, help="Attention heads.")] = SHAPE.n_heads,
    seed: Seed = TRAIN.seed, device: Device = "auto", force: Force = False, precision: Precision = TRAIN.precision,
    log_to: LogTo = FIT.log_to, deterministic: Deterministic = FIT.deterministic,
):
    """Train an embedding-diffusion baseline (a fixed budget, or until its held-out loss plateaus,
    keeping the best weights; resumable)."""

    shape = {"d_model": d_model, "n_layers": n_layers, "n_heads": n_heads, **({"d_emb": d_emb} if d_emb else {})}
    settings, network = baseline_settings(kind, steps=steps, batch_size=batch_size, lr=lr, warmup=warmup, seed=seed,
                                          until=plain(until), eval_every=eval_every, min_steps=min_steps, save_every=save_every,
                                          precision=plain(precision), seq_len=seq_len, **shape)
    resolve_device(device)
    metrics = fit_baseline(out, kind, corpus, tokenizer=tokenizer, settings=settings, shape=network, force=force,
                           device=device, progress=progress(f"baseline train {kind}", "step"), world=world_from(),
                           log_to=log_to, deterministic=deterministic)
    if metrics is not None:  # data-parallel ranks: rank 0 evaluates and reports
        _report(metrics, f"baseline train {kind} → {out}")
