"""report.md: one page per run directory with everything the other commands wrote (model,
corpus, ranking, sweep, matched-budget comparison, steps curve), their settings and plots."""

from __future__ import annotations

import json
import os
from pathlib import Path

from geoprobe.files import holding
from geoprobe.ranking import has_massive_channels, rank_layers
from geoprobe.store import read_manifest
from geoprobe.workflows.compare import distinguishable, markdown_table, read_rows


def write_report(run: Path) -> Path:
    """report.md of a run directory: everything the other commands wrote, with its settings."""

    run = Path(run)
    with holding(run, "geoprobe report"):
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
        sweep = json.loads((run / "sweep.json").read_text()) if (run / "sweep.json").is_file() else None
        statement = []
        if sweep:
            from geoprobe.verdict import current_statement  # scipy: only for a run that has a sweep

            statement = current_statement(sweep["verdict"])
        parts += [f"- sweep verdict: {statement[0]}"] if statement else []  # it opens the page; the section says why
        found, section = bridges_section(run) if not sweep else ([], [])  # a sweep's section covers its bridges
        parts += found
        parts.append("")
        if (run / "ranking.md").is_file():
            geometry = json.loads((run / "geometry.json").read_text())
            parts += ["## Geometry and ranking", "", f"Settings: `{json.dumps(geometry['settings'])}`", "",
                      (run / "ranking.md").read_text().split("\n", 2)[2], "", "![geometry](plots/geometry.png)", ""]
        if sweep:
            from geoprobe.workflows.sweep_page import sweep_section

            parts += sweep_section(sweep)
        parts += section
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
                length = int(min((r["steps"] for r in rows if "(AR)" in r["generator"]), default=32))
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


def bridges_section(run: Path) -> tuple[list[str], list[str]]:
    """(the page's opening lines, a section) for the bridges `geoprobe bridge` trained in a run
    outside a sweep: one line each of what was found (how it stopped, whether it learned more
    than its token lookup: geoprobe.verdict.bridge_lines), then a table of their losses."""
    records = []
    for path in sorted(Path(run).glob("bridges/layer-*/seed-*/metrics.json")):
        metrics = json.loads(path.read_text())
        records.append((path.parent, {**metrics, "layer": metrics.get("layer", int(path.parent.parent.name[6:]))}))
    if not records:
        return [], []
    from geoprobe.verdict import bridge_lines  # scipy: only for a run that has a bridge

    found = [f"- bridge at layer {m['layer']} ({folder.name}): {' '.join(bridge_lines(m)) or 'trained.'}"
             for folder, m in records]
    keys = ["layer", "seed", "stop", "steps_run", "best_step", "nmse_dim", "control_lookup_nmse_dim", "beats_lookup",
            "nmse", "delta_ce"]
    rows = [{**m, "seed": folder.name.removeprefix("seed-")} for folder, m in records]
    section = ["## Bridges", "", "Each bridge `geoprobe bridge` trained in this run (`bridges/layer-NN/seed-S`): "
               "`nmse_dim` is its per-channel reconstruction loss on the validation blocks, "
               "`control_lookup_nmse_dim` its token lookup's (a table of per-token mean states).", "",
               markdown_table(rows, keys), ""]
    return found, section


def generation_prose(rows: list[dict]) -> list[str]:
    """What the comparison table allows one to say: the evaluator, which rows are scored by their
    own backbone, and which rows differ beyond their 95% intervals (the others are not ranked)."""

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


def write_demo_report(out: Path, scan_run: Path, testbed_run: Path) -> tuple[Path, list[str]]:
    """`make demo`'s report.md: what was found, in plain lines first, then where each number is
    (the SmolLM2 scan's and the testbed's own reports, written here too). Returns (path, lines)."""
    out = Path(out)
    found = scan_findings(Path(scan_run)) + testbed_findings(Path(testbed_run))
    scan_page = os.path.relpath(write_report(scan_run), out)
    testbed_page = os.path.relpath(Path(testbed_run) / "report.md", out)
    parts = ["# geoprobe demo", "", "## What was found", "", *[f"- {line}" for line in found], "",
             "## Where every number is", "",
             f"- The SmolLM2 scan (both rankings, every proxy with its interval): [{scan_page}]({scan_page})",
             f"- The testbed experiment (sweep, generation table, plots): [{testbed_page}]({testbed_page})",
             "- The whole SmolLM2 pipeline (bridges per layer with seeds, DSL, generation) at a larger budget: "
             "`make results`, docs/results.md; DSL and the samplers trained to convergence on the testbed: "
             "`make results-testbed`, docs/testbed.md.", ""]
    path = out / "report.md"
    path.write_text("\n".join(parts) + "\n")
    return path, found


