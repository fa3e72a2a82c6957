"""The demo: the whole pipeline end to end, as the commands a user would type.

scan → sweep → DSL and MDLM training → every sampler (and, on the testbed, the chosen, worst
and oracle bridges and the rounding baseline) → eval → compare → report. Each step is the one
library call its command makes, with the settings classes' defaults for every flag the demo does
not set, so it computes what the commands would; `geoprobe demo` makes this one call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from geoprobe.files import read_json



@dataclass(frozen=True)
class DemoSettings:
    model: str
    corpus: str | None  # None: the testbed's own corpus
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
    dsl_tokenizer: str | None  # None: the backbone's tokenizer
    dsl_steps: int
    dsl_batch: int
    dsl_seq: int
    dsl_width: int
    dsl_lr: float
    num: int
    length: int
    steps: int
    curve: tuple[int, ...]
    bridges_compared: bool


# Every generator in the comparison has one training budget (cap steps x batch x seq_len tokens):
# the DSL and MDLM models train for exactly that; the sweep's bridges may stop earlier, when their
# validation nmse plateaus (compare shows the tokens each one used). SmolLM2 bridges sample through
# the 49k-token converter, many minutes on a CPU, so the full demo compares them only in the sweep.
TINY = DemoSettings(model="builtin:hmm-tiny", corpus=None, tokens=2000, seq_len=65, positions="random:16",
                    doc_blocks=0, k=16, anchors=512, pairs=1024, bootstrap=100, layers="0-5", seeds="0,1",
                    bridge_steps=400, bridge_batch=16, bridge_seq=33, bridge_width=64, bridge_blocks=2,
                    bridge_lr=2e-3, bridge_eval_every=20, dsl_tokenizer=None, dsl_steps=400, dsl_batch=16,
                    dsl_seq=33, dsl_width=64, dsl_lr=2e-3, num=32, length=32, steps=32, curve=(8, 16),
                    bridges_compared=True)
# the real demo's 4,000 states: 64 random positions from the first block of each of 63 chapters
# (in the seeded document order), not every position of 16 blocks from 6 chapters: its intervals
# resample documents
REAL = DemoSettings(model="builtin:smollm2", corpus="kjv", tokens=4000, seq_len=256, positions="random:64",
                    doc_blocks=1, k=32, anchors=2048, pairs=4096, bootstrap=200, layers="0-5", seeds="0,1",
                    bridge_steps=40, bridge_batch=4, bridge_seq=64, bridge_width=64, bridge_blocks=1,
                    bridge_lr=1e-3, bridge_eval_every=10, dsl_tokenizer="train:2048", dsl_steps=300, dsl_batch=8,
                    dsl_seq=64, dsl_width=128, dsl_lr=3e-4, num=64, length=64, steps=64, curve=(16, 32),
                    bridges_compared=False)

DSL_SAMPLERS = ("mdlm", "remdm-loop", "roar", "hybrid")


def run_demo(out: Path, tiny: bool = False, device: str = "auto",
             on_step: Callable[[str, float], None] | None = None) -> dict:
    """Run the demo into `out` (the testbed when `tiny`, else SmolLM2 on the KJV); the summary:
    report path, chosen/oracle/worst layers, the sweep's verdict and one row per generator.
    `on_step(what, seconds)` is called after each step, `what` being the command it stands for."""
    from bridges.dsl import dsl_settings, fit_dsl
    from geoprobe.backbone import resolve_device
    from geoprobe.generate import SampleSettings, generate
    from geoprobe.geometry import GeometrySettings
    from geoprobe.metrics.evaluator import evaluate_samples
    from geoprobe.pipeline import scan, scan_config
    from geoprobe.report.compare import compare_run, read_rows
    from geoprobe.report.page import write_report
    from geoprobe.store import check_writable
    from geoprobe.sweep import bridge_dir, bridge_settings, parse_seeds, sweep_run
    from geoprobe.testbed import CORPUS

    resolve_device(device)
    check_writable(out)
    p = TINY if tiny else REAL
    seeds = parse_seeds(p.seeds)
    corpus, model, run = p.corpus or CORPUS, p.model, out / "run"
    out.mkdir(parents=True, exist_ok=True)

    def step(what: str, call, *args, **kwargs):
        started = time.perf_counter()
        result = call(*args, **kwargs)
        if on_step is not None:
            on_step(what, time.perf_counter() - started)
        return result

    step(f"scan {model}", scan, run, scan_config(model, corpus, p.doc_blocks, tokens=p.tokens, seq_len=p.seq_len,
                                                 positions=p.positions, device=device),
         GeometrySettings(k=p.k, anchors=p.anchors, pairs=p.pairs, bootstrap=p.bootstrap))
    bridges = bridge_settings(steps=p.bridge_steps, batch_size=p.bridge_batch, seq_len=p.bridge_seq,
                              d_model=p.bridge_width, n_layers=p.bridge_blocks, lr=p.bridge_lr,
                              eval_every=p.bridge_eval_every)
    step(f"sweep --layers {p.layers}", sweep_run, run, bridges, p.layers, device, seeds=seeds)
    sweep = read_json(run / "sweep.json", f"{run} has no sweep.json: the sweep step did not finish")["verdict"]
    for name, snr in {"dsl": "mixed", "mdlm": "endpoint"}.items():  # DSL, and the endpoint-only MDLM model
        settings, shape = dsl_settings(snr=snr, steps=p.dsl_steps, batch_size=p.dsl_batch, seq_len=p.dsl_seq,
                                       lr=p.dsl_lr, d_model=p.dsl_width, n_layers=2)
        step(f"dsl train --snr {snr}", fit_dsl, out / name, corpus, p.dsl_tokenizer or model, settings, shape,
             device=device)
    table = {f"dsl-{s}": (out / "dsl", s, "stack") for s in DSL_SAMPLERS}
    table["mdlm-mdlm"] = (out / "mdlm", "mdlm", "stack")
    if p.bridges_compared:
        for role in ("chosen", "worst", "oracle"):  # the same layer may play two roles: one row
            layer = sweep[role + "_layer"]  # the first seed's bridge
            table[f"bridge-{layer:02d}"] = (bridge_dir(run, layer, seeds[0]), "hybrid", "stack")
        table["round-00"] = (bridge_dir(run, 0, seeds[0]), "mdlm", "round")
    files, curve = [], []
    for name, (source, sampler, decode) in table.items():
        for steps in (p.steps, *(p.curve if name.startswith("dsl-") else ())):  # DSL: also at fewer steps
            folder = out / "samples" / (name if steps == p.steps else f"{name}-steps{steps}")
            settings = SampleSettings(num=p.num, length=p.length, steps=steps, decode=decode)
            step(f"sample {name} --steps {steps}", generate, source, sampler, settings, folder, device)
            (files if steps == p.steps else curve).append(folder / "samples.jsonl")
    ceiling = SampleSettings(num=p.num, length=p.length)
    step("sample --sampler ar", generate, model, "ar", ceiling, out / "samples" / "ar", device)  # the ceiling
    files.append(out / "samples" / "ar" / "samples.jsonl")
    step("eval", evaluate_samples, files + curve, model, corpus, None, device=device)  # one evaluator load
    step("compare", compare_run, files, run, curve=curve)
    path = write_report(run)
    return {"report": str(path), "chosen_layer": sweep["chosen_layer"], "oracle_layer": sweep["oracle_layer"],
            "worst_layer": sweep["worst_layer"], "verdict": sweep,
            "generation": [{k: r.get(k) for k in ("generator", "sampler", "evaluator", "gen_ppl", "gen_ppl_lo",
                                                  "gen_ppl_hi", "own_evaluator", "mauve", "oracle_nll_per_word",
                                                  "oracle_nll_lo", "oracle_nll_hi", "budget")}
                           for r in read_rows(run / "compare.csv")]}
