"""`geoprobe eval SAMPLES.jsonl … --evaluator M --references SRC` → metrics.json and a table."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from geoprobe.cli.options import Device, defaults_of
from geoprobe.cli.output import show
from geoprobe.cli.root import app
from geoprobe.report.terminal import print_table
from geoprobe.workflows.evaluate import evaluate_samples
from geoprobe.workflows.generate import sample_label

EVAL = defaults_of(evaluate_samples)  # eval's flags default as the call does


@app.command("eval", epilog="Examples:\n\n"
             "  geoprobe eval runs/dsl/samples/roar/samples.jsonl --evaluator builtin:smollm2 --references kjv\n\n"
             "  geoprobe eval a.jsonl b.jsonl --evaluator ./gpt2-large --references held-out.txt --out metrics.json\n\n"
             "  geoprobe eval runs/bridge/samples.jsonl --evaluator builtin:smollm2,ngram:kjv --references kjv")
def evaluate(
    *,
    samples: Annotated[list[Path], typer.Argument(help="samples.jsonl files (rows with a 'text' field; "
                                                              "'token_ids' give the token entropy).")],
    evaluator: Annotated[str, typer.Option(help="Causal LM for Gen.PPL and MAUVE features (any model geoprobe "
                                                "loads), or several separated by commas: each scores Gen.PPL, "
                                                "the first gives MAUVE's features. ngram:CORPUS after an LM: a "
                                                "Kneser-Ney trigram of CORPUS in that LM's tokens, an evaluator "
                                                "that is no generator's backbone.")] = "builtin:smollm2",
    references: Annotated[str | None, typer.Option(help="Reference corpus for MAUVE: its held-out documents "
                                                        "(5 %, split by --seed) as one token stream, cut to the "
                                                        "samples' length (and the HMM for synthetic:hmm).")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="One file for all the metrics (default: "
                                                                  "SAMPLES.metrics.json beside each file).")] = None,
    oracle_start: Annotated[str, typer.Option(help="synthetic:hmm only: where the HMM starts a sample: auto (from "
                                                   "how each generator's training rows began), document (a "
                                                   "document's first word), anywhere (a random word of a "
                                                   "document) or blocks:K (words 0, K, 2K, ...).")] = EVAL.oracle_start,
    gen_ppl_bos: Annotated[bool, typer.Option("--gen-ppl-bos", help="Prepend the evaluator's BOS and score each "
                                              "text's first token after it (geoprobe's Gen.PPL before 2026-12-06). "
                                              "Default: as the MDLM/ReMDM code, no BOS and the first token "
                                              "unscored.")] = EVAL.gen_ppl_bos,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Which held-out documents MAUVE's references come "
                                                            "from (the split of a generator trained at this seed) "
                                                            "and their order.")] = EVAL.seed,
    reference_features: Annotated[Path | None, typer.Option(help="A folder where MAUVE's reference features are "
                                                               "kept, named by what they depend on (the evaluator, "
                                                               "its dtype, the references' texts): a later eval of "
                                                               "the same references reads them instead of running "
                                                               "the evaluator over them again.")] = None,
    device: Device = EVAL.device,
):
    """Gen.PPL, diversity, word and token entropy, repetition, MAUVE (and oracle NLL on synthetic corpora)."""

    results, target = evaluate_samples(samples, evaluator, references, out, seed, device, oracle_start=oracle_start,
                                       gen_ppl_bos=gen_ppl_bos, reference_features=reference_features)
    names = next(iter(results.values()))["gen_ppl_by_evaluator"]
    keys = ["samples", "diversity_within", "diversity_pooled", "unigram_entropy", "token_entropy", "rep_4", "mauve",
            "mauve_std", "oracle_nll_per_word", "bigram_tv", "bigram_tv_hmm"]
    # the two entropies are different quantities: word entropy (unigram, whitespace words) and
    # token entropy (the generator's token ids, as ReMDM/DSL report it)
    labels = {"unigram_entropy": "word entropy", "token_entropy": "token entropy"}
    present = [k for k in keys if any(r.get(k) is not None for r in results.values())]
    head = ["generator · sample set", *[f"Gen.PPL ({n})" for n in names], *[labels.get(k, k) for k in present]]
    show(results, lambda: print_table(f"metrics → {target}", head,
                                      [[sample_label(Path(n)), *[r["gen_ppl_by_evaluator"][e] for e in names],
                                        *[r.get(k) if r.get(k) is not None else "" for k in present]]
                                       for n, r in results.items()]))
