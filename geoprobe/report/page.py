"""report.md: one page per run directory with everything the other commands wrote (model,
corpus, ranking, sweep, matched-budget comparison, steps curve), their settings and plots."""

from __future__ import annotations

import json
from pathlib import Path

from geoprobe.report.compare import markdown_table, read_rows


def write_report(run: Path) -> Path:
    """report.md of a run directory: everything the other commands wrote, with its settings."""
    from geoprobe.store import read_manifest

    run = Path(run)
    manifest = read_manifest(run)
    parts = [f"# geoprobe report: {manifest['model']['spec']}", "",
             f"- corpus: `{manifest['config']['corpus']}`, {manifest.get('rows')} states per layer, "
             f"layers {manifest['layers'][0]}..{manifest['layers'][-1]}, seq_len {manifest['config']['seq_len']}, "
             f"seed {manifest['config']['seed']}",
             f"- model: {manifest['model'].get('architecture')}, config sha256 "
             f"`{manifest['model']['config_sha256'][:16]}…`, dtype {manifest['model'].get('dtype')}"]
    model = manifest["model"]
    if "entropy_rate" in model:  # the trained testbed records how close it is to the true distribution
        parts.append(f"- testbed fit: held-out NLL {model['model_nll']:.3f} nats/word against the HMM's entropy rate "
                     f"{model['entropy_rate']:.3f} (+{model['model_nll'] / model['entropy_rate'] - 1:.1%}); the "
                     f"best unigram model reaches {model['unigram_nll']:.3f} and the best bigram model "
                     f"{model['bigram_nll']:.3f}")
    parts.append("")
    if (run / "ranking.md").is_file():
        geometry = json.loads((run / "geometry.json").read_text())
        parts += ["## Geometry and ranking", "", f"Settings: `{json.dumps(geometry['settings'])}`", "",
                  (run / "ranking.md").read_text().split("\n", 2)[2], "", "![geometry](plots/geometry.png)", ""]
    if (run / "sweep.json").is_file():
        from geoprobe.report.sweep import sweep_section

        parts += sweep_section(json.loads((run / "sweep.json").read_text()))
    if (run / "compare.md").is_file():
        rows = read_rows(run / "compare.csv")
        corpus = manifest["config"]["corpus"]
        samples = min((r["samples"] for r in rows if r.get("samples")), default=0)
        parts += ["## Generation", "", "`train_tokens` is each model's budget (for bridges, the step cap), "
                  "`used_tokens` what it trained on before it stopped. `oracle_nll_per_word` is the exact NLL of "
                  "the samples under the true HMM (synthetic corpora only; `oracle_invalid` counts samples holding a "
                  "word the HMM cannot emit, left out of it)." + (
                      f" MAUVE on {samples:.0f} samples per generator is biased upwards and too noisy to rank "
                      "generators (mauve-text's authors use thousands); read it as a sanity check only."
                      if samples < 1000 else ""), "",
                  (run / "compare.md").read_text().split("\n", 2)[2], ""]
        parts += generation_prose(rows)
        if corpus.startswith("synthetic:") and any(r.get("oracle_nll_per_word") is not None for r in rows):
            from geoprobe.synthetic import hmm_from_spec, reference_sample_scores

            hmm = hmm_from_spec(corpus)
            length = int(min((r["steps"] for r in rows if "AR ceiling" in r["generator"]), default=32))
            ref = reference_sample_scores(hmm, length)
            parts += [f"Reference points for `oracle_nll_per_word` ({length}-word samples): the HMM's own samples "
                      f"score {ref['hmm']:.3f} nats/word (its entropy rate is {hmm.entropy_rate():.3f}), samples of "
                      f"the best bigram model {ref['bigram']:.3f}, of the best unigram model {ref['unigram']:.3f}.", ""]
        parts += ["![compare](plots/compare.png)", ""]
    if (run / "steps.csv").is_file():
        curve = read_rows(run / "steps.csv")
        columns = ["generator", "sampler", "steps", "nfe", "seconds_per_sample", "evaluator", "gen_ppl", "mauve"]
        columns += ["oracle_nll_per_word", "oracle_nll_lo", "oracle_nll_hi"] * any(r.get("oracle_nll_per_word") is not None for r in curve)
        parts += ["## Quality against sampling steps", "", markdown_table(curve, columns), "",
                  "![steps](plots/steps.png)", ""]
    path = run / "report.md"
    path.write_text("\n".join(parts) + "\n")
    return path


def generation_prose(rows: list[dict]) -> list[str]:
    """What the comparison table allows one to say: the evaluator, which rows are scored by their
    own backbone, and which rows differ beyond their 95% intervals (the others are not ranked)."""
    from geoprobe.report.compare import distinguishable

    lines = []
    evaluators = sorted({r["evaluator"] for r in rows if r.get("evaluator")})
    if evaluators:
        lines.append(f"Gen.PPL is scored by {', '.join(f'`{e}`' for e in evaluators)}; the intervals are 95% "
                     "bootstrap intervals over each row's samples.")
    own = [f"{r['generator']} · {r['sampler']}" for r in rows if r.get("own_evaluator")]
    if own:
        lines.append(f"Warning: the evaluator is the generator's own backbone for {', '.join(own)}: their Gen.PPL "
                     "measures agreement with the evaluator itself, not quality; compare them by the other "
                     "metrics.")
    for key, label in (("oracle_nll", "the exact HMM NLL"), ("gen_ppl", "Gen.PPL")):
        # a row scored by its own backbone is not ranked by that backbone's Gen.PPL
        pairs, compared = distinguishable([r for r in rows if key != "gen_ppl" or not r.get("own_evaluator")], key)
        if not compared:
            continue
        if not pairs:
            lines.append(f"By {label}, no two rows' intervals are disjoint: the rows are not ranked against each other.")
            continue
        shown = "; ".join(f"{a['generator']} · {a['sampler']} < {b['generator']} · {b['sampler']}" for a, b in pairs[:12])
        more = f" (and {len(pairs) - 12} more)" if len(pairs) > 12 else ""
        lines.append(f"By {label} (lower is better), {len(pairs)} of {compared} pairs of rows differ beyond their "
                     f"intervals (95% each, not corrected for the number of pairs: descriptive): {shown}{more}. "
                     "Every other pair overlaps and is not ranked.")
    return [" ".join(lines), ""] if lines else []
