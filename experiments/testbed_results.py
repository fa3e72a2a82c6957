"""The DSL paper's comparisons on the testbed, trained to convergence, with seeds: docs/testbed.md.

    make results-testbed          # = python -m experiments.testbed_results --out runs/testbed --page docs/testbed.md

Resumable: every model and every sample set is a folder of its own that a rerun reuses (a model
with metrics.json is done; a sample set with scores.json is done), so a killed run continues
where it stopped. Three stages, each a plain loop over library calls:

1. training: DSL (mixed SNR), MDLM (endpoint SNR), MDLM -> DSL (the converged MDLM fine-tuned with
   the mixed SNR) and DSL initialised from the testbed itself (`--init-from builtin:hmm-tiny`),
   SEEDS each, each until its held-out bound plateaus (`PLATEAU`) under a step cap;
2. every sampler at every number of steps on every converged model, scored by the exact HMM;
   the hybrid's switch SNR swept once;
3. the DiHAL rows: a bridge at every layer of the testbed (the sweep's protocol), sampled with
   the hybrid sampler, and the layer-0 rounding baseline, scored the same way;
4. (`--stages 4`, not in the default run) the DSL paper's recipe at a matched budget: MDLM for N
   steps then a DSL fine-tune for M, against MDLM for N + M (`recipe_comparison`).

MDLM trains on MDLM's own objective (`dsl train --mdlm-objective mdlm`, bridges/dsl.py); a
folder holding an MDLM trained on the legacy objective, and the MDLM -> DSL model and the
samples made from it, are moved to `legacy-objective/` before stage 1 retrains them
(`retire_legacy`).

The page's protocol (what is compared, how, and what counts as a difference) is written in
docs/testbed.md above the generated results; this script only fills in the results.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # run by hand too: every model here is builtin

from experiments.pages import cell, disjoint, mean_sd, p_value
from experiments.records import log
from geoprobe.synthetic import parse_spec
from geoprobe.testbed import CORPUS
from geoprobe.workflows.demo import TINY

ROOT = Path(__file__).resolve().parent.parent
MODEL = TINY.model  # the demo's testbed, its sample count and its DSL network's width and rate
SEEDS = (0, 1, 2)
SEQ_LEN = 65  # one 64-word document and its <eos> per row: every training row starts at a document start
LENGTH = 65  # samples as long as a row: 64 words and the end of the document
NUM = TINY.num  # samples per set
STEPS = (4, 8, 16, 32, 64)
SAMPLERS = ("mdlm", "remdm-cap", "remdm-loop", "roar", "continuous", "hybrid")
SWITCH_SNRS = (1.0, 2.0, 5.0, 10.0, 20.0)
# the convergence rule: the MDLM bound of the EMA weights on held-out rows every EVAL steps; stop
# when the best of the last 20 % of steps (at least 5 evaluations) is less than 0.5 % better than
# the value before them, never before MIN_STEPS; the best evaluation's weights are kept
EVAL, PLATEAU, MIN_STEPS = 50, 0.005, 300
MARGIN = 0.05  # nats/word: the primary non-inferiority margin (docs/testbed.md)
SMALL = dict(d_model=TINY.dsl_width, n_layers=2, n_heads=4, d_tok=64)
TRAINING = dict(batch_size=32, seq_len=SEQ_LEN, lr=TINY.dsl_lr, warmup=50, eval_every=EVAL, plateau_rel=PLATEAU,
                min_steps=MIN_STEPS, save_every=100, ema=0.995)
VARIANTS = {  # name: (snr, steps cap, what it starts from, lr)
    "dsl": ("mixed", 4000, None, 2e-3),
    "mdlm": ("endpoint", 4000, None, 2e-3),
    "mdlm-dsl": ("mixed", 2000, "mdlm", 1e-3),
    "dsl-init": ("mixed", 800, MODEL, 5e-4),
}
CONTROL = "dsl-cap"  # dsl seed 0 again, to its full cap: what stopping on the plateau costs
DOCUMENT = parse_spec(CORPUS)["length"]  # words per corpus document
HELD_OUT_DOCS, HELD_OUT_SEED = 256, 99  # the testbed's own held-out documents (geoprobe.testbed.held_out_nll)


# --- stage 1: training ------------------------------------------------------------------------

def retire_legacy(out: Path) -> list[str]:
    """Move every MDLM model trained on the legacy objective (a record from before
    `--mdlm-objective`), the models fine-tuned from it and all their sample sets to
    OUT/legacy-objective/, so that stage 1 retrains them on MDLM's objective; the names moved."""
    import shutil

    from geoprobe.bridges.dsl import mdlm_objective_of

    moved = []
    for seed in SEEDS:
        record = out / "models" / f"mdlm-seed{seed}" / "config.json"
        if not record.is_file() or mdlm_objective_of(json.loads(record.read_text()).get("training")) != "legacy":
            continue
        for name in [n for n, v in VARIANTS.items() if n == "mdlm" or v[2] == "mdlm"]:
            for kind in ("models", "samples"):
                folder = out / kind / f"{name}-seed{seed}"
                if folder.exists():
                    target = out / "legacy-objective" / kind / folder.name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.move(str(folder), str(target))
                    moved.append(f"{kind}/{folder.name}")
    return moved


