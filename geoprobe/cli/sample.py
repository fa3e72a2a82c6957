"""`geoprobe sample` (any generator) and `geoprobe nll` (a DSL model's held-out bits)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from geoprobe.bridges.hidden import DECODES
from geoprobe.bridges.likelihood import ESTIMATORS
from geoprobe.cli.options import BatchSize, Corpus, Device, Force, Seed, SeqLen, choices, defaults_of, plain, with_settings
from geoprobe.cli.output import show
from geoprobe.cli.root import app
from geoprobe.report.terminal import print_table
from geoprobe.tokens import TEXT8_SPLITS
from geoprobe.workflows.generate import SampleSettings, corpus_nll, generate
from geoprobe.samplers import FINISHERS, NAMES, PRESETS, SAMPLERS, knob_default

NLL = defaults_of(corpus_nll)  # nll's flags default as the call does
Split = choices("Split", TEXT8_SPLITS)


def _default(knob: str) -> str:
    return f" (default: {knob_default(knob)})"


def _steps_help() -> str:
    others = "".join(f"; {n} {c.steps}" for n, c in SAMPLERS.items() if c.steps not in (None, knob_default("steps")))
    return f"Denoiser budget (default {knob_default('steps')}{others}; roar and ltr one token per step)."


# The flags that make a SampleSettings, each declared here once; their defaults are the class's
# own (None for a sampler knob: the preset's value, else the sampler class's default, shown here)
SETTINGS = {
    "num": Annotated[int, typer.Option(help="Number of samples.")],
    "length": Annotated[int, typer.Option(help="Tokens per sample.")],
    "batch": Annotated[int | None, typer.Option(help="Samples drawn together, at most (default: all of --num). A "
                                                "smaller batch fits a large vocabulary's logits in memory; one "
                                                "generator runs through the batches, so a --batch draws the same "
                                                "samples whatever memory the machine has. A killed --batch draw goes on "
                                                "from its last batch when rerun.")],
    "preset": Annotated[str | None, typer.Option(help="The references' headline knobs in one flag: " + ", ".join(PRESETS)
                                                 + " (an explicit flag wins; docs/method.md).")],
    "steps": Annotated[int | None, typer.Option("--steps", help=_steps_help())],
    "top_p": Annotated[float | None, typer.Option(help="Nucleus threshold in (0, 1]." + _default("top_p"))],
    "top_p_rule": Annotated[str | None, typer.Option(help="hf: keep the token that crosses top-p (transformers); "
                                                     "remdm: drop it (MDLM/ReMDM)." + _default("top_p_rule"))],
    "final_argmax": Annotated[bool | None, typer.Option("--final-argmax/--no-final-argmax", help="Masked samplers: "
                                                        "stop at t = 1e-5 and unmask the rest by argmax (MDLM/ReMDM)."
                                                        + _default("final_argmax"))],
    "per_step": Annotated[int | None, typer.Option(help="roar: tokens revealed per step.")],
    "eta": Annotated[float | None, typer.Option(help="remdm-rescale and remdm-loop remasking rate." + _default("eta"))],
    "eta_cap": Annotated[float | None, typer.Option(help="remdm-cap's cap." + _default("eta_cap"))],
    "t_on": Annotated[float | None, typer.Option(help="remdm-loop: time the loop starts." + _default("t_on"))],
    "t_off": Annotated[float | None, typer.Option(help="remdm-loop: time the loop ends." + _default("t_off"))],
    "alpha_on": Annotated[float | None, typer.Option(help="remdm-loop: share revealed during the loop."
                                                     + _default("alpha_on"))],
    "switch_snr": Annotated[float | None, typer.Option(help="hybrid: SNR where the continuous stage stops."
                                                       + _default("switch_snr"))],
    "continuous_steps": Annotated[int | None, typer.Option(help="hybrid: steps of the continuous stage (default: half "
                                                           "of --steps).")],
    "confidence": Annotated[float | None, typer.Option(help="hybrid: posterior probability a token needs to be "
                                                       "committed." + _default("confidence"))],
    "finisher": Annotated[choices("Finisher", FINISHERS), typer.Option(help="hybrid: the masked sampler that "
                                                                       "finishes.")],
    "decode": Annotated[choices("Decode", DECODES), typer.Option(help="Bridges: how states become tokens "
                                                                 "(docs/reference.md).")],
    "seed": Seed,
}


@app.command(epilog="Examples:\n\n  geoprobe sample --model runs/dsl --sampler roar --num 8 --length 128\n\n"
                    "  geoprobe sample --model runs/dsl --sampler hybrid --steps 48 --top-p 0.9 --out runs/dsl-hybrid\n\n"
                    "  geoprobe sample --model runs/dsl --sampler remdm-loop --steps 128 --eta 0.02\n\n"
                    "  geoprobe sample --model runs/dsl --sampler remdm-cap --preset remdm-paper   (T 1,024, top-p 0.9 "
                    "by ReMDM's rule, eta_cap 0.008, final argmax)")
@with_settings(SETTINGS, vars(SampleSettings()), SampleSettings)
def sample(
    *,
    model: Annotated[Path, typer.Option("--model", help="A DSL or baseline checkpoint directory, a bridge directory "
                                                        "(RUN/bridges/layer-NN or its seed-S), or with --sampler ar a "
                                                        "causal LM.")],
    sampler: Annotated[str, typer.Option(help=", ".join(NAMES) + " (ar: a causal LM itself, left to "
                                              "right).")] = "roar",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="The folder samples.jsonl goes into (default: "
                                                                  "MODEL/samples/SET, e.g. mdlm-steps-32).")] = None,
    device: Device = "auto", force: Force = False,
    settings: SampleSettings,
):
    """Generate text with any sampler from a checkpoint or a causal LM → samples.jsonl (its path
    is printed, with -q alone)."""

    result = generate(model, sampler, settings, out, device=device, force=force)
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
    *,
    model: Annotated[Path, typer.Option("--model", help="A DSL checkpoint directory.")],
    corpus: Corpus = "kjv",
    seq_len: SeqLen = NLL.seq_len,
    max_seqs: Annotated[int, typer.Option(min=1, help="Held-out sequences to score.")] = NLL.max_seqs,
    estimators: Annotated[str | None, typer.Option(help="Comma list of " + ", ".join(ESTIMATORS)
                                                        + " (default: all).")] = None,
    batch_size: BatchSize = NLL.batch_size, seed: Seed = NLL.seed, device: Device = NLL.device,
    split: Annotated[Split, typer.Option(help="Text8 files: the split to score (the 90/5/5% character "
                                              "ranges).")] = NLL.split,
):
    """Bits per token (and per character) of held-out text under a DSL checkpoint. Given a
    Text8 file (one line of a-z and spaces) it follows the Text8 protocol: a `--tokenizer char`
    model, the 90/5/5% split, sequences of 256 characters, bits per character."""

    result = corpus_nll(model, corpus, seq_len=seq_len, max_seqs=max_seqs, estimators=estimators,
                        batch_size=batch_size, seed=seed, device=device, split=plain(split))
    show(result, lambda: print_table(f"nll of {corpus} under {model}", ["key", "value"],
                                     [[k, v] for k, v in result.items()]))
