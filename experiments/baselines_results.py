"""The DiHAL comparison on the testbed's exact likelihood: docs/baselines.md's protocol, run.

    make results-baselines     # = python -m experiments.baselines_results --out runs/baselines --page docs/baselines.md
    make results-baselines-3   # = python -m experiments.baselines_results --run 3 --out runs/baselines-3

Resumable: every model, the scan, the sweep and every sample set is a folder a rerun reuses (a
model with metrics.json is done, a sample set with scores.json is done). Stages:

1. the trainable rows, SEEDS each, under one cap of 4,000 steps x 32 rows x 65 tokens (8.32 M
   tokens) and one stopping rule (the EMA weights scored every 50 steps; from step 300, stop when
   the last 20 % improved by less than 0.5 %; the best weights kept): DSL and MDLM (as
   docs/testbed.md trains them), Diffusion-LM, SED and CoDAR (`geoprobe baseline train`), and the
   testbed's bridges at layers 0-5 (a scan as the tiny demo's, then the sweep with the same rows,
   cap and rule);
2. 32 samples of 64 words per row and seed at 32 denoiser evaluations (the primary budget) and 64
   (described only), each row with the sampler the protocol fixed, scored by the exact HMM;
3. the page: the protocol's primary test and its six Holm-corrected secondaries, the table, the
   convergence of every row.
This is run 2 of the protocol (its revision of 2026-12-04): the bridges stop when their window
gained less than 0.5 % of the larger of their step-0 (token lookup) score and the window's start
score; run 1's results stay on the page. The bridges are run 2's kind, the deterministic
regression bridge (`--regression`), which the sweep's default no longer is.

`--run 3` runs the page's run 3 (its protocol of 2026-12-06): the same rule, cap and networks,
every row retrained in its own folder, and new rows: the chosen layer's bridges decoded left to
right (`ltr`), by the hybrid with the channel's evidence and without it (run 2's composition),
the worst layer's decoded left to right, and MDLM on MDLM's objective. It writes "Results of
run 3" below run 2's, with its own primary test (the left-to-right row against the three
baselines) and its eight Holm-corrected secondaries (`run3_tests`).
The page's protocol is written above the results in docs/baselines.md; this script fills in the
results and never edits the protocol.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from pathlib import Path

import numpy as np

from experiments.pages import cell, disjoint, mean_sd, p_value
from experiments.records import log
from experiments.testbed_results import (CORPUS, DOCUMENT, EVAL, MIN_STEPS, MODEL, NUM, PLATEAU, ROOT, SEEDS,
    SEQ_LEN, SMALL, TRAINING, held_out_bound, machine, score_samples, train_variant)

BASELINES = ("diffusion-lm", "sed", "codar")
# the rows trained apart (trained_rows), each with a training record per seed: {row: (model folder, sampler, decode)}
TRAINED = {"dsl": ("dsl", "hybrid", "stack"), "mdlm": ("mdlm", "mdlm", "stack"),
           **{k: (k, "ancestral", "stack") for k in BASELINES}}
CAP = 4000  # steps of 32 x 65 tokens: 8.32 M tokens, every trainable row's cap
BUDGETS = (32, 64)  # denoiser evaluations: the primary, and one described beside it
BRIDGE_LAYERS = "0-5"
RESULTS_HEADING = "## Results of run 2"  # run 1's section stays above it (docs/baselines.md's revision of 2026-12-04)
# run 1 (this page's section above it), which run 2 is read beside: the steps per seed (every one
# stopped by its plateau) and the seed-mean NLL per word at 32 evaluations of the rows run 2 retrains
# under their unchanged rule, which it should reproduce, and the primary test's p-values
RUN1_STEPS = {"dsl": [1900, 1950, 1250], "mdlm": [1150, 1350, 1000], "diffusion-lm": [2700, 3400, 3250],
              "sed": [1850, 1250, 1450], "codar": [1450, 1500, 1450]}
RUN1_NLL = {"dsl": 3.95, "mdlm": 4.06, "diffusion-lm": 4.78, "sed": 4.62, "codar": 4.87}
RUN1_P = {"diffusion-lm": 0.000834, "sed": 0.00131, "codar": 0.000207}
# run 3 (docs/baselines.md, protocol of 2026-12-06): its rows through the sweep's bridges, as
# {row: (the sweep's role, sampler, decode)}; the left-to-right chosen row is the primary one
RUN3_HEADING = "## Results of run 3"
LTR = "bridge-chosen-ltr"
RUN3_BRIDGES = {LTR: ("chosen", "ltr", "stack"), "bridge-chosen-hybrid": ("chosen", "hybrid", "stack"),
                "bridge-chosen-stack-only": ("chosen", "hybrid", "stack-only"),
                "bridge-worst-ltr": ("worst", "ltr", "stack")}
# run 2's figures that run 3's unchanged rows should reproduce (its section above): steps per seed
# and seed-mean NLL per word at 32 evaluations; `bridge-chosen-stack-only` is run 2's `bridge-chosen`
RUN2_STEPS = {**{k: v for k, v in RUN1_STEPS.items() if k != "mdlm"}, "bridge-chosen-stack-only": [1900, 2850, 1900]}
RUN2_NLL = {**{k: v for k, v in RUN1_NLL.items() if k != "mdlm"}, "bridge-chosen-stack-only": 3.92}
RUN2_P = {"diffusion-lm": 0.00184, "sed": 0.0000653, "codar": 0.0003}
RUN2_LAYERS = {"chosen": 4, "worst": 3}  # run 2's sweep: the geometry's choice and the highest seed-mean loss
RUN2_MDLM = "4.06 ± 0.05"  # run 2's `mdlm` (the legacy objective), seed mean ± sd at 32 evaluations


def train_baseline(out: Path, kind: str, seed: int, name: str | None = None, **changed) -> dict:
    """Train (or reuse) `kind`'s row under the protocol's settings in out/models/NAME-seedS; `changed`
    overrides a training or network setting by name (docs/baselines-sensitivity.md's variants)."""
    from geoprobe.bridges.embedding_diffusion import baseline_settings, fit_baseline

    folder = out / "models" / f"{name or kind}-seed{seed}"
    if (folder / "metrics.json").is_file():
        return json.loads((folder / "metrics.json").read_text())
    settings, shape = baseline_settings(kind, **{**TRAINING, "lr": 2e-3, **changed}, steps=CAP, seed=seed,
                                        d_model=SMALL["d_model"], n_layers=SMALL["n_layers"], n_heads=SMALL["n_heads"])
    began = time.perf_counter()
    metrics = fit_baseline(folder, kind, CORPUS, tokenizer=MODEL, settings=settings, shape=shape, device="cpu")
    log(f"trained {name or kind} seed {seed}: {metrics['steps_run']} steps ({metrics['stop']}), "
        f"{time.perf_counter() - began:.0f} s")
    return metrics


def bridges(out: Path) -> dict:
    """The testbed's scan (as the tiny demo's) and its sweep at layers 0-5 with the comparison's
    rows, cap and rule; returns sweep.json's verdict (the chosen, worst and oracle layers)."""
    from geoprobe.geometry import GeometrySettings
    from geoprobe.pipeline import scan, scan_config
    from geoprobe.workflows.demo import TINY
    from geoprobe.workflows.sweep import bridge_settings, sweep_run

    run, p = out / "run", TINY
    if not (run / "ranking.csv").is_file():
        scan(run, scan_config(MODEL, CORPUS, p.doc_blocks, tokens=p.tokens, seq_len=p.seq_len, positions=p.positions,
                              device="cpu"),
             GeometrySettings(k=p.k, anchors=p.anchors, pairs=p.pairs, bootstrap=p.bootstrap))
    if not (run / "sweep.json").is_file():
        settings = bridge_settings(steps=CAP, batch_size=TRAINING["batch_size"], seq_len=SEQ_LEN,
                                   d_model=SMALL["d_model"], n_layers=SMALL["n_layers"], lr=2e-3, eval_every=EVAL,
                                   plateau_rel=PLATEAU, min_steps=MIN_STEPS,
                                   plateau_scale="start",  # run 2: 0.5 % of max(step-0 (lookup), window start)
                                   regression=True)  # run 2's bridge and run 3's: the deterministic regression
        began = time.perf_counter()
        sweep_run(run, settings, BRIDGE_LAYERS, device="cpu", seeds=list(SEEDS), include_source=False)
        log(f"swept the bridges in {time.perf_counter() - began:.0f} s")
    return json.loads((run / "sweep.json").read_text())


def trained_rows(out: Path) -> dict:
    """{row: (model folder per seed, sampler, decode, words, oracle start)} of the rows trained
    apart (DSL, MDLM, the baselines), with the sampler the protocol fixed for each."""
    return {name: ({s: out / "models" / f"{m}-seed{s}" for s in SEEDS}, sampler, decode, SEQ_LEN, "document")
            for name, (m, sampler, decode) in TRAINED.items()}


def bridge_rows(out: Path, verdict: dict) -> dict:
    """The same for the sweep's bridges at its chosen, worst and oracle layers, and the layer-0
    bridge decoded by rounding; their samples are the words after a block's BOS."""
    from geoprobe.workflows.sweep import bridge_dir

    run, words = out / "run", SEQ_LEN - 1
    table = {f"bridge-{role}": ({s: bridge_dir(run, verdict[f"{role}_layer"], s) for s in SEEDS}, "hybrid", "stack",
                                words, f"blocks:{words}") for role in ("chosen", "worst", "oracle")}
    table["round-00"] = ({s: bridge_dir(run, 0, s) for s in SEEDS}, "mdlm", "round", words, f"blocks:{words}")
    return table


def sample_all(out: Path, table: dict, ar: bool = True) -> list[dict]:
    """Every row's sample sets, scored: at each of BUDGETS (the first is the primary), except `ltr`,
    whose one budget is an evaluation per word (its one set is its primary set), and the AR row."""
    results = []
    for name, (folders, sampler, decode, length, start) in table.items():
        budgets = (length,) if sampler == "ltr" else BUDGETS
        for seed, folder in folders.items():
            for budget in budgets:
                where = out / "samples" / f"{name}-seed{seed}" / f"{sampler}-{budget}"
                results.append({"row": name, "seed": seed, "evaluations": budget, "sampler": sampler,
                                "decode": decode, "primary": budget == budgets[0],
                                **score_samples(where, folder, sampler, budget, decode=decode, length=length,
                                                start=start)})
        log(f"sampled {name}")
    for seed in SEEDS if ar else ():  # the ceiling: the testbed itself, left to right
        results.append({"row": "ar", "seed": seed, "evaluations": SEQ_LEN, "sampler": "ar", "primary": True,
                        **score_ar(out / "samples" / "ar" / f"seed{seed}", seed)})
    return results


def is_primary(record: dict) -> bool:
    """Whether a scored set is its row's primary one (a record without the flag: at BUDGETS[0], or the AR row)."""
    return record.get("primary", record["evaluations"] == BUDGETS[0] or record["row"] == "ar")


def primary_values(samples: list[dict], row: str, metric: str) -> dict:
    """{training seed: value} of a row's primary sets."""
    return {r["seed"]: r.get(metric) for r in samples if r["row"] == row and is_primary(r)}


def score_ar(folder: Path, seed: int) -> dict:
    from geoprobe.metrics.text import text_metrics, token_metrics
    from geoprobe.synthetic import hmm_from_spec, oracle_scores
    from geoprobe.workflows.generate import SampleSettings, generate

    cached = folder / "scores.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    result = generate(Path(MODEL), "ar", SampleSettings(num=NUM, length=SEQ_LEN, seed=seed), folder, "cpu")
    texts, eos = [r["text"] for r in result["samples"]], result["meta"]["eos"]
    scores = {**oracle_scores(hmm_from_spec(CORPUS), texts, "document", DOCUMENT, eos), **text_metrics(texts, eos),
              **token_metrics([r["token_ids"] for r in result["samples"]]),
              "seconds_per_sample": result["meta"]["seconds"] / NUM, "nfe": SEQ_LEN, "nfe_per_sample": SEQ_LEN}
    cached.write_text(json.dumps(scores))
    return scores


def training_record(out: Path, table: dict) -> dict:
    """{row: [(steps run, stop, tokens used) per seed]} of the trainable rows."""
    record = {}
    for name, (folders, *_rest) in table.items():
        if name == "round-00":
            continue
        per_seed = []
        for seed, folder in folders.items():
            metrics = json.loads((Path(folder) / "metrics.json").read_text())
            budget = json.loads((Path(folder) / "config.json").read_text())["budget"]
            per_seed.append({"steps": metrics["steps_run"], "stop": metrics["stop"],
                             "tokens": metrics["steps_run"] * budget["batch_size"] * budget["seq_len"],
                             "train_seconds": metrics.get("train_seconds"), "folder": str(folder)})
        record[name] = per_seed
    return record


def flops_per_token(out: Path) -> dict:
    """Training FLOPs per token of each non-bridge row (torch.utils.flop_counter on one step's loss,
    forward and backward, at the comparison's batch): what a reader matching by FLOPs needs."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from geoprobe.bridges.dsl import load_dsl
    from geoprobe.bridges.embedding_diffusion import load_baseline
    from geoprobe.bridges.channel import draw_snr

    found = {}
    tokens = torch.randint(0, 100, (TRAINING["batch_size"], SEQ_LEN))
    for name in ("dsl", "mdlm", *BASELINES):
        folder = out / "models" / f"{name}-seed0"
        if not (folder / "metrics.json").is_file():
            continue
        with FlopCounterMode(display=False) as counter:
            if name in BASELINES:
                model = load_baseline(folder).train()
                loss = model.losses(tokens, model.draw(tokens, torch.Generator().manual_seed(0)))["loss"]
            else:
                model = load_dsl(folder).train()
                loss = model.loss(tokens, draw_snr("mixed", tokens.shape, torch.Generator().manual_seed(0)))
            loss.backward()
        found[name] = counter.get_total_flops() / tokens.numel()
    return found


def bridge_flops(out: Path, table: dict) -> dict:
    """The bridges' training FLOPs per token (one step of their objective, forward and backward, at
    the comparison's batch, counted as flops_per_token counts the others) for each bridge row, and
    "teacher": the FLOPs of the run's one teacher pass (the frozen prefix to the deepest swept
    layer over the training pool and the held-out blocks), shared by every bridge of the sweep."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from geoprobe.bridges.fit import draw_conditions, objective
    from geoprobe.bridges.hidden import Teacher, load_bridge
    from geoprobe.capture import capture
    from geoprobe.workflows.sweep import open_source

    source = open_source(out / "run", device="cpu")
    backbone, found, batch = source.backbone, {}, TRAINING["batch_size"]
    for name, (folders, *_rest) in table.items():  # round-00 has no training record, so no FLOP cell
        if not name.startswith("bridge-") or not (folders[SEEDS[0]] / "metrics.json").is_file():
            continue
        bridge, _ = load_bridge(folders[SEEDS[0]])
        bridge.train()
        g = torch.Generator().manual_seed(0)  # the same draws for every row (a noisy row costs the mixture)
        cfg, ids = bridge.cfg, bridge.support[torch.randint(0, len(bridge.support), (batch, SEQ_LEN), generator=g)]
        with FlopCounterMode(display=False) as counter:
            loss = objective(bridge, Teacher(backbone, cfg.layer), ids, torch.ones_like(ids),
                             torch.randn(batch, SEQ_LEN, cfg.hidden_size, generator=g),
                             draw_conditions(cfg, batch, SEQ_LEN, g))
            loss.backward()
        found[name] = counter.get_total_flops() / ids.numel()
    deepest = max(int(x) for x in BRIDGE_LAYERS.split("-"))
    ids = torch.randint(0, backbone.config.vocab_size, (1, SEQ_LEN), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        capture(backbone, ids, layers=tuple(range(deepest + 1)))
    pool = sum(len(b.tokens) for b in [*source.train_blocks, *source.stop_blocks, *source.val_blocks])
    found["teacher"] = counter.get_total_flops() / ids.numel() * pool
    return found


def budget_mark(spent: float, reference: float | None) -> str:
    """The protocol's mark for a row whose training FLOPs are more than 2x or less than 1/2 of `dsl`'s."""
    if not reference or reference / 2 <= spent <= 2 * reference:
        return ""
    return " (> 2× `dsl`'s)" if spent > reference else " (< ½ `dsl`'s)"


SPREAD = 1e-9  # nats/word: values closer than this are one value (float rounding), no spread to test with


def welch_less(a, b) -> float:
    """One-sided Welch p-value of H1: mean(a) < mean(b) (1 when either side has fewer than two
    values, or neither has any spread: then there is no test, and no rejection)."""
    from scipy import stats

    a, b = [v for v in a if v is not None and math.isfinite(v)], [v for v in b if v is not None and math.isfinite(v)]
    if len(a) < 2 or len(b) < 2 or np.ptp(a) + np.ptp(b) <= SPREAD:
        return 1.0
    return float(stats.ttest_ind(a, b, equal_var=False, alternative="less").pvalue)


def paired_less(a: dict, b: dict) -> float:
    """One-sided paired t p-value of H1: a < b over the seeds both {seed: value} hold (1 with
    fewer than two pairs, or pairs whose differences have no spread)."""
    from scipy import stats

    seeds = [s for s in a if s in b and all(v is not None and math.isfinite(v) for v in (a[s], b[s]))]
    if len(seeds) < 2 or np.ptp([a[s] - b[s] for s in seeds]) <= SPREAD:
        return 1.0
    return float(stats.ttest_rel([a[s] for s in seeds], [b[s] for s in seeds], alternative="less").pvalue)


def converged(name: str, training: dict, sweep: dict) -> bool:
    """Every seed of a row stopped by its plateau; a bridge also meets the sweep's criterion. A row
    this run trains (DSL, MDLM, the baselines, the bridges) without a training record has not converged; a row
    it does not train (the AR ceiling, the testbed itself) has nothing to converge."""
    bridge = name.startswith("bridge-")
    if not bridge and name not in TRAINED:
        return True
    stopped = bool(training.get(name)) and all(r["stop"] == "plateau" for r in training[name])
    return stopped and (not bridge or sweep["verdict"]["convergence"]["converged"])


def tests(samples: list[dict], training: dict, sweep: dict, hmm_diversity: float) -> tuple[dict, list]:
    from geoprobe.metrics.correlation import holm

    def values(row, metric, budget=BUDGETS[0]):
        return [r.get(metric) for r in samples if r["row"] == row and r["evaluations"] == budget]

    nll = lambda row: values(row, "oracle_nll_per_word")  # noqa: E731
    primary = {k: welch_less(nll("bridge-chosen"), nll(k)) for k in BASELINES}
    unconverged = [n for n in ("bridge-chosen", *BASELINES) if not converged(n, training, sweep)]
    if unconverged:
        outcome = "inconclusive"
    else:
        outcome = "supported" if all(p < 0.05 for p in primary.values()) else "not supported"
    best = min(BASELINES, key=lambda k: mean_sd(nll(k))[0] if nll(k) else math.inf)
    gap = lambda row: [abs(v - hmm_diversity) for v in values(row, "diversity_within") if v is not None]  # noqa: E731
    secondary = {**{f"bigram distance: bridge-chosen < {k}": welch_less(values("bridge-chosen", "bigram_tv"),
                                                                      values(k, "bigram_tv")) for k in BASELINES},
                 "NLL: bridge-chosen < bridge-worst": welch_less(nll("bridge-chosen"), nll("bridge-worst")),
                 f"NLL: dsl < the best baseline ({best})": welch_less(nll("dsl"), nll(best)),
                 f"diversity: bridge-chosen closer to the HMM's than {best}": welch_less(gap("bridge-chosen"),
                                                                                         gap(best))}
    adjusted = holm(secondary)
    return ({"outcome": outcome, "p": primary, "unconverged": unconverged, "best_baseline": best},
            [(k, secondary[k], adjusted[k]) for k in secondary])


def hmm_references(samples: list[dict]) -> tuple[dict, float]:
    """The HMM's own documents' text metrics (3 x NUM of them) and the samples' bigram-distance floor."""
    from geoprobe.metrics.text import text_metrics
    from geoprobe.synthetic import hmm_from_spec

    hmm = hmm_from_spec(CORPUS)
    truth = text_metrics([hmm.text(r) for r in hmm.sample_many(3 * NUM, SEQ_LEN - 1, np.random.default_rng(5))])
    return truth, float(np.mean([r["bigram_tv_hmm"] for r in samples if "bigram_tv_hmm" in r] or [math.nan]))


def training_minutes(training: dict, sweep: dict | None = None) -> tuple[float, int]:
    """(minutes, models): the training loops' time, each model counted once. Rows that decode one
    set of bridges in several ways share their folders; with `sweep`, every bridge of the sweep
    counts (its rows' train_seconds), those no row samples from too."""
    rows = (sweep or {}).get("rows")  # None: the sweep has not run, or its verdict alone is known
    seconds = {r.get("folder", f"{name}/{i}"): r["train_seconds"] or 0 for name, runs in training.items()
               for i, r in enumerate(runs) if rows is None or not name.startswith("bridge-")}
    bridges = [r.get("train_seconds") or 0 for r in rows or []]
    return (sum(seconds.values()) + sum(bridges)) / 60, len(seconds) + len(bridges)


def measured(target: str, training: dict, seconds: float, sweep: dict | None = None) -> str:
    minutes, models = training_minutes(training, sweep)
    return (f"Measured with `{target}` on {machine()}. The training loops of its {models} models took {minutes:.0f} "
            "min in all (each seed's seconds are in the table; a row trained while another job shared the cores, or "
            f"paused, took longer), and this invocation of the script {seconds / 60:.0f} min (a resumed run reuses "
            "what earlier invocations finished).")


PARTIAL = ("**Partial: the bridges' sweep has not run yet**, so the primary test and the secondaries, which compare "
           "the bridges, cannot be made. The rows trained so far, described only:")


def write_page(out: Path, page: Path, samples: list[dict], training: dict, sweep: dict, flops: dict,
               seconds: float) -> None:
    truth, floor = hmm_references(samples)
    parts = [RESULTS_HEADING, "", measured("make results-baselines", training, seconds, sweep), ""]
    parts += [reproduction(training, samples), ""]
    if sweep is None:
        parts += [PARTIAL, ""]
    else:
        parts += verdict_section(samples, training, sweep, truth["diversity_within"])
    parts += table_section(samples, training, sweep, flops, truth, floor)
    page.write_text(replace_section(page.read_text(), RESULTS_HEADING, parts))
    log(f"wrote {page}")


def replace_section(text: str, heading: str, lines: list[str]) -> str:
    """`text` with the section under the level-2 `heading` (up to the next level-2 heading) made
    `lines`; appended at the end where the page has no such section yet."""
    body = "\n".join(lines) + "\n"
    found = re.search(rf"^{re.escape(heading)}$", text, flags=re.M)
    if not found:
        return text.rstrip() + "\n\n" + body
    after = re.search(r"^## ", text[found.end():], flags=re.M)
    tail = "" if after is None else text[found.end() + after.start():]
    return text[:found.start()].rstrip() + "\n\n" + body + ("\n" if tail and not body.endswith("\n\n") else "") + tail


def reproduction(training: dict, samples: list[dict], steps_before: dict = RUN1_STEPS, nll_before: dict = RUN1_NLL,
                 run: str = "run 1") -> str:
    """Whether the rows retrained under their unchanged rule reproduce an earlier run's: steps and
    stop per seed, and the seed-mean NLL per word at the primary budget (to its two decimals)."""
    missing = [name for name in steps_before if name not in training]
    differ = []
    for name in (n for n in steps_before if n in training):
        steps, stops = [r["steps"] for r in training[name]], {r["stop"] for r in training[name]}
        nll = np.mean([r["oracle_nll_per_word"] for r in samples if r["row"] == name and is_primary(r)])
        if steps != steps_before[name] or stops != {"plateau"} or round(float(nll), 2) != nll_before[name]:
            differ.append(f"`{name}` steps {steps} ({', '.join(sorted(stops))}), NLL {nll:.3f}, against {run}'s "
                          f"{steps_before[name]} (plateau), {nll_before[name]:.2f}")
    line = f"{run.capitalize()}'s rows, retrained here under their unchanged rule: " + (
        f"every seed stopped by its plateau at {run}'s step, and every seed-mean NLL per word is {run}'s to its two "
        f"decimals." if not differ else f"they did not all reproduce {run}: " + "; ".join(differ) + ".")
    return line + (f" Not trained yet: {', '.join(missing)}." if missing else "")


def verdict_section(samples: list[dict], training: dict, sweep: dict, hmm_diversity: float) -> list[str]:
    primary, secondary = tests(samples, training, sweep, hmm_diversity)
    v = sweep["verdict"]
    words = {"supported": "**Supported**: the chosen-layer bridge's samples are more likely under the exact HMM than "
                          "every embedding baseline's (all three one-sided Welch tests reject at 0.05).",
             "not supported": "**Not supported**: the chosen-layer bridge's samples are not more likely under the "
                              "exact HMM than every embedding baseline's (at least one of the three one-sided Welch "
                              "tests does not reject at 0.05).",
             "inconclusive": "**Inconclusive**: a row the primary test compares did not converge by the protocol's "
                             f"rules ({', '.join(primary['unconverged'])}); its numbers are reported as "
                             "unconverged, not as evidence."}[primary["outcome"]]
    parts = ["**The primary test (DiHAL's claim).** " + words + " p-values (H1: the bridge's NLL per word is lower): "
             + ", ".join(f"{k} {p_value(p)}" for k, p in primary["p"].items()) + " (run 1, whose bridges all ran to the "
             "cap under the window rule: " + ", ".join(f"{k} {p_value(p)}" for k, p in RUN1_P.items()) + ").", "",
             f"The testbed's sweep chose layer {v['chosen_layer']} by geometry; its worst layer is {v['worst_layer']}, "
             f"its oracle layer (the lowest seed-mean loss) {v['oracle_layer']}. Its convergence: "
             f"{'; '.join(v['convergence'].get('reasons') or []) or 'converged'}.", "",
             "**The secondaries** (one-sided Welch, Holm over all six; a test that could not run counts as not "
             "rejected):", ""]
    parts += [f"- {k}: p = {p_value(p)}, Holm-adjusted {p_value(a)}: {'rejects' if a < 0.05 else 'does not reject'}."
              for k, p, a in secondary]
    return parts + [""]


def table_section(samples: list[dict], training: dict, sweep: dict | None, flops: dict, truth: dict,
                  floor: float, *, title: str = "The table",
                  compared: tuple = ("bridge-chosen", *BASELINES, "dsl", "mdlm")) -> list[str]:
    """The seed table of every row's primary sets, the 64-evaluation line, the pairs beyond the
    seed spread among `compared`, and the budget note."""
    rows = list(dict.fromkeys(r["row"] for r in samples))
    spread = "so the spread is the training seeds'" + (
        ": `round-00`'s three layer-0 bridges are the same exact lookup of the embeddings (nmse_dim ≈ 10⁻¹⁵, best "
        "weights at step 0), hence its sd of 0." if "round-00" in rows else ".")
    ltr = (" The `ltr` rows have one set per seed, at one evaluation per word; their cells are that set's."
           if any(r["sampler"] == "ltr" for r in samples) else "")
    parts = [f"### {title} ({BUDGETS[0]} denoiser evaluations{', `ltr` one a word' if ltr else ''}; mean ± sd over "
             f"seeds {', '.join(map(str, SEEDS))})",
             "", f"{NUM} samples of {SEQ_LEN - 1} words per row and seed. The HMM's own documents: diversity "
             f"{truth['diversity_within']:.3f}, unigram entropy {truth['unigram_entropy']:.2f} nats per sample; "
             f"the bigram distance's finite-sample floor {floor:.3f}. Every model's samples are drawn with sampling "
             f"seed 0 (common random numbers across training seeds; the AR row samples with seeds 0, 1, 2), {spread}"
             f"{ltr}", "",
             "| row | sampler | steps run (stop, training seconds) per seed | training tokens | training GFLOP (fwd+bwd) | oracle NLL, "
             "nats/word | bigram TV | diversity | unigram entropy | s/sample | NFE |",
             "|---|---|---|---|---|---|---|---|---|---|---|", *table_lines(samples, training, sweep, flops)]

    def nll(row, pick=is_primary):
        return [r.get("oracle_nll_per_word") for r in samples if r["row"] == row and pick(r)]

    def described(r):
        return r["evaluations"] == BUDGETS[1] and not is_primary(r)

    parts += ["", f"At {BUDGETS[1]} evaluations (described, not tested): "
              + "; ".join(f"`{row}` {cell(nll(row, described), 2)}" for row in rows
                          if any(described(r) for r in samples if r["row"] == row)) + " nats/word.", ""]
    seeds = {row: nll(row) for row in compared if row in rows}
    apart = [f"`{a}` vs `{b}`" for i, a in enumerate(seeds) for b in list(seeds)[i + 1:]
             if disjoint(seeds[a], seeds[b])]
    parts += ["Pairs whose NLL seed intervals (mean ± sd) do not overlap: " + (", ".join(apart) or "none") + "; "
              "the others are within noise and not ranked.", "",
              "Training FLOPs are the seed-mean tokens used times one step's FLOPs per token (forward and backward, "
              "torch.utils.flop_counter); a row more than 2× or less than ½ of `dsl`'s is marked (the protocol's "
              "2× rule, taken against `dsl`, the row whose budget testbed.md set). "
              + (f"The bridges' one teacher pass (the frozen prefix to layer {BRIDGE_LAYERS.split('-')[-1]} over "
                 f"their training pool and held-out blocks, shared by every bridge of the sweep) "
                 f"adds {flops['teacher'] / 1e9:,.2f} GFLOP, not in their cells. " if "teacher" in flops else "")
              + f"The bridges{' and `round-00`' if 'round-00' in rows else ''} train at the same rows and cap as the "
              "others; their plateau threshold is run 2's (0.5 % of the larger of the step-0 score and the window's "
              "start score).", ""]
    return parts


def table_lines(samples: list[dict], training: dict, sweep: dict | None, flops: dict) -> list[str]:
    """One table line per row: its training per seed, tokens, FLOPs and its primary sets' cells."""
    def metric(row, key, digits=3):
        return cell([r.get(key) for r in samples if r["row"] == row and is_primary(r)], digits)

    reference = (flops["dsl"] * np.mean([r["tokens"] for r in training["dsl"]])
                 if "dsl" in flops and training.get("dsl") else None)
    lines = []
    for row in dict.fromkeys(r["row"] for r in samples):
        runs = training.get(row, [])
        steps = ", ".join(f"{r['steps']} ({r['stop']}, {r['train_seconds']:.0f} s)" if r.get("train_seconds") else
                          f"{r['steps']} ({r['stop']})" for r in runs) or "—"
        tokens = f"{np.mean([r['tokens'] for r in runs]) / 1e6:.2f} M" if runs else "—"
        spent = flops[row] * np.mean([r["tokens"] for r in runs]) if row in flops and runs else None
        flop = "—" if spent is None else f"{spent / 1e9:,.0f}" + budget_mark(spent, reference)
        first = next(r for r in samples if r["row"] == row)
        sampler = first["sampler"] + (f", --decode {first['decode']}" if first.get("decode") == "stack-only" else "")
        mark = "" if sweep is None and row.startswith(("bridge", "round")) or converged(row, training, sweep) \
            else " (unconverged)"
        lines.append(f"| `{row}`{mark} | {sampler} | {steps} | {tokens} | {flop} | "
                     f"{metric(row, 'oracle_nll_per_word', 2)} | {metric(row, 'bigram_tv')} | "
                     f"{metric(row, 'diversity_within')} | {metric(row, 'unigram_entropy', 2)} | "
                     f"{metric(row, 'seconds_per_sample', 3)} | {metric(row, 'nfe_per_sample', 0)} |")
    return lines


def run(out: Path, page: Path, number: int = 2) -> None:
    """Run `number` (2 or 3) of the protocol into `out`, resumably, writing its results section of `page`."""
    rows_of, write = (bridge_rows, write_page) if number == 2 else (run3_rows, write_run3_page)
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    for seed in SEEDS:  # seed 0 of every row first: an interrupted run has a whole first replicate
        for name in ("dsl", "mdlm"):
            train_variant(out, name, seed)
            held_out_bound(out / "models" / f"{name}-seed{seed}")
        for kind in BASELINES:
            train_baseline(out, kind, seed)
    if number == 3:
        check_mdlm_objective(out)
    table = trained_rows(out)  # sampled before the bridges: a run cut short still describes these rows
    samples = sample_all(out, table)
    write(out, page, samples, training_record(out, table), None, flops_per_token(out), time.perf_counter() - began)
    sweep = bridges(out)
    table.update(rows_of(out, sweep["verdict"]))
    samples = sample_all(out, table)
    (out / "samples.json").write_text(json.dumps(samples))
    write(out, page, samples, training_record(out, table), sweep,
          {**flops_per_token(out), **bridge_flops(out, table)}, time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=int, choices=(2, 3), default=2,
                        help="which run of docs/baselines.md's protocol: 2 (the bridges' revised rule) or 3 (the "
                             "decodings of issue 61 and MDLM on its own objective)")
    parser.add_argument("--out", type=Path, help="its folder (default runs/baselines, or runs/baselines-3 for run 3)")
    parser.add_argument("--page", type=Path, default=ROOT / "docs" / "baselines.md")
    args = parser.parse_args()
    out = args.out or ROOT / "runs" / ("baselines" if args.run == 2 else "baselines-3")
    run(out, args.page, args.run)


# --- run 3 (docs/baselines.md, its protocol of 2026-12-06) ---------------------------------------

def run3_rows(out: Path, verdict: dict) -> dict:
    """Run 3's bridge rows (RUN3_BRIDGES): the sweep's chosen and worst layers' bridges, per seed,
    with each row's sampler and decoding; their samples are the words after a block's BOS."""
    from geoprobe.workflows.sweep import bridge_dir

    run_dir, words = out / "run", SEQ_LEN - 1
    return {name: ({s: bridge_dir(run_dir, verdict[f"{role}_layer"], s) for s in SEEDS}, sampler, decode, words,
                   f"blocks:{words}") for name, (role, sampler, decode) in RUN3_BRIDGES.items()}


def check_mdlm_objective(out: Path) -> None:
    """Stop unless every `mdlm` model of the run trained on MDLM's own objective (run 3's protocol)."""
    from geoprobe.bridges.dsl import mdlm_objective_of

    for seed in SEEDS:
        record = json.loads((out / "models" / f"mdlm-seed{seed}" / "config.json").read_text())
        found = mdlm_objective_of(record.get("training"))
        if found != "mdlm":
            raise SystemExit(f"{out}/models/mdlm-seed{seed} trained on the {found} MDLM objective; run 3 registers "
                             "MDLM's own (move the folder aside and rerun)")


def run3_tests(samples: list[dict], training: dict, sweep: dict, hmm_diversity: float) -> dict:
    """Run 3's registered tests: the primary (LTR against each baseline, intersection-union), the
    eight secondaries with Holm's correction (one comparing an unconverged row counts as not
    rejected) and the described comparisons."""
    from geoprobe.metrics.correlation import holm

    def values(row, metric, pick=is_primary):
        return [r.get(metric) for r in samples if r["row"] == row and pick(r)]

    def nll(row, pick=is_primary):
        return values(row, "oracle_nll_per_word", pick)

    def gap(row):
        return [abs(v - hmm_diversity) for v in values(row, "diversity_within") if v is not None]

    def paired(a, b):
        return paired_less(primary_values(samples, a, "oracle_nll_per_word"),
                           primary_values(samples, b, "oracle_nll_per_word"))

    def at_64(r):
        return r["evaluations"] == BUDGETS[1] and not is_primary(r)

    ok = {n: (n in training or not n.startswith("bridge-")) and converged(n, training, sweep)
          for n in (*RUN3_BRIDGES, *BASELINES, "dsl")}
    primary = {k: welch_less(nll(LTR), nll(k)) for k in BASELINES}
    unconverged = [n for n in (LTR, *BASELINES) if not ok[n]]
    outcome = "inconclusive" if unconverged else (
        "supported" if all(p < 0.05 for p in primary.values()) else "not supported")
    best = min(BASELINES, key=lambda k: mean_sd(nll(k))[0] if nll(k) else math.inf)
    hybrid, stack_only, worst = "bridge-chosen-hybrid", "bridge-chosen-stack-only", "bridge-worst-ltr"
    family = {  # test: (p, the rows it compares)
        **{f"bigram distance: {LTR} < {k}": (welch_less(values(LTR, "bigram_tv"), values(k, "bigram_tv")), (LTR, k))
           for k in BASELINES},
        f"NLL: {LTR} < {worst} (the layer choice)": (welch_less(nll(LTR), nll(worst)), (LTR, worst)),
        f"NLL: dsl < the best baseline ({best})": (welch_less(nll("dsl"), nll(best)), ("dsl", best)),
        f"diversity: {LTR} closer to the HMM's than {best}": (welch_less(gap(LTR), gap(best)), (LTR, best)),
        f"NLL: {LTR} < {hybrid} (paired by seed)": (paired(LTR, hybrid), (LTR, hybrid)),
        f"NLL: {hybrid} < {stack_only} (paired by seed)": (paired(hybrid, stack_only), (hybrid, stack_only))}
    lacking = {k: [n for n in rows if not ok[n]] for k, (_, rows) in family.items()}
    # the layer choice cannot be tested where the geometry chose the worst layer: both rows are one set of bridges
    same = sweep["verdict"]["chosen_layer"] == sweep["verdict"]["worst_layer"]
    cannot = {k: (f"the chosen layer is the worst layer ({sweep['verdict']['chosen_layer']}): both rows sample the "
                  "same bridges" if same and worst in rows else None) for k, (_, rows) in family.items()}
    adjusted = holm({k: 1.0 if lacking[k] or cannot[k] else p for k, (p, _) in family.items()})
    return {"outcome": outcome, "p": primary, "unconverged": unconverged, "best_baseline": best,
            "secondary": [{"test": k, "p": p, "adjusted": adjusted[k], "unconverged": lacking[k], "cannot": cannot[k]}
                          for k, (p, _) in family.items()],
            # described: the hybrid rows against each baseline, and LTR against their 64-evaluation sets
            "described": {row: {k: welch_less(nll(row), nll(k)) for k in BASELINES} for row in (hybrid, stack_only)},
            "matched": {k: welch_less(nll(LTR), nll(k, at_64)) for k in BASELINES}}


def run3_verdict_section(samples: list[dict], training: dict, sweep: dict, hmm_diversity: float) -> list[str]:
    found = run3_tests(samples, training, sweep, hmm_diversity)
    v = sweep["verdict"]
    words = {"supported": "**Supported**: the chosen layer's bridges decoded left to right give samples more likely "
                          "under the exact HMM than every embedding baseline's (all three one-sided Welch tests reject "
                          "at 0.05). This says that decoding through the bridge's reconstruction and the frozen upper "
                          "stack beats these baselines; it does not make the bridge a diffusion generator that beats "
                          "them (the protocol).",
             "not supported": "**Not supported**: the chosen layer's bridges decoded left to right do not give samples "
                              "more likely under the exact HMM than every embedding baseline's (at least one of the "
                              "three one-sided Welch tests does not reject at 0.05).",
             "inconclusive": "**Inconclusive**: a row the primary test compares did not converge by the protocol's "
                             f"rules ({', '.join(found['unconverged'])}); its numbers are reported as unconverged, not "
                             "as evidence."}[found["outcome"]]
    nll = {row: [r.get("oracle_nll_per_word") for r in samples if r["row"] == row and is_primary(r)]
           for row in ("mdlm", "dsl")}
    parts = ["**The primary test (DiHAL decoded left to right).** " + words + " p-values (H1: the left-to-right "
             "row's NLL per word is lower): " + ", ".join(f"{k} {p_value(p)}" for k, p in found["p"].items())
             + " (run 2, the chosen layer's bridges by the random-order hybrid without the evidence: "
             + ", ".join(f"{k} {p_value(p)}" for k, p in RUN2_P.items()) + ").", "",
             f"The testbed's sweep chose layer {v['chosen_layer']} by geometry; its worst layer is {v['worst_layer']}, "
             f"its oracle layer (the lowest seed-mean loss) {v['oracle_layer']}. Its convergence: "
             f"{'; '.join(v['convergence'].get('reasons') or []) or 'converged'}.", "",
             "**The secondaries** (one-sided; Welch, or paired by seed where one bridge is decoded two ways; Holm over "
             "all eight; a test that could not run, or that compares an unconverged row, counts as not rejected):", ""]
    parts += [f"- {s['test']}: cannot run ({s['cannot']}): counts as not rejected." if s["cannot"] else
              f"- {s['test']}: p = {p_value(s['p'])}, Holm-adjusted {p_value(s['adjusted'])}: "
              + ("does not count (unconverged: " + ", ".join(s["unconverged"]) + ")." if s["unconverged"] else
                 "rejects." if s["adjusted"] < 0.05 else "does not reject.") for s in found["secondary"]]
    parts += ["", "**Described, not tested** (one-sided Welch p-values, H1: the first row's NLL per word is lower):",
              ""]
    parts += [f"- `{row}` against " + ", ".join(f"{k} {p_value(p)}" for k, p in ps.items()) + "."
              for row, ps in found["described"].items()]
    parts += [f"- `{LTR}` against the baselines at {BUDGETS[1]} evaluations, its own count: "
              + ", ".join(f"{k} {p_value(p)}" for k, p in found["matched"].items()) + "."]
    parts += [f"- `mdlm` on MDLM's objective: {cell(nll['mdlm'], 2)} nats/word (run 2's `mdlm`, on the earlier "
              f"objective: {RUN2_MDLM}); `dsl` {cell(nll['dsl'], 2)}.", ""]
    return parts


def layers_moved(verdict: dict, before: dict = RUN2_LAYERS) -> str | None:
    """A line saying where run 3's sweep chose another chosen or worst layer than run 2's, so that
    its bridge rows are other layers' bridges than run 2's (None where both layers are run 2's)."""
    now = {role: verdict[f"{role}_layer"] for role in before}
    if now == before:
        return None
    return (f"Run 3's sweep chose layer {now['chosen']} and found layer {now['worst']} the worst; run 2's chose layer "
            f"{before['chosen']} and found layer {before['worst']} the worst. Its bridge rows are therefore other "
            "layers' bridges than run 2's, and their steps and NLL are no check that run 2 reproduces.")


def write_run3_page(out: Path, page: Path, samples: list[dict], training: dict, sweep: dict | None, flops: dict,
                    seconds: float) -> None:
    """Run 3's section of the page ("Results of run 3"), below run 2's, which it leaves as it is."""
    truth, floor = hmm_references(samples)
    parts = [RUN3_HEADING, "", measured("make results-baselines-3", training, seconds, sweep), "",
             reproduction(training, samples, RUN2_STEPS, RUN2_NLL, "run 2"), ""]
    if sweep is not None and (moved := layers_moved(sweep["verdict"])):
        parts += [moved, ""]
    if sweep is None:
        parts += [PARTIAL, ""]
    else:
        parts += run3_verdict_section(samples, training, sweep, truth["diversity_within"])
    parts += table_section(samples, training, sweep, flops, truth, floor, title="Run 3's table",
                           compared=(*RUN3_BRIDGES, *BASELINES, "dsl", "mdlm"))
    page.write_text(replace_section(page.read_text(), RUN3_HEADING, parts))
    log(f"wrote {page}")


if __name__ == "__main__":
    main()