def train_variant(out: Path, name: str, seed: int) -> dict:
    from geoprobe.bridges.dsl import dsl_settings, fit_dsl

    folder = out / "models" / f"{name}-seed{seed}"
    if (folder / "metrics.json").is_file():
        return json.loads((folder / "metrics.json").read_text())
    snr, cap, start, lr = VARIANTS["dsl" if name == CONTROL else name]
    never = {"min_steps": cap} if name == CONTROL else {}  # the rule's evaluations and best weights, no early stop
    settings, shape = dsl_settings(**{**TRAINING, "lr": lr, **never}, snr=snr, steps=cap, seed=seed, **SMALL)
    init = out / "models" / f"{start}-seed{seed}" if start == "mdlm" else None
    began = time.perf_counter()
    metrics = fit_dsl(folder, CORPUS, MODEL, settings=settings, shape=shape, init=init,
                      init_from=start if start == MODEL else None, device="cpu")
    log(f"trained {name} seed {seed}: {metrics['steps_run']} steps ({metrics['stop']}), "
        f"{time.perf_counter() - began:.0f} s")
    return metrics


def held_out_bound(folder: Path) -> dict:
    """The MDLM bound (nats per word) on the testbed's held-out documents, beside the exact HMM
    NLL of the same documents."""
    import torch

    from geoprobe.bridges.dsl import load_dsl
    from geoprobe.bridges.likelihood import mdlm_elbo
    from geoprobe.tokens import load_saved_tokenizer
    from geoprobe.synthetic import hmm_from_spec
    from geoprobe.testbed import SEED

    cached = folder / "held_out.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    hmm = hmm_from_spec(CORPUS)
    tok = load_saved_tokenizer(folder)
    words = hmm.sample_many(HELD_OUT_DOCS, SEQ_LEN - 1, np.random.default_rng([SEED, HELD_OUT_SEED]))
    lookup = np.array(tok.convert_tokens_to_ids(hmm.words))
    rows = torch.cat([torch.from_numpy(lookup[words]), torch.full((len(words), 1), tok.eos_token_id)], 1)
    model = load_dsl(folder)
    nats = torch.cat([mdlm_elbo(model, rows[i:i + 64], samples=32) for i in range(0, len(rows), 64)])
    per_word = nats * SEQ_LEN / (SEQ_LEN - 1)  # the row's bound (its <eos> included) over its 64 words
    result = {"bound_nats_per_word": float(per_word.mean()), "bound_se": float(per_word.std() / math.sqrt(len(rows))),
              "hmm_nats_per_word": float(-sum(hmm.log_prob(r.tolist()) for r in words) / words.size)}
    cached.write_text(json.dumps(result))
    return result


# --- stage 2: samplers -----------------------------------------------------------------------

def score_samples(folder: Path, model: Path, sampler: str, steps: int, *, switch_snr: float = 5.0,
                  decode: str = "stack", length: int = LENGTH, start: str = "document", num: int = NUM) -> dict:
    from geoprobe.workflows.generate import SampleSettings, generate
    from geoprobe.metrics.text import text_metrics, token_metrics, word_text
    from geoprobe.synthetic import hmm_from_spec, oracle_scores

    cached = folder / "scores.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    if folder.exists():  # an interrupted set: its samples may be from the middle of a write
        import shutil

        shutil.rmtree(folder)
    settings = SampleSettings(num=num, length=length, steps=steps, switch_snr=switch_snr, decode=decode)
    result = generate(model, sampler, settings, folder, "cpu")
    texts, eos = [r["text"] for r in result["samples"]], result["meta"]["eos"]  # documents end at eos
    scores = {**oracle_scores(hmm_from_spec(CORPUS), texts, start, DOCUMENT, eos), **text_metrics(texts, eos),
              **token_metrics([r["token_ids"] for r in result["samples"]]),
              "nfe": result["meta"]["nfe"], "nfe_per_sample": result["meta"]["nfe_per_sample"],
              "seconds_per_sample": result["meta"]["seconds"] / num,
              "words_per_sample": float(np.mean([len(word_text(t, eos).split()) for t in texts]))}
    cached.write_text(json.dumps(scores))
    return scores


