"""`geoprobe eval SAMPLES.jsonl … --evaluator M --references SRC` → metrics.json and a table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from geoprobe.cli.app import app
from geoprobe.cli.output import show
from geoprobe.cli.options import Device, Seed, state
from geoprobe.errors import BadInput

MAUVE_MIN_SAMPLES = 1000


def read_samples(path: Path) -> list[str]:
    if not path.is_file():
        raise BadInput(f"samples file not found: {path}")
    from geoprobe.corpus import iter_jsonl

    texts = []
    for number, row in iter_jsonl(path):
        if not isinstance(row.get("text"), str):
            raise BadInput(f"{path}:{number}: a sample row needs a string field 'text'")
        texts.append(row["text"])
    if not texts:
        raise BadInput(f"samples file {path} is empty")
    return texts


def references_like(spec: str, samples: list[str], seed: int) -> list[str]:
    """Held-out reference texts cut to the samples' median length in words."""
    import numpy as np

    from geoprobe.corpus import read_documents

    docs = read_documents(spec)
    words = int(np.median([len(t.split()) for t in samples]))
    pieces = []
    for doc in docs:
        tokens = doc.split()
        pieces += [" ".join(tokens[i:i + words]) for i in range(0, len(tokens) - words + 1, words)]
    order = np.random.default_rng(seed).permutation(len(pieces))
    return [pieces[i] for i in order]


@app.command("eval", epilog="Examples:\n\n"
             "  geoprobe eval runs/dsl/samples.jsonl --evaluator builtin:smollm2 --references kjv\n\n"
             "  geoprobe eval a.jsonl b.jsonl --evaluator ./gpt2-large --references held-out.txt --out metrics.json")
def evaluate(
    samples: Annotated[list[Path], typer.Argument(help="samples.jsonl files (rows with a 'text' field).")],
    evaluator: Annotated[str, typer.Option(help="Causal LM for Gen.PPL and MAUVE features (any model geoprobe "
                                                "loads).")] = "builtin:smollm2",
    references: Annotated[str | None, typer.Option(help="Reference corpus for MAUVE (and the HMM for "
                                                        "synthetic:hmm).")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="One file for all the metrics (default: "
                                                                  "SAMPLES.metrics.json beside each file).")] = None,
    seed: Seed = 0, device: Device = "auto",
):
    """Gen.PPL, diversity, entropy, repetition, MAUVE (and oracle NLL on synthetic corpora)."""
    from geoprobe.backbone import load_backbone
    from geoprobe.corpus import check_source
    from geoprobe.metrics.evaluator import features, mauve_score, score
    from geoprobe.store import check_writable
    from geoprobe.metrics.text import text_metrics
    from geoprobe.report.terminal import console

    sets = {str(p): read_samples(p) for p in samples}  # every file is checked before any model loads
    if references is not None:
        check_source(references)
    if out is not None:
        check_writable(out.parent)
    backbone = load_backbone(evaluator, device=device)
    results, reference_features = {}, {}
    oracle = None
    if references is not None and references.startswith("synthetic:"):  # one HMM and one entropy rate per call
        from geoprobe.synthetic import hmm_from_spec, oracle_scores

        oracle = hmm_from_spec(references)
        entropy_rate = oracle.entropy_rate()
    for name, texts in sets.items():
        ppl, feats = score(backbone, texts)
        row = {"samples": len(texts), **text_metrics(texts), **ppl}
        if references is not None:
            refs = references_like(references, texts, seed)
            if len(refs) < len(texts):
                raise BadInput(f"MAUVE needs at least as many references as samples: {len(refs)} references "
                               f"of the samples' length from {references}, {len(texts)} samples")
            if len(texts) < MAUVE_MIN_SAMPLES and not state.quiet:
                console.print(f"warning: MAUVE on {len(texts)} samples (< {MAUVE_MIN_SAMPLES}) is biased upwards")
            key = tuple(refs[: len(texts)])  # files of the same length share their references: one pass
            if key not in reference_features:
                reference_features[key] = features(backbone, list(key))
            row.update(mauve_score(feats, reference_features[key]))
            if oracle is not None:
                row.update(oracle_scores(oracle, texts), oracle_entropy_rate=entropy_rate)
        results[name] = row
    header = {"evaluator": evaluator, "references": references, "seed": seed}
    if out is not None:
        out.write_text(json.dumps({**header, "results": results}, indent=2))
    else:  # each beside its samples file (never the checkpoint's own metrics.json)
        for name, row in results.items():
            Path(name).with_suffix(".metrics.json").write_text(json.dumps({**header, "results": {name: row}}, indent=2))
    target = out or Path(samples[0]).with_suffix(".metrics.json")
    keys = ["samples", "gen_ppl", "diversity", "unigram_entropy", "rep_4", "mauve", "mauve_std", "oracle_nll_per_word"]
    present = [k for k in keys if any(k in r for r in results.values())]
    from geoprobe.report.terminal import print_table

    show(results, lambda: print_table(f"metrics → {target}", ["file", *present],
                                      [[Path(n).name, *[r.get(k, "") for k in present]] for n, r in results.items()]))
