"""The demo: what is meaningful on a laptop, end to end, as the library calls the commands make.

`geoprobe demo` (`make demo`): the SmolLM2 scan on the KJV (the ranking with and without its
massive channels, and the warning about them), then the testbed's experiment (what `geoprobe
demo --tiny` runs alone: the testbed's scan, the sweep's pre-registered verdict with two seeds
per layer, and DSL, MDLM, bridges (the chosen one also decoded left to right), the rounding
baseline and the AR ceiling compared at one budget, every row scored by the exact HMM with its interval), then one report whose first lines
say what was found and how sure it is. The whole SmolLM2 pipeline (bridges and DSL on the real
model) is `make results` (docs/results.md): at a laptop's budget its generators write word
salad, which a demo should not present as a result.

Each step is the one library call its command makes, with the settings classes' defaults for
every flag the demo does not set, so it computes what the commands would.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from geoprobe.bridges.dsl import dsl_settings, fit_dsl
from geoprobe.assets import builtin_model, testbed_cached
from geoprobe.backbone import resolve_device
from geoprobe.files import holding, read_json
from geoprobe.geometry import GeometrySettings
from geoprobe.store import check_writable
from geoprobe.testbed import CORPUS
from geoprobe.workflows.evaluate import evaluate_samples
from geoprobe.workflows.generate import SampleSettings, generate
from geoprobe.workflows.sweep import bridge_dir, bridge_settings, parse_seeds, sweep_run


@dataclass(frozen=True)
class DemoSettings:
    """The testbed experiment's settings (the flags its commands would be given)."""
    model: str
    tokens: int
    seq_len: int
    positions: str
    doc_blocks: int
    k: int
    anchors: int
    pairs: int
    bootstrap: int
    layers: str
    seeds: str  # the sweep's replicates
    bridge_steps: int
    bridge_batch: int
    bridge_seq: int
    bridge_width: int
    bridge_blocks: int
    bridge_lr: float
    bridge_eval_every: int
    dsl_steps: int
    dsl_batch: int
    dsl_seq: int
    dsl_width: int
    dsl_lr: float
    num: int
    length: int
    steps: int
    curve: tuple[int, ...]


# Every generator in the comparison has one training budget (cap steps x batch x seq_len tokens):
# the DSL and MDLM models train for exactly that; the sweep's bridges may stop earlier, when their
# validation nmse plateaus (compare shows the tokens each one used).
TINY = DemoSettings(model="builtin:hmm-tiny", tokens=2000, seq_len=65, positions="random:16",
                    doc_blocks=0, k=16, anchors=512, pairs=1024, bootstrap=100, layers="0-5", seeds="0,1",
                    bridge_steps=400, bridge_batch=16, bridge_seq=33, bridge_width=64, bridge_blocks=2,
                    bridge_lr=2e-3, bridge_eval_every=20, dsl_steps=400, dsl_batch=16,
                    dsl_seq=33, dsl_width=64, dsl_lr=2e-3, num=32, length=32, steps=32, curve=(8, 16))
# the SmolLM2 scan's 4,000 states: 64 random positions from the first block of each of 63 KJV
# chapters (in the seeded document order), so that its intervals resample documents
SMOLLM2_SCAN = dict(model="builtin:smollm2", corpus="kjv", doc_blocks=1, tokens=4000, seq_len=256,
                    positions="random:64")
SMOLLM2_GEOMETRY = dict(k=32, anchors=2048, pairs=4096, bootstrap=200)

DSL_SAMPLERS = ("mdlm", "remdm-loop", "roar", "hybrid")
# Seconds each kind of step took on 2 CPU cores (a clean clone's `make demo`): the estimate of
# what remains is these, scaled by how fast this machine has been so far.
EXPECTED = {"train the testbed": 210.0, "scan builtin:smollm2": 150.0, "scan builtin:hmm-tiny": 3.0, "sweep": 230.0,
            "dsl train": 6.0, "sample": 0.6, "eval": 15.0, "compare": 1.0, "report": 4.0}