def sampler_grid(out: Path) -> list[dict]:
    rows = []
    for name in VARIANTS:
        for seed in SEEDS:
            model = out / "models" / f"{name}-seed{seed}"
            for sampler in SAMPLERS:
                for steps in STEPS:
                    folder = out / "samples" / f"{name}-seed{seed}" / f"{sampler}-{steps}"
                    rows.append({"model": name, "seed": seed, "sampler": sampler, "steps": steps,
                                 **score_samples(folder, model, sampler, steps)})
        log(f"sampled {name}")
    for seed in SEEDS:
        for snr in SWITCH_SNRS:
            folder = out / "samples" / f"dsl-seed{seed}" / f"hybrid-32-switch{snr:g}"
            rows.append({"model": "dsl", "seed": seed, "sampler": f"hybrid (switch {snr:g})", "steps": 32,
                         **score_samples(folder, out / "models" / f"dsl-seed{seed}", "hybrid", 32, switch_snr=snr)})
    return rows


# --- stage 3: the DiHAL rows --------------------------------------------------------------------

def dihal_rows(out: Path) -> tuple[list[dict], dict]:
    from geoprobe.workflows.demo import TINY
    from geoprobe.geometry import GeometrySettings
    from geoprobe.pipeline import scan, scan_config
    from geoprobe.bridges.hidden import FIRST_DIFFUSION
    from geoprobe.workflows.sweep import bridge_dir, bridge_settings, sweep_run

    run = out / "run"
    p = TINY
    if not (run / "ranking.csv").is_file():
        scan(run, scan_config(MODEL, CORPUS, p.doc_blocks, tokens=p.tokens, seq_len=p.seq_len, positions=p.positions,
                              device="cpu"),
             GeometrySettings(k=p.k, anchors=p.anchors, pairs=p.pairs, bootstrap=p.bootstrap))
    # the tiny demo's bridge as it was when this page was made (FIRST_DIFFUSION), not today's default
    settings = bridge_settings(steps=p.bridge_steps, batch_size=p.bridge_batch, seq_len=p.bridge_seq,
                               d_model=p.bridge_width, n_layers=p.bridge_blocks, lr=p.bridge_lr,
                               eval_every=p.bridge_eval_every, **FIRST_DIFFUSION)
    if not (run / "sweep.json").is_file():
        sweep_run(run, settings, "0-5", device="cpu", seeds=list(SEEDS))
    rows = []
    length = p.bridge_seq - 1  # a bridge generates the words after its block's BOS
    for layer in range(6):
        for seed in SEEDS:
            folder = out / "samples" / f"bridge-{layer}-seed{seed}" / "hybrid-32"
            rows.append({"model": f"bridge layer {layer}", "seed": seed, "sampler": "hybrid", "steps": 32,
                         **score_samples(folder, bridge_dir(run, layer, seed), "hybrid", 32, length=length,
                                           start=f"blocks:{length}")})
    for seed in SEEDS:
        folder = out / "samples" / f"round-seed{seed}" / "mdlm-32"
        rows.append({"model": "layer-0 rounding", "seed": seed, "sampler": "mdlm", "steps": 32,
                     **score_samples(folder, bridge_dir(run, 0, seed), "mdlm", 32, decode="round", length=length,
                                    start=f"blocks:{length}")})
    log("sampled the bridges")
    return rows, json.loads((run / "sweep.json").read_text())


# --- stage 4: the DSL paper's recipe at a matched budget ----------------------------------------

RECIPE_STEPS = (1500, 500)  # (N, M): MDLM for N steps, then DSL fine-tuned from it for M; against MDLM for N + M
RECIPE_SAMPLE_STEPS = 32  # every sampler of SAMPLERS at this many steps, on both arms
RECIPE_LR = {"mdlm": 2e-3, "dsl": 1e-3}  # the peak rates of `mdlm` and `mdlm-dsl` above