def scan_findings(run: Path) -> list[str]:
    """The scan in plain lines: which layer the score ranks first and how sure (P(first) over
    resamples of the documents), under both choices about massive channels, and the warning."""
    from geoprobe.pipeline import load_geometry

    geometry, manifest = load_geometry(run), read_manifest(run)
    choice = json.loads((run / "ranking.json").read_text())
    rankings = [rank_layers(geometry, choice["weights"], choice["log"])]
    if has_massive_channels(geometry):
        rankings.append(rank_layers(geometry, choice["weights"], choice["log"], other_channels=True))

    def first(ranking: dict) -> str:
        row = next(r for r in ranking["rows"] if r["layer"] == ranking["chosen_layer"])
        channels = "excluded" if ranking["drop_massive_channels"] else "kept"
        default = " (the default ranking)" if ranking is rankings[0] and len(rankings) > 1 else ""
        return (f"with massive channels {channels}{default}, layer {ranking['chosen_layer']} (P(first) = "
                f"{row['p_first']:.0%} over resamples of the documents)")

    layers = geometry["layers"]
    line = (f"{manifest['model']['spec']} on `{manifest['config']['corpus']}` ({manifest.get('rows'):,} states per "
            f"layer, layers {layers[0]['layer']}–{layers[-1]['layer']}): the geometry score ranks first "
            + "; ".join(first(r) for r in rankings) + ".")
    if len(rankings) == 2:
        same = rankings[0]["chosen_layer"] == rankings[1]["chosen_layer"]
        line += (" The choice about massive channels does not change the first layer." if same else
                 " The choice about massive channels changes which layer comes first: the ranking depends on it.")
    channels = [l for l in layers if l.get("massive_channels")]
    tokens = sum(l.get("massive") or 0 for l in layers)
    if not channels and not tokens:
        return [line]
    top = max(channels, key=lambda l: l["massive_channel_share"], default=None)
    parts = ([f"massive channels at {len(channels)} of {len(layers)} layers, carrying up to "
              f"{top['massive_channel_share']:.0%} of a layer's variance (layer {top['layer']})"] if channels else [])
    parts += [f"{tokens} massive-token states"] * bool(tokens)
    return [line, f"Massive activations: {' and '.join(parts)}; smollm2/report.md names them."]


def testbed_findings(run: Path) -> list[str]:
    """The testbed experiment in plain lines: the sweep's pre-registered verdict and its seed
    noise, bridges worse than the mean state said so, and the generation rows that differ beyond
    their intervals (the others not ranked)."""

    lines = []
    if (run / "sweep.json").is_file():
        from geoprobe.verdict import current_statement  # scipy: only for a run that has a sweep

        verdict = json.loads((run / "sweep.json").read_text())["verdict"]
        statement = current_statement(verdict)
        lines += [f"Testbed sweep: {s}" for s in statement[:1] + [s for s in statement if s.startswith("Seed noise")]]
        worse = [r["layer"] for r in verdict["layers"] if (r.get("nmse") or 0) >= 1]
        if worse:
            lines.append(f"Bridges at layers {', '.join(map(str, worse))} have a seed-mean nmse at or above 1: "
                         "worse than predicting the mean state.")
    if (run / "compare.csv").is_file():
        lines += key_comparisons(read_rows(run / "compare.csv"))
    return lines


def key_comparisons(rows: list[dict]) -> list[str]:
    """The comparisons the demo is about, by the exact HMM NLL per word with 95% intervals: each
    said to differ only where the intervals are disjoint."""
    def find(test) -> dict | None:
        have = [r for r in rows if test(r) and r.get("oracle_nll_lo") is not None]
        return min(have, key=lambda r: r["oracle_nll_per_word"], default=None)

    def show(r: dict) -> str:
        return (f"{r['generator']} · {r['sampler']} {r['oracle_nll_per_word']:.2f} "
                f"[{r['oracle_nll_lo']:.2f}, {r['oracle_nll_hi']:.2f}]")

    pairs = [("the best DSL row vs MDLM", lambda r: r["generator"].endswith("/dsl"),
              lambda r: r["generator"].endswith("/mdlm")),
             ("the best bridge (hidden state) vs rounding to the nearest embedding",
              lambda r: "bridges/" in r["generator"] and "(round)" not in r["generator"],
              lambda r: "(round)" in r["generator"]),
             ("a bridge decoded left to right vs in random order (hybrid)", lambda r: r["sampler"] == "ltr",
              lambda r: "bridges/" in r["generator"] and r["sampler"] == "hybrid"),
             ("the AR ceiling vs the best diffusion row", lambda r: "(AR)" in r["generator"],
              lambda r: "(AR)" not in r["generator"])]
    lines = []
    for label, a_test, b_test in pairs:
        a, b = find(a_test), find(b_test)
        if a is None or b is None:
            continue
        if a["oracle_nll_hi"] < b["oracle_nll_lo"] or b["oracle_nll_hi"] < a["oracle_nll_lo"]:
            better = a if a["oracle_nll_per_word"] < b["oracle_nll_per_word"] else b
            verdict = f"{better['generator']} · {better['sampler']} is more likely under the true HMM, beyond the intervals"
        else:
            verdict = "the intervals overlap: not ranked"
        lines.append(f"Testbed generation, {label} (exact HMM NLL per word, 95% intervals over samples): "
                     f"{show(a)} vs {show(b)}: {verdict}.")
    if lines:
        lines.append("These intervals are over the samples of one trained model per row (the best of several rows "
                     "where a row is picked as best): they leave out the spread between training seeds, which "
                     "docs/testbed.md measures with three seeds at convergence.")
    return lines
