"""`geoprobe sample` (any generator) and `geoprobe nll` (a DSL model's held-out bits)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from geoprobe.cli.root import app
from geoprobe.cli.output import show
from geoprobe.cli.options import BatchSize, Corpus, Device, Seed, SeqLen
from geoprobe.generate import SampleSettings
from bridges.likelihood import ESTIMATORS
from samplers import FINISHERS, NAMES

SAMPLE = SampleSettings()  # the defaults live in the settings class


@app.command(epilog="Examples:\n\n  geoprobe sample --model runs/dsl --sampler roar --num 8 --length 128\n\n"
                    "  geoprobe sample --model runs/dsl --sampler hybrid --steps 48 --top-p 0.9 --out runs/dsl/samples\n\n"
                    "  geoprobe sample --model runs/dsl --sampler remdm-loop --steps 128 --eta 0.02")
def sample(
    model: Annotated[Path, typer.Option("--model", help="A DSL checkpoint directory or a bridge directory "
                                                        "(RUN/bridges/layer-NN).")],
    sampler: Annotated[str, typer.Option(help=", ".join(NAMES) + " (ar: a causal LM itself, left to "
                                              "right).")] = "roar",
    num: Annotated[int, typer.Option(help="Number of samples.")] = SAMPLE.num,
    length: Annotated[int, typer.Option(help="Tokens per sample.")] = SAMPLE.length,
    steps: Annotated[int | None, typer.Option("--steps", help="Denoiser budget (roar: default one token "
                                                              "per step).")] = SAMPLE.steps,
    top_p: Annotated[float, typer.Option(help="Nucleus threshold in (0, 1].")] = SAMPLE.top_p,
    per_step: Annotated[int | None, typer.Option(help="roar: tokens revealed per step.")] = SAMPLE.per_step,
    eta: Annotated[float, typer.Option(help="ReMDM rescale/loop remasking rate.")] = SAMPLE.eta,
    eta_cap: Annotated[float, typer.Option(help="ReMDM cap.")] = SAMPLE.eta_cap,
    switch_snr: Annotated[float, typer.Option(help="hybrid: SNR where the continuous stage stops.")] = SAMPLE.switch_snr,
    finisher: Annotated[str, typer.Option(help="hybrid: the masked sampler that finishes (" + ", ".join(FINISHERS)
                                               + ").")] = SAMPLE.finisher,
    decode: Annotated[str, typer.Option(help="Bridges: stack (the frozen upper blocks and head) or round (nearest "
                                             "token embedding: the layer-0 Diffusion-LM baseline).")] = SAMPLE.decode,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Where samples.jsonl goes (default: MODEL).")] = None,
    seed: Seed = SAMPLE.seed, device: Device = "auto",
):
    """Generate text with any sampler from a DSL checkpoint or a bridge → samples.jsonl."""
    from geoprobe.generate import generate

    settings = SampleSettings(num=num, length=length, steps=steps, top_p=top_p, per_step=per_step, eta=eta,
                              eta_cap=eta_cap, switch_snr=switch_snr, finisher=finisher, decode=decode, seed=seed)
    result = generate(model, sampler, settings, out, device)
    show(result, lambda: _print_samples(result))


def _print_samples(result: dict) -> None:
    from geoprobe.report.terminal import print_table

    rows, meta = result["samples"], result["meta"]
    for row in rows[:4]:
        print(row["text"][:200].replace("\n", " "))
    print_table(f"{len(rows)} samples → {meta['file']}", ["key", "value"],
                [[k, meta.get(k)] for k in ("sampler", "steps", "nfe", "skipped_calls", "seconds", "tokens_per_second")])


@app.command(epilog="Examples:\n\n  geoprobe nll --model runs/dsl --corpus held-out.txt\n\n"
                    "  geoprobe nll --model runs/dsl --corpus kjv --estimators mdlm,roar --max-seqs 16")
def nll(
    model: Annotated[Path, typer.Option("--model", help="A DSL checkpoint directory.")],
    corpus: Corpus = "kjv",
    seq_len: SeqLen = 128,
    max_seqs: Annotated[int, typer.Option(min=1, help="Held-out sequences to score.")] = 32,
    estimators: Annotated[str | None, typer.Option(help="Comma list of " + ", ".join(ESTIMATORS)
                                                        + " (default: all).")] = None,
    batch_size: BatchSize = 8, seed: Seed = 0, device: Device = "auto",
    split: Annotated[str, typer.Option(help="Text8 files: the split to score (train, validation or test: the "
                                            "90/5/5% character ranges).")] = "test",
):
    """Bits per token (and per character) of held-out text under a DSL checkpoint. Given a
    Text8 file (one line of a-z and spaces) it follows the Text8 protocol: a `--tokenizer char`
    model, the 90/5/5% split, sequences of 256 characters, bits per character."""
    from geoprobe.generate import corpus_nll
    from geoprobe.report.terminal import print_table

    result = corpus_nll(model, corpus, seq_len, max_seqs, estimators, batch_size, seed, device, split)
    show(result, lambda: print_table(f"nll of {corpus} under {model}", ["key", "value"],
                                     [[k, v] for k, v in result.items()]))
