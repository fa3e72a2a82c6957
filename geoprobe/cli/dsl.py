"""`geoprobe dsl train`: a DSL denoiser from scratch, from a DSL checkpoint or from a pretrained LM."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from geoprobe.bridges.dsl import dsl_settings, fit_dsl
from geoprobe.backbone import resolve_device
from geoprobe.bridges.parallel import Execution
from geoprobe.cli.options import (ActivationCheckpointing, BatchSize, Corpus, Deterministic, Device, EvalEvery, Force,
    Fsdp, GradAccum, LogTo, Precision, Seed, SeqLen, Steps, Until, Warmup, defaults_of, plain)
from geoprobe.cli.output import progress, show
from geoprobe.cli.root import app
from geoprobe.distributed import world_from

RUN, SHAPE = dsl_settings()  # the defaults live in the settings classes
TRAIN = RUN.train
LAYOUT = Execution()
FIT = defaults_of(fit_dsl)  # --log-to's and --deterministic's defaults: fit_dsl's signature

dsl_app = typer.Typer(help="Discrete stochastic localization: train the SNR-agnostic denoiser.", no_args_is_help=True)
app.add_typer(dsl_app, name="dsl")

@dsl_app.command("train", epilog="Examples:\n\n"
                 "  geoprobe dsl train --corpus kjv --tokenizer train:4096 --steps 2000 --out runs/dsl\n\n"
                 "  geoprobe dsl train --corpus kjv --tokenizer train:4096 --snr endpoint --out runs/mdlm\n\n"
                 "  geoprobe dsl train --corpus kjv --tokenizer train:4096 --snr mixed --init runs/mdlm --out runs/dsl-ft\n\n"
                 "  geoprobe dsl train --corpus kjv --init-from builtin:smollm2 --steps 300 --batch-size 8 --out runs/dsl-smollm2")
def train_cmd(
    *,
    out: Annotated[Path, typer.Option("--out", "-o", help="Checkpoint directory (resumed when it exists).")],
    corpus: Corpus = "kjv",
    tokenizer: Annotated[str | None, typer.Option(help="A model or tokenizer (folder, hub id, builtin:smollm2), "
                                                       "train:V (byte-level BPE on the corpus), words (one token "
                                                       "per word of the corpus) or char (Text8). Default: train:4096, "
                                                       "or --init-from's.")] = None,
    snr: Annotated[str, typer.Option(help="mixed (log-normal + random-order endpoint), lognormal, or endpoint "
                                          "(MDLM baseline).")] = RUN.snr,
    roar_frac: Annotated[float, typer.Option(help="Share of random-order sequences in --snr mixed.")] = RUN.roar_frac,
    mdlm_objective: Annotated[str, typer.Option(help="--snr endpoint's loss: mdlm (masked tokens only, weighted 1/t, "
                                                     "antithetic t) or legacy (every position, unweighted).")]
    = RUN.mdlm_objective,
    steps: Steps = TRAIN.steps, batch_size: BatchSize = TRAIN.batch_size, seq_len: SeqLen = RUN.seq_len,
    lr: Annotated[float, typer.Option(help="Peak learning rate (AdamW, warmup then cosine).")] = TRAIN.lr,
    warmup: Warmup = None,
    until: Until = None,
    eval_every: EvalEvery = TRAIN.eval_every,
    plateau_rel: Annotated[float, typer.Option(help="The plateau rule's threshold: stop when the last 20% of "
                                                    "steps improved the bound by less than this share.")]
    = TRAIN.plateau_rel,
    min_steps: Annotated[int, typer.Option(min=0, help="Never stop on a plateau before this step.")] = TRAIN.min_steps,
    save_every: Annotated[int, typer.Option(min=0, help="Write the resumable checkpoint every N steps and at the "
                                                        "end; 0: never (only the final weights: an 8B model's "
                                                        "checkpoint is 112 GB).")] = TRAIN.save_every,
    d_tok: Annotated[int, typer.Option(min=2, help="Token embedding dimension on the unit sphere.")] = SHAPE.d_tok,
    d_model: Annotated[int, typer.Option(min=8, help="Transformer width.")] = SHAPE.d_model,
    n_layers: Annotated[int, typer.Option(min=1, help="Transformer blocks.")] = SHAPE.n_layers,
    n_heads: Annotated[int, typer.Option(min=1, help="Attention heads.")] = SHAPE.n_heads,
    norm_input: Annotated[bool, typer.Option(help="Give the network log(1+|z|) per token.")] = SHAPE.norm_input,
    table_init: Annotated[str, typer.Option(help="Token table: random, or pca (the top principal components "
                                                 "of --tokenizer's model input embeddings).")] = "random",
    freeze_table: Annotated[bool, typer.Option(help="Keep the unit-norm token table fixed.")] = not SHAPE.learn_table,
    init: Annotated[Path | None, typer.Option(help="Start from this DSL checkpoint (e.g. an MDLM one).")] = None,
    init_from: Annotated[str | None, typer.Option("--init-from", help="Start from a pretrained causal LM (folder, hub "
                                                 "id, builtin:smollm2): its blocks run bidirectionally, its head, its "
                                                 "input embedding as the converter's matrix.")] = None,
    seed: Seed = TRAIN.seed, device: Device = "auto", force: Force = False, precision: Precision = TRAIN.precision,
    fsdp: Fsdp = LAYOUT.fsdp, grad_accum: GradAccum = LAYOUT.grad_accum,
    activation_checkpointing: ActivationCheckpointing = LAYOUT.activation_checkpointing, log_to: LogTo = FIT.log_to,
    deterministic: Deterministic = FIT.deterministic,
):
    """Train a DSL denoiser (a fixed budget, or until its held-out MDLM bound plateaus, keeping the
    best weights; resumable)."""

    settings, shape = dsl_settings(steps=steps, batch_size=batch_size, lr=lr, warmup=warmup, seed=seed,
                                   until=plain(until), eval_every=eval_every, plateau_rel=plateau_rel, min_steps=min_steps,
                                   save_every=save_every, precision=plain(precision), snr=snr, roar_frac=roar_frac,
                                   mdlm_objective=mdlm_objective, seq_len=seq_len, d_tok=d_tok,
                                   d_model=d_model, n_layers=n_layers, n_heads=n_heads, norm_input=norm_input,
                                   learn_table=not freeze_table)
    resolve_device(device)
    metrics = fit_dsl(out, corpus, tokenizer, settings=settings, shape=shape, table_init=table_init, init=init,
                      init_from=init_from, force=force, device=device, progress=progress("dsl train", "step"),
                      world=world_from(), execution=Execution(fsdp, grad_accum, activation_checkpointing),
                      log_to=log_to, deterministic=deterministic)
    if metrics is not None:  # data-parallel ranks: rank 0 evaluates and reports
        _report(metrics, f"dsl train → {out}")


def _report(data: dict, title: str) -> None:
    from geoprobe.report.terminal import print_table

    show(data, lambda: print_table(title, ["key", "value"], [[k, v] for k, v in data.items()]))
