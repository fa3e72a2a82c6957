"""`geoprobe sample` (any generator) and `geoprobe nll` (a DSL model's held-out bits)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from geoprobe.bridges.hidden import DECODES
from geoprobe.bridges.likelihood import ESTIMATORS
from geoprobe.cli.options import BatchSize, Corpus, Device, Force, Seed, SeqLen, defaults_of
from geoprobe.cli.output import show
from geoprobe.cli.root import app
from geoprobe.report.terminal import print_table
from geoprobe.workflows.generate import SampleSettings, corpus_nll, generate
from geoprobe.samplers import FINISHERS, NAMES, PRESETS, SAMPLERS, knob_default

SAMPLE = SampleSettings()  # num, length, seed, finisher and decode; the sampler knobs default in their classes
NLL = defaults_of(corpus_nll)  # nll's flags default as the call does


def _default(knob: str) -> str:
    return f" (default: {knob_default(knob)})"


@app.command(epilog="Examples:\n\n  geoprobe sample --model runs/dsl --sampler roar --num 8 --length 128\n\n"
                    "  geoprobe sample --model runs/dsl --sampler hybrid --steps 48 --top-p 0.9 --out runs/dsl-hybrid\n\n"
                    "  geoprobe sample --model runs/dsl --sampler remdm-loop --steps 128 --eta 0.02\n\n"
                    "  geoprobe sample --model runs/dsl --sampler remdm-cap --preset remdm-paper   (T 1,024, top-p 0.9 "
                    "by ReMDM's rule, eta_cap 0.008, final argmax)")
def sample(
    model: Annotated[Path, typer.Option("--model", help="A DSL or baseline checkpoint directory, a bridge directory "
                                                        "(RUN/bridges/layer-NN/seed-S, or RUN/bridges/layer-NN when "
                                                        "it holds one seed), or with --sampler ar a causal LM.")],
    sampler: Annotated[str, typer.Option(help=", ".join(NAMES) + " (ar: a causal LM itself, left to "
                                              "right).")] = "roar",
    num: Annotated[int, typer.Option(help="Number of samples.")] = SAMPLE.num,
    length: Annotated[int, typer.Option(help="Tokens per sample.")] = SAMPLE.length,
    preset: Annotated[str | None, typer.Option(help="The references' headline knobs in one flag: "
                                                    + ", ".join(PRESETS) + " (a flag given explicitly wins; "
                                                    "docs/method.md lists each).")] = None,
    steps: Annotated[int | None, typer.Option("--steps", help=f"Denoiser budget (default {knob_default('steps')}"
                                                              + "".join(f"; {n} {c.steps}" for n, c in SAMPLERS.items()
                                                                        if c.steps not in (None, knob_default("steps")))
                                                              + "; roar and ltr one token per step).")] = None,
    top_p: Annotated[float | None, typer.Option(help="Nucleus threshold in (0, 1]." + _default("top_p"))] = None,
    top_p_rule: Annotated[str | None, typer.Option(help="hf: keep the token that crosses top-p (transformers); "
                                                        "remdm: drop it (the MDLM/ReMDM code)."
                                                        + _default("top_p_rule"))] = None,
    final_argmax: Annotated[bool | None, typer.Option("--final-argmax/--no-final-argmax", help="Masked samplers: "
                                                      "stop the time grid at 1e-5 and give what is still masked "
                                                      "its argmax in one more call, as the MDLM/ReMDM code."
                                                      + _default("final_argmax"))] = None,
    per_step: Annotated[int | None, typer.Option(help="roar: tokens revealed per step.")] = None,
    eta: Annotated[float | None, typer.Option(help="remdm-rescale and remdm-loop remasking rate."
                                                   + _default("eta"))] = None,
    eta_cap: Annotated[float | None, typer.Option(help="remdm-cap's cap." + _default("eta_cap"))] = None,
    t_on: Annotated[float | None, typer.Option(help="remdm-loop: time the loop starts." + _default("t_on"))] = None,
    t_off: Annotated[float | None, typer.Option(help="remdm-loop: time the loop ends." + _default("t_off"))] = None,
    alpha_on: Annotated[float | None, typer.Option(help="remdm-loop: share revealed during the loop."
                                                        + _default("alpha_on"))] = None,
    switch_snr: Annotated[float | None, typer.Option(help="hybrid: SNR where the continuous stage stops."
                                                          + _default("switch_snr"))] = None,
    continuous_steps: Annotated[int | None, typer.Option(help="hybrid: steps of the continuous stage "
                                                              "[default: half of --steps].")] = None,
    confidence: Annotated[float | None, typer.Option(help="hybrid: posterior probability a token needs to be "
                                                          "committed." + _default("confidence"))] = None,
    finisher: Annotated[str, typer.Option(help="hybrid: the masked sampler that finishes (" + ", ".join(FINISHERS)
                                               + ").")] = SAMPLE.finisher,
    decode: Annotated[str, typer.Option(help="Bridges: " + "; ".join(f"{k}: {v}" for k, v in DECODES.items())
                                             + ".")] = SAMPLE.decode,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="The folder samples.jsonl goes into (default: "
                                                                  "MODEL/samples/SET, SET being the sampler and the "
                                                                  "settings given, e.g. mdlm-steps-32).")] = None,
    seed: Seed = SAMPLE.seed, device: Device = "auto",
    force: Force = False,
):
    """Generate text with any sampler from a checkpoint or a causal LM → samples.jsonl (its path
    is printed, with -q alone)."""

    settings = SampleSettings(num=num, length=length, steps=steps, top_p=top_p, top_p_rule=top_p_rule,
                              per_step=per_step, eta=eta, eta_cap=eta_cap, t_on=t_on, t_off=t_off, alpha_on=alpha_on,
                              switch_snr=switch_snr, continuous_steps=continuous_steps, confidence=confidence,
                              final_argmax=final_argmax, finisher=finisher, preset=preset, decode=decode, seed=seed)
    result = generate(model, sampler, settings, out, device, force)
    show(result, lambda: _print_samples(result), quiet=result["meta"]["file"])


def _print_samples(result: dict) -> None:

    rows, meta = result["samples"], result["meta"]
    for row in rows[:4]:
        print(row["text"][:200].replace("\n", " "))
    print_table(f"{len(rows)} samples → {meta['file']}", ["key", "value"],
                [[k, meta.get(k)] for k in ("sampler", "preset", "steps", "nfe", "nfe_per_sample", "skipped_calls", "seconds",
                                                 "tokens_per_second")])


@app.command(epilog="Examples:\n\n  geoprobe nll --model runs/dsl --corpus held-out.txt\n\n"
                    "  geoprobe nll --model runs/dsl --corpus kjv --estimators mdlm,roar --max-seqs 16")
def nll(
    model: Annotated[Path, typer.Option("--model", help="A DSL checkpoint directory.")],
    corpus: Corpus = "kjv",
    seq_len: SeqLen = NLL.seq_len,
    max_seqs: Annotated[int, typer.Option(min=1, help="Held-out sequences to score.")] = NLL.max_seqs,
    estimators: Annotated[str | None, typer.Option(help="Comma list of " + ", ".join(ESTIMATORS)
                                                        + " (default: all).")] = None,
    batch_size: BatchSize = NLL.batch_size, seed: Seed = NLL.seed, device: Device = NLL.device,
    split: Annotated[str, typer.Option(help="Text8 files: the split to score (train, validation or test: the "
                                            "90/5/5% character ranges).")] = NLL.split,
):
    """Bits per token (and per character) of held-out text under a DSL checkpoint. Given a
    Text8 file (one line of a-z and spaces) it follows the Text8 protocol: a `--tokenizer char`
    model, the 90/5/5% split, sequences of 256 characters, bits per character."""

    result = corpus_nll(model, corpus, seq_len, max_seqs, estimators, batch_size, seed, device, split)
    show(result, lambda: print_table(f"nll of {corpus} under {model}", ["key", "value"],
                                     [[k, v] for k, v in result.items()]))