def recipe_model(out: Path, name: str, seed: int, snr: str, steps: int, lr: float, init: Path | None) -> Path:
    """One model of the recipe comparison, trained for exactly `steps` (no plateau rule: the
    budget is the comparison's), its held-out bound cached beside it."""
    from geoprobe.bridges.dsl import dsl_settings, fit_dsl

    folder = out / "recipe" / "models" / f"{name}-seed{seed}"
    if not (folder / "metrics.json").is_file():
        fixed = {**TRAINING, "eval_every": 0, "save_every": max(1, steps // 4), "warmup": min(TRAINING["warmup"], steps // 10)}
        settings, shape = dsl_settings(**{**fixed, "lr": lr}, snr=snr, steps=steps, seed=seed, **SMALL)
        began = time.perf_counter()
        fit_dsl(folder, CORPUS, MODEL, settings=settings, shape=shape, init=init, device="cpu")
        log(f"recipe: trained {name} seed {seed} ({steps} steps), {time.perf_counter() - began:.0f} s")
    held_out_bound(folder)
    return folder


def recipe_comparison(out: Path, steps: tuple[int, int] = RECIPE_STEPS, seeds=SEEDS,
                      sample_steps: int = RECIPE_SAMPLE_STEPS, num: int = NUM) -> list[dict]:
    """The DSL paper's recipe (DSL fine-tuned from an MDLM checkpoint) against MDLM alone at the
    same number of training steps: per seed, MDLM for N steps then DSL (mixed SNR) from it for M
    (`recipe`), and MDLM for N + M (`mdlm-long`); each arm's held-out bound and every sampler's
    oracle NLL at `sample_steps`. Resumable: each model and sample set is a folder of its own
    under OUT/recipe/. Returns one row per (arm, seed, sampler)."""
    n, m = steps
    rows = []
    for seed in seeds:
        start = recipe_model(out, f"mdlm-{n}", seed, "endpoint", n, RECIPE_LR["mdlm"], None)
        arms = {"recipe": recipe_model(out, f"mdlm-{n}-dsl-{m}", seed, "mixed", m, RECIPE_LR["dsl"], start),
                "mdlm-long": recipe_model(out, f"mdlm-{n + m}", seed, "endpoint", n + m, RECIPE_LR["mdlm"], None)}
        for arm, model in arms.items():
            bound = held_out_bound(model)["bound_nats_per_word"]
            for sampler in SAMPLERS:
                folder = out / "recipe" / "samples" / f"{model.name}" / f"{sampler}-{sample_steps}"
                rows.append({"arm": arm, "model": model.name, "seed": seed, "steps": n + m, "bound": bound,
                             "sampler": sampler, **score_samples(folder, model, sampler, sample_steps, num=num)})
    log(f"recipe: {len(rows)} sample sets scored")
    (out / "recipe" / "recipe.json").write_text(json.dumps({"steps": list(steps), "num": num,
                                                            "sample_steps": sample_steps, "rows": rows}))
    return rows


def recipe_section(recipe: dict) -> list[str]:
    """The page's lines for the recipe comparison: each arm's bound, and each sampler's oracle NLL,
    mean ± sd over seeds; one-sided Welch p of "the recipe's bound is lower" (descriptive)."""
    from scipy import stats

    (n, m), rows = recipe["steps"], recipe["rows"]
    bound = {a: list({r["seed"]: r["bound"] for r in rows if r["arm"] == a}.values()) for a in ("recipe", "mdlm-long")}
    p = float(stats.ttest_ind(bound["recipe"], bound["mdlm-long"], equal_var=False, alternative="less").pvalue) \
        if min(map(len, bound.values())) > 1 else math.nan
    parts = ["### 4. The DSL paper's recipe at a matched budget", "",
             f"MDLM for {n:,} steps then DSL (mixed SNR) fine-tuned from it for {m:,} (`recipe`), against MDLM for "
             f"{n + m:,} (`mdlm-long`), the same network, rows and samplers; {len(bound['recipe'])} seeds, "
             f"{recipe['num']} samples per cell at {recipe['sample_steps']} steps; mean ± sd over seeds.", "",
             "| arm | held-out bound, nats/word | " + " | ".join(f"{s} oracle NLL" for s in SAMPLERS) + " |",
             "|---|---|" + "---|" * len(SAMPLERS)]
    for arm in ("recipe", "mdlm-long"):
        cells = [cell([r.get("oracle_nll_per_word") for r in rows if r["arm"] == arm and r["sampler"] == s], 2)
                 for s in SAMPLERS]
        parts.append(f"| `{arm}` | {cell(bound[arm])} | " + " | ".join(cells) + " |")
    return parts + ["", f"Recipe's bound below MDLM's (one-sided Welch, descriptive): p = {p_value(p)}.", ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/testbed"))
    parser.add_argument("--page", type=Path, default=ROOT / "docs" / "testbed.md")
    parser.add_argument("--stages", default="1,2,3", help="which stages to run (the page shows what exists); 4: "
                                                          "the DSL recipe at a matched budget")
    parser.add_argument("--recipe-steps", default=",".join(map(str, RECIPE_STEPS)), help="stage 4's N,M")
    args = parser.parse_args()
    stages = set(args.stages.split(","))
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    trained = {}
    if "1" in stages:
        for name in retire_legacy(out):
            log(f"moved {name} to legacy-objective/: trained on the legacy MDLM objective")
        for name in VARIANTS:  # MDLM before MDLM -> DSL, which starts from it
            for seed in SEEDS:
                trained[(name, seed)] = {**train_variant(out, name, seed),
                                         **held_out_bound(out / "models" / f"{name}-seed{seed}")}
        trained[(CONTROL, 0)] = {**train_variant(out, CONTROL, 0), **held_out_bound(out / "models" / f"{CONTROL}-seed0")}
        (out / "training.json").write_text(json.dumps({f"{n}-seed{s}": v for (n, s), v in trained.items()}))
    samples = sampler_grid(out) if "2" in stages else []
    if samples:
        (out / "samples.json").write_text(json.dumps(samples))
    bridges, sweep = dihal_rows(out) if "3" in stages else ([], None)
    if bridges:
        (out / "bridges.json").write_text(json.dumps(bridges))
    if "4" in stages:
        recipe_comparison(out, tuple(int(k) for k in args.recipe_steps.split(",")))
    log(f"done in {time.perf_counter() - began:.0f} s; writing {args.page}")
    write_page(out, args.page)


RESULTS_HEADING = "## Results"


def recorded_minutes(training: dict, sets: list[dict], sweep_rows: list[dict]) -> str:
    """The page's compute, from the records themselves: every model's and bridge's training
    seconds (a resumed run's record adds its invocations) and every sample set's sampling seconds.
    An invocation killed mid-run (a machine that went away) loses none of it, as a wall clock would.

    Args:
        training: training.json, by model and seed; sets: every scored sample set (samples.json and
            bridges.json); sweep_rows: the DiHAL sweep's rows (run/sweep.json).
    """
    trained = sum(v.get("train_seconds") or 0 for v in training.values())
    bridges = sum(r.get("train_seconds") or 0 for r in sweep_rows)
    sampled = sum(r.get("seconds_per_sample", 0) * len(r.get("oracle_nll_per_sample", [])) for r in sets)
    return (f"the records' own times: training {trained / 60:.0f} min ({len(training)} models), the bridges "
            f"{bridges / 60:.0f} min ({len(sweep_rows)}), sampling {sampled / 60:.0f} min "
            f"({len(sets)} sets), besides scoring and evaluation, which no record times")


def write_page(out: Path, page: Path) -> None:
    """The results section of docs/testbed.md (below its protocol) and its plots, from the stored results."""
    from geoprobe.assets import builtin_model
    from geoprobe.synthetic import hmm_from_spec

    record = builtin_model("hmm-tiny")[1]
    hmm = hmm_from_spec(CORPUS)
    refs = {"entropy rate": hmm.entropy_rate(), "HMM, same documents": record["hmm_nll"],
            "AR testbed, same documents": record["model_nll"]}
    figures = page.parent / "testbed"
    figures.mkdir(parents=True, exist_ok=True)
    def read(name, empty):
        return json.loads((out / name).read_text()) if (out / name).is_file() else empty

    training, samples, bridges = read("training.json", {}), read("samples.json", []), read("bridges.json", [])
    sweep_rows = read("run/sweep.json", {}).get("rows", [])
    parts = [RESULTS_HEADING, "", f"Measured with `make results-testbed` on {machine()}; "
             f"{recorded_minutes(training, [*samples, *bridges], sweep_rows)}.", ""]
    if training:
        parts += convergence_section(training, refs, figures)
    if samples:
        parts += sampler_section(samples, refs, figures)
    if bridges:
        parts += bridges_section(bridges, out, training)
    if (out / "recipe" / "recipe.json").is_file():
        parts += recipe_section(json.loads((out / "recipe" / "recipe.json").read_text()))
    text = page.read_text() if page.is_file() else ""
    head = text.split(RESULTS_HEADING)[0].rstrip() + "\n\n" if RESULTS_HEADING in text else text
    page.write_text(head + "\n".join(parts) + "\n")
    log(f"wrote {page}")


def machine() -> str:
    from geoprobe.device import machine_name

    return f"{machine_name()}, torch float32 on the CPU"


def tokens_of(name: str, seed: int, training: dict) -> float:
    """Training tokens of a model (its own steps x rows x row length; a fine-tune adds its start's)."""
    m = training[f"{name}-seed{seed}"]
    own = m["steps_run"] * TRAINING["batch_size"] * SEQ_LEN  # every step run, past the kept (best) one too
    start = VARIANTS.get(name, (None, None, None))[2]
    return own + (tokens_of(start, seed, training) if start == "mdlm" else 0)


def convergence_section(training: dict, refs: dict, figures: Path) -> list[str]:
    from scipy import stats

    from geoprobe.metrics.correlation import holm
    from geoprobe.report.plots import plt, save_figure

    bound = {n: [training[f"{n}-seed{s}"]["bound_nats_per_word"] for s in SEEDS] for n in VARIANTS}
    rows = ["| model | seeds | steps run (stop, the evaluation whose weights were kept) | training tokens | "
            "held-out bound, nats/word | above the HMM floor |",
            "|---|---|---|---|---|---|"]
    floor = refs["HMM, same documents"]
    for n in VARIANTS:
        ms = [training[f"{n}-seed{s}"] for s in SEEDS]
        steps = ", ".join(f"{m['steps_run']} ({m['stop']}, best {m['best_step']})" for m in ms)
        tokens = np.mean([tokens_of(n, s, training) for s in SEEDS])
        gap = [b / floor - 1 for b in bound[n]]
        rows.append(f"| `{n}` | {len(ms)} | {steps} | {tokens / 1e6:.2f} M | {cell(bound[n])} | "
                    f"{100 * np.mean(gap):+.1f} % |")
    if f"{CONTROL}-seed0" in training:
        m = training[f"{CONTROL}-seed0"]
        stop = "cap" if m["steps_run"] >= VARIANTS["dsl"][1] else m["stop"]  # its rule may fire only at the cap
        rows.append(f"| `{CONTROL}` (control: `dsl` seed 0 to its cap) | 1 | {m['steps_run']} ({stop}; best at "
                    f"{m['best_step']}) | {tokens_of(CONTROL, 0, training) / 1e6:.2f} M | "
                    f"{m['bound_nats_per_word']:.3f} (seed 0 stopped: {bound['dsl'][0]:.3f}) | "
                    f"{100 * (m['bound_nats_per_word'] / floor - 1):+.1f} % |")
    # (name, a, b, margin): H1 mean(a) - margin < mean(b), one-sided Welch; the primary is non-inferiority
    tests = [(f"dsl non-inferior to mdlm (margin {MARGIN} nats/word)", "dsl", "mdlm", MARGIN),
             ("mdlm-dsl < dsl", "mdlm-dsl", "dsl", 0.0), ("dsl-init < dsl", "dsl-init", "dsl", 0.0)]
    p = {k: float(stats.ttest_ind(np.array(bound[a]) - margin, bound[b], equal_var=False, alternative="less").pvalue)
         for k, a, b, margin in tests}
    adjusted = holm(p)
    lines = [f"- **{k}** ({'primary' if i == 0 else 'secondary'}; one-sided Welch t, {len(SEEDS)} seeds each): "
             f"difference of means {np.mean(bound[a]) - np.mean(bound[b]):+.3f} nats/word, p = {p_value(p[k])}, "
             f"Holm-adjusted {p_value(adjusted[k])}: " + ("**supported** at 0.05." if adjusted[k] < 0.05 else
                                                     "not supported at 0.05.")
             for i, (k, a, b, margin) in enumerate(tests)]
    two = stats.ttest_ind(bound["dsl"], bound["mdlm"], equal_var=False)
    lines.append(f"- Beside the primary, not a test of the claim: DSL − MDLM = "
                 f"{np.mean(bound['dsl']) - np.mean(bound['mdlm']):+.3f} nats/word, two-sided Welch p = {p_value(two.pvalue)}.")
    fig, ax = plt.subplots(figsize=(8, 4.6))
    colors = dict(zip(VARIANTS, ("tab:blue", "tab:orange", "tab:green", "tab:red")))
    for n in VARIANTS:
        for s in SEEDS:
            m = training[f"{n}-seed{s}"]
            offset = tokens_of(VARIANTS[n][2], s, training) if VARIANTS[n][2] == "mdlm" else 0
            xs = [offset + step * TRAINING["batch_size"] * SEQ_LEN for step, _ in m["val_curve"]]
            ys = [v * SEQ_LEN / (SEQ_LEN - 1) for _, v in m["val_curve"]]
            ax.plot(np.array(xs) / 1e6, ys, color=colors[n], alpha=0.8, lw=1, label=n if s == SEEDS[0] else None)
    for (label, value), style in zip(refs.items(), (":", "--", "-.")):
        ax.axhline(value, color="black", ls=style, lw=1, label=f"{label} {value:.3f}")
    ax.set_ylim(refs["entropy rate"] - 0.1, 4.6)
    ax.set_xlabel("training tokens (millions; MDLM -> DSL counts its MDLM's)")
    ax.set_ylabel("held-out MDLM bound, nats/word (stopping rows)")
    ax.set_title("Convergence: every seed, until its held-out bound plateaus")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, figures / "convergence.png")
    return ["### 1. Convergence", "",
            f"Reference lines (nats/word, the same 256 held-out documents): the HMM's entropy rate "
            f"{refs['entropy rate']:.3f}; the exact NLL of those documents under the HMM {floor:.3f} (the floor of "
            f"any model of a 64-word document); the autoregressive testbed on them {refs['AR testbed, same documents']:.3f} "
            f"({record_tokens()} training tokens).", "", *rows, "",
            "Bound: mean ± sd over seeds; each seed's own standard error over the 256 documents is about "
            f"{np.mean([training[k]['bound_se'] for k in training]):.3f}.", "", *lines, "",
            "![convergence](testbed/convergence.png)", ""]


def record_tokens() -> str:
    from geoprobe.testbed import BATCH, LENGTH, STEPS

    return f"{STEPS * BATCH * LENGTH / 1e6:.1f} M"


def sampler_section(samples: list[dict], refs: dict, figures: Path) -> list[str]:
    from geoprobe.report.plots import plt, save_figure

    grid = [r for r in samples if r["sampler"] in SAMPLERS]
    by = {}
    for r in grid:
        by.setdefault((r["model"], r["sampler"], r["steps"]), []).append(r)
    parts = ["### 2. Samplers at convergence", "",
             f"{NUM} samples of {LENGTH - 1} words per cell and seed; mean ± sd over the {len(SEEDS)} seeds' models. "
             "Exact HMM NLL per word of the samples (lower: more likely under the true distribution; the HMM's own "
             f"64-word documents score {refs['HMM, same documents']:.3f}):", ""]
    for metric, title, digits in (("oracle_nll_per_word", "oracle NLL, nats/word", 2),
                                  ("bigram_tv", "bigram TV distance to the HMM", 3),
                                  ("diversity_within", "diversity (SimCTG, within sample)", 3),
                                  ("unigram_entropy", "word entropy (unigram, whitespace words) per sample, nats", 2),
                                  ("token_entropy", "token entropy (the generator's token ids, as ReMDM reports it) "
                                                    "per sample, nats", 2)):
        parts += [f"**{title}**", "", "| model | sampler | " + " | ".join(f"{n} steps" for n in STEPS) + " |",
                  "|---|---|" + "---|" * len(STEPS)]
        for model in VARIANTS:
            for sampler in SAMPLERS:
                cells = [cell([r.get(metric) for r in by.get((model, sampler, n), [])], digits) for n in STEPS]
                parts.append(f"| `{model}` | {sampler} | " + " | ".join(cells) + " |")
        parts.append("")
    from geoprobe.metrics.text import text_metrics
    from geoprobe.synthetic import hmm_from_spec

    hmm = hmm_from_spec(CORPUS)
    truth = text_metrics([hmm.text(r) for r in hmm.sample_many(3 * NUM, LENGTH - 1, np.random.default_rng(5))])
    parts += [f"For reference, {3 * NUM} documents of {LENGTH - 1} words from the HMM itself: unigram entropy "
              f"{truth['unigram_entropy']:.2f} nats per sample, diversity {truth['diversity_within']:.3f}. A sample "
              "set below them is more repetitive than the truth, which the oracle NLL rewards.", ""]
    floor = [r["bigram_tv_hmm"] for r in grid if "bigram_tv_hmm" in r]
    roar = [round(np.mean([r["nfe"] for r in by.get(("dsl", "roar", n), [])] or [math.nan])) for n in STEPS]
    parts += [f"The columns are the requested steps; every sampler makes that many denoiser evaluations except "
              f"roar, which makes {', '.join(map(str, roar))} (it reveals ⌈{LENGTH} / steps⌉ tokens per call). "
              + (f"The bigram distance's finite-sample floor (as many HMM samples of the same length): "
                 f"{np.mean(floor):.3f}." if floor else ""), ""]
    parts += ["remdm-loop runs geoprobe's schedule (the continuous alpha(t)); at 16 steps or fewer it is not the "
              "ReMDM code's discretisation, which reveals everything on the step that crosses t_on and leaves about "
              "8 % masked for a final argmax ([method.md](method.md), samplers). Both entropies are per sample: "
              "the word entropy over whitespace words, the token entropy over the generator's token ids (here one "
              "word per token, so they differ only where a sample holds a special token).", ""]
    parts += verdict_lines(by)
    switch = [r for r in samples if r["sampler"].startswith("hybrid (switch")]
    if switch:
        parts += ["**The hybrid's switch SNR** (`dsl`, 32 evaluations):", "", "| switch SNR | oracle NLL | bigram TV |",
                  "|---|---|---|"]
        for snr in SWITCH_SNRS:
            rows = [r for r in switch if r["sampler"] == f"hybrid (switch {snr:g})"]
            parts.append(f"| {snr:g} | {cell([r.get('oracle_nll_per_word') for r in rows], 2)} | "
                         f"{cell([r.get('bigram_tv') for r in rows])} |")
        parts.append("")
    fig, axes = plt.subplots(1, len(VARIANTS), figsize=(4 * len(VARIANTS), 4), sharey=True)
    for ax, model in zip(axes, VARIANTS):
        for sampler in SAMPLERS:
            stats_ = [mean_sd([r.get("oracle_nll_per_word") for r in by.get((model, sampler, n), [])]) for n in STEPS]
            nfe = [np.mean([r["nfe"] for r in by.get((model, sampler, n), [])] or [math.nan]) for n in STEPS]
            ax.errorbar(nfe, [m for m, _ in stats_], yerr=[sd for _, sd in stats_], marker="o", capsize=2,
                        label=sampler)
        ax.axhline(refs["HMM, same documents"], color="black", ls="--", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_title(model)
        ax.set_xlabel("denoiser evaluations")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("oracle NLL of the samples, nats/word")
    axes[-1].legend(fontsize=7)
    save_figure(fig, figures / "samplers.png")
    return parts + ["![samplers](testbed/samplers.png)", ""]


def verdict_lines(by: dict) -> list[str]:
    """Which sampler is best at each budget (only where its seed interval clears the runner-up's)
    and whether 64 evaluations beat 4 (only where the intervals are disjoint)."""
    def nll(model, sampler, n):
        return [r.get("oracle_nll_per_word") for r in by.get((model, sampler, n), [])]

    lines = []
    for model in VARIANTS:
        wins = []
        for n in STEPS:
            present = [s for s in SAMPLERS if not math.isnan(mean_sd(nll(model, s, n))[0])]
            if len(present) < 2:
                continue
            ranked = sorted(present, key=lambda s: mean_sd(nll(model, s, n))[0])
            best, second = ranked[0], ranked[1]
            values = {s: nll(model, s, n) for s in (best, second)}
            wins.append(f"{n}: {best}" + ("" if disjoint(values[best], values[second]) else f" (within noise of {second})"))
        helped = [s for s in SAMPLERS if disjoint(nll(model, s, 64), nll(model, s, 4))
                  and mean_sd(nll(model, s, 64))[0] < mean_sd(nll(model, s, 4))[0]]
        lines.append(f"- `{model}`: lowest oracle NLL at each requested number of steps: {'; '.join(wins)}. 64 steps "
                     f"beat 4 beyond the seed spread for: {', '.join(helped) or 'no sampler'}.")
    for a, b in (("dsl", "mdlm"), ("mdlm-dsl", "mdlm"), ("dsl-init", "dsl")):
        cells = [(s, n) for s in SAMPLERS for n in STEPS if nll(a, s, n) and nll(b, s, n)]
        lower = [f"{s} at {n}" for s, n in cells if disjoint(nll(a, s, n), nll(b, s, n))
                 and mean_sd(nll(a, s, n))[0] < mean_sd(nll(b, s, n))[0]]
        higher = [f"{s} at {n}" for s, n in cells if disjoint(nll(a, s, n), nll(b, s, n))
                  and mean_sd(nll(a, s, n))[0] > mean_sd(nll(b, s, n))[0]]
        lines.append(f"- `{a}` against `{b}`, same sampler and steps: of {len(cells)} cells, `{a}`'s samples are "
                     f"more likely beyond the seed spread in {len(lower)} ({', '.join(lower) or 'none'}), less likely "
                     f"in {len(higher)} ({', '.join(higher) or 'none'}); the other {len(cells) - len(lower) - len(higher)} "
                     "are within noise.")
    return lines + [""]


def bridges_section(rows: list[dict], out: Path, training: dict) -> list[str]:
    """The page's DiHAL rows: each layer's bridges (how many stopped by their plateau, the tokens
    they trained on) and their samples' scores, beside the DSL rows' training tokens (`training`)."""
    from geoprobe.bridges.checkpoint import training_tokens
    from geoprobe.workflows.sweep import bridge_dir

    table = []
    spent = []
    for model in dict.fromkeys(r["model"] for r in rows):
        group = [r for r in rows if r["model"] == model]
        layer = 0 if model.startswith("layer-0") else int(model.split()[-1])
        folders = [bridge_dir(out / "run", layer, r["seed"]) for r in group]
        used = np.mean([training_tokens(folder)[1] or 0 for folder in folders])
        spent.append(used)
        stops = [json.loads((f / "metrics.json").read_text()).get("stop") for f in folders]
        stopped = f"{stops.count('plateau')} of {len(stops)}" + (" (unconverged)" if "plateau" not in stops else "")
        table.append(f"| {model} | {stopped} | {used / 1e6:.2f} M | {cell([r.get('oracle_nll_per_word') for r in group], 2)} | "
                     f"{cell([r.get('bigram_tv') for r in group])} ({np.mean([r.get('bigram_tv_hmm', math.nan) for r in group]):.3f}) | "
                     f"{cell([r.get('diversity_within') for r in group])} |")
    dsl = [tokens_of(n, seed, training) for n in VARIANTS for seed in SEEDS if f"{n}-seed{seed}" in training]
    span = lambda v: " to ".join(dict.fromkeys(f"{x / 1e6:.2f}" for x in (min(v), max(v))))  # noqa: E731
    theirs = f", not {span(dsl)} M" if dsl else ""
    return ["### 3. The DiHAL rows", "", "Bridges of the tiny demo's sweep protocol (d 64 x 2 blocks, cap 400 steps x 16 "
            "blocks x 33 tokens, three seeds), each sampled with the hybrid sampler at 32 evaluations; 32 samples of "
            "32 words, scored from the HMM's state distributions at words 0 and 32 (where their blocks start).", "",
            f"These samples are half as long as the DSL rows' (32 words, not 64) and their models trained on "
            f"{span(spent)} M tokens{theirs}: their numbers are comparable with each "
            "other, not with the tables above.", "",
            "| generator | stopped by its plateau | training tokens used (mean) | oracle NLL, nats/word | "
            "bigram TV (its floor) | diversity |", "|---|---|---|---|---|---|", *table, ""]


if __name__ == "__main__":
    main()