class Steps:
    """Runs the demo's steps, timing each, and tells `on_step(what, seconds, remaining)` after
    each one, `remaining` being the estimate in seconds of what is left (EXPECTED, scaled)."""

    def __init__(self, kinds: list[str], on_step: Callable | None):
        self.left, self.on_step = list(kinds), on_step
        self.done_expected, self.began = 0.0, time.perf_counter()

    def __call__(self, what: str, call, *args, **kwargs):
        started = time.perf_counter()
        result = call(*args, **kwargs)
        kind = next((k for k in EXPECTED if what.startswith(k)), None)
        if kind in self.left:
            self.left.remove(kind)
        self.done_expected += EXPECTED.get(kind, 0.0)
        if self.on_step is not None:
            pace = (time.perf_counter() - self.began) / self.done_expected if self.done_expected else 1.0
            self.on_step(what, time.perf_counter() - started, pace * sum(EXPECTED[k] for k in self.left))
        return result


def testbed_steps(cached: bool) -> list[str]:
    """The kinds of step of the testbed experiment, in order (for the estimate of what remains)."""
    # DSL, MDLM, bridges, the chosen bridge left to right, rounding, AR
    samples = len(DSL_SAMPLERS) * (1 + len(TINY.curve)) + 1 + 3 + 1 + 1 + 1
    return (["train the testbed"] * (not cached) + ["scan builtin:hmm-tiny", "sweep", "dsl train", "dsl train"]
            + ["sample"] * samples + ["eval", "compare", "report"])


def run_demo(out: Path, tiny: bool = False, device: str = "auto",
             on_step: Callable[[str, float, float], None] | None = None) -> dict:
    """Run the demo into `out`: the SmolLM2 scan (unless `tiny`) and the testbed experiment, then
    the report. Returns the summary: report path, its first lines (what was found), the sweep's
    verdict and one row per generator. `on_step(what, seconds, remaining)` is called after each
    step, `what` being the command it stands for and `remaining` an estimate in seconds."""

    resolve_device(device)
    check_writable(out)
    with holding(Path(out), "geoprobe demo"):
        out.mkdir(parents=True, exist_ok=True)
        kinds = testbed_steps(testbed_cached())
        if tiny:
            steps = Steps(kinds, on_step)
            return testbed_experiment(out, device, steps)
        steps = Steps(["scan builtin:smollm2", *kinds, "report"], on_step)
        smollm2 = smollm2_scan(out / "smollm2", device, steps)
        testbed = testbed_experiment(out / "testbed", device, steps)
        from geoprobe.workflows.page import write_demo_report

        path, found = steps("report", write_demo_report, out, smollm2, out / "testbed" / "run")
        return {**testbed, "report": str(path), "testbed_report": testbed["report"], "found": found,
                "smollm2_run": str(smollm2)}


def smollm2_scan(run: Path, device: str, steps: Steps) -> Path:
    from geoprobe.pipeline import scan, scan_config

    s = dict(SMOLLM2_SCAN)
    steps(f"scan {s.pop('model')}", scan, run, scan_config("builtin:smollm2", s.pop("corpus"), s.pop("doc_blocks"),
                                                           device=device, **s), GeometrySettings(**SMOLLM2_GEOMETRY))
    return run


def testbed_experiment(out: Path, device: str, step: Steps) -> dict:
    """scan → sweep → DSL and MDLM training → every sampler, the chosen, worst and oracle bridges
    (random order), the chosen bridge left to right and the rounding baseline → eval → compare →
    report, on the testbed (`geoprobe demo --tiny`)."""
    from geoprobe.pipeline import scan, scan_config
    from geoprobe.workflows.compare import compare_run, read_rows
    from geoprobe.workflows.page import write_report

    p = TINY
    seeds = parse_seeds(p.seeds)
    corpus, model, run = CORPUS, p.model, out / "run"
    out.mkdir(parents=True, exist_ok=True)
    if not testbed_cached():
        step("train the testbed", builtin_model, model.split(":", 1)[1])
    step(f"scan {model}", scan, run, scan_config(model, corpus, p.doc_blocks, tokens=p.tokens, seq_len=p.seq_len,
                                                 positions=p.positions, device=device),
         GeometrySettings(k=p.k, anchors=p.anchors, pairs=p.pairs, bootstrap=p.bootstrap))
    bridges = bridge_settings(steps=p.bridge_steps, batch_size=p.bridge_batch, seq_len=p.bridge_seq,
                              d_model=p.bridge_width, n_layers=p.bridge_blocks, lr=p.bridge_lr,
                              eval_every=p.bridge_eval_every)
    step(f"sweep --layers {p.layers}", sweep_run, run, bridges, p.layers, device=device, seeds=seeds)
    sweep = read_json(run / "sweep.json", f"{run} has no sweep.json: the sweep step did not finish")["verdict"]
    for name, snr in {"dsl": "mixed", "mdlm": "endpoint"}.items():  # DSL, and the endpoint-only MDLM model
        settings, shape = dsl_settings(snr=snr, steps=p.dsl_steps, batch_size=p.dsl_batch, seq_len=p.dsl_seq,
                                       lr=p.dsl_lr, d_model=p.dsl_width, n_layers=2)
        step(f"dsl train --snr {snr}", fit_dsl, out / name, corpus, model, settings=settings, shape=shape,
             device=device)
    table = {f"dsl-{s}": (out / "dsl", s, "stack") for s in DSL_SAMPLERS}
    table["mdlm-mdlm"] = (out / "mdlm", "mdlm", "stack")
    for role in ("chosen", "worst", "oracle"):  # the same layer may play two roles: one row
        layer = sweep[role + "_layer"]  # the first seed's bridge
        table[f"bridge-{layer:02d}"] = (bridge_dir(run, layer, seeds[0]), "hybrid", "stack")
    # the chosen bridge decoded as its causal upper stack reads: one token a step over the prefix
    table[f"bridge-{sweep['chosen_layer']:02d}-ltr"] = (bridge_dir(run, sweep["chosen_layer"], seeds[0]), "ltr", "stack")
    table["round-00"] = (bridge_dir(run, 0, seeds[0]), "mdlm", "round")
    files, curve = [], []
    for name, (source, sampler, decode) in table.items():
        for steps in (p.steps, *(p.curve if name.startswith("dsl-") else ())):  # DSL: also at fewer steps
            folder = out / "samples" / (name if steps == p.steps else f"{name}-steps{steps}")
            # ltr's budget is one step per token
            settings = SampleSettings(num=p.num, length=p.length, steps=None if sampler == "ltr" else steps,
                                      decode=decode)
            step(f"sample {name} --steps {steps}", generate, source, sampler, settings, folder, device)
            (files if steps == p.steps else curve).append(folder / "samples.jsonl")
    ceiling = SampleSettings(num=p.num, length=p.length)
    step("sample --sampler ar", generate, model, "ar", ceiling, out / "samples" / "ar", device)  # the ceiling
    files.append(out / "samples" / "ar" / "samples.jsonl")
    step("eval", evaluate_samples, files + curve, model, corpus, None, device=device)  # one evaluator load
    step("compare", compare_run, files, run, curve=curve)
    path = step("report", write_report, run)
    return {"report": str(path), "chosen_layer": sweep["chosen_layer"], "oracle_layer": sweep["oracle_layer"],
            "worst_layer": sweep["worst_layer"], "verdict": sweep,
            "generation": [{k: r.get(k) for k in ("generator", "sampler", "evaluator", "gen_ppl", "gen_ppl_lo",
                                                  "gen_ppl_hi", "own_evaluator", "mauve", "oracle_nll_per_word",
                                                  "oracle_nll_lo", "oracle_nll_hi", "budget")}
                           for r in read_rows(run / "compare.csv")]}
