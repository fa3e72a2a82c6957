"""The DSL paper's comparisons on the testbed, trained to convergence, with seeds: docs/testbed.md.

    make results-testbed          # = python examples/testbed_results.py --out runs/testbed --page docs/testbed.md

Resumable: every model and every sample set is a folder of its own that a rerun reuses (a model
with metrics.json is done; a sample set with scores.json is done), so a killed run continues
where it stopped. Three stages, each a plain loop over library calls:

1. training: DSL (mixed SNR), MDLM (endpoint SNR), MDLM -> DSL (the converged MDLM fine-tuned with
   the mixed SNR) and DSL initialised from the testbed itself (`--init-from builtin:hmm-tiny`),
   SEEDS each, each until its held-out bound plateaus (`PLATEAU`) under a step cap;
2. every sampler at every number of steps on every converged model, scored by the exact HMM;
   the hybrid's switch SNR swept once;
3. the DiHAL rows: a bridge at every layer of the testbed (the sweep's protocol), sampled with
   the hybrid sampler, and the layer-0 rounding baseline, scored the same way.

The page's protocol (what is compared, how, and what counts as a difference) is written in
docs/testbed.md above the generated results; this script only fills in the results.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from geoprobe.testbed import CORPUS  # noqa: E402

MODEL = "builtin:hmm-tiny"
SEEDS = (0, 1, 2)
SEQ_LEN = 65  # one 64-word document and its <eos> per row: every training row starts at a document start
LENGTH = 65  # samples as long as a row: 64 words and the end of the document
NUM = 32  # samples per set
STEPS = (4, 8, 16, 32, 64)
SAMPLERS = ("mdlm", "remdm-cap", "remdm-loop", "roar", "continuous", "hybrid")
SWITCH_SNRS = (1.0, 2.0, 5.0, 10.0, 20.0)
# the convergence rule: the MDLM bound of the EMA weights on held-out rows every EVAL steps; stop
# when the best of the last 20 % of steps (at least 5 evaluations) is less than 0.5 % better than
# the value before them, never before MIN_STEPS; the best evaluation's weights are kept
EVAL, PLATEAU, MIN_STEPS = 50, 0.005, 300
SMALL = dict(d_model=64, n_layers=2, n_heads=4, d_tok=64)
TRAINING = dict(batch_size=32, seq_len=SEQ_LEN, lr=2e-3, warmup=50, eval_every=EVAL, plateau_rel=PLATEAU,
                min_steps=MIN_STEPS, save_every=100, ema=0.995)
VARIANTS = {  # name: (snr, steps cap, what it starts from, lr)
    "dsl": ("mixed", 4000, None, 2e-3),
    "mdlm": ("endpoint", 4000, None, 2e-3),
    "mdlm-dsl": ("mixed", 2000, "mdlm", 1e-3),
    "dsl-init": ("mixed", 800, MODEL, 5e-4),
}
HELD_OUT_DOCS, HELD_OUT_SEED = 256, 99  # the testbed's own held-out documents (geoprobe.testbed.held_out_nll)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- stage 1: training ------------------------------------------------------------------------

def train_variant(out: Path, name: str, seed: int) -> dict:
    from bridges.dsl import dsl_settings, fit_dsl

    folder = out / "models" / f"{name}-seed{seed}"
    if (folder / "metrics.json").is_file():
        return json.loads((folder / "metrics.json").read_text())
    snr, cap, start, lr = VARIANTS[name]
    settings, shape = dsl_settings(**{**TRAINING, "lr": lr}, snr=snr, steps=cap, seed=seed, **SMALL)
    init = out / "models" / f"{start}-seed{seed}" if start == "mdlm" else None
    began = time.perf_counter()
    metrics = fit_dsl(folder, CORPUS, MODEL, settings, shape, init=init,
                      init_from=start if start == MODEL else None, device="cpu")
    log(f"trained {name} seed {seed}: {metrics['steps_run']} steps ({metrics['stop']}), "
        f"{time.perf_counter() - began:.0f} s")
    return metrics


def held_out_bound(folder: Path) -> dict:
    """The MDLM bound (nats per word) on the testbed's held-out documents, beside the exact HMM
    NLL of the same documents."""
    import torch

    from bridges.dsl import load_dsl
    from bridges.likelihood import mdlm_elbo
    from bridges.tokens import load_saved_tokenizer
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

def score_samples(folder: Path, model: Path, sampler: str, steps: int, switch_snr: float = 5.0,
                  decode: str = "stack", length: int = LENGTH, start: str = "document") -> dict:
    from geoprobe.generate import SampleSettings, generate
    from geoprobe.metrics.text import text_metrics
    from geoprobe.synthetic import hmm_from_spec, oracle_scores

    cached = folder / "scores.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    if folder.exists():  # an interrupted set: its samples may be from the middle of a write
        import shutil

        shutil.rmtree(folder)
    settings = SampleSettings(num=NUM, length=length, steps=steps, switch_snr=switch_snr, decode=decode)
    result = generate(model, sampler, settings, folder, "cpu")
    texts = [r["text"] for r in result["samples"]]
    scores = {**oracle_scores(hmm_from_spec(CORPUS), texts, start=start), **text_metrics(texts),
              "nfe": result["meta"]["nfe"], "seconds_per_sample": result["meta"]["seconds"] / NUM,
              "words_per_sample": float(np.mean([len(t.split()) for t in texts]))}
    cached.write_text(json.dumps(scores))
    return scores


def sampler_grid(out: Path) -> list[dict]:
    rows = []
    for name in VARIANTS:
        for seed in SEEDS:
            model = out / "models" / f"{name}-seed{seed}"
            for sampler in SAMPLERS:
                for steps in STEPS:
                    if sampler == "hybrid" and steps < 4:
                        continue
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
    from geoprobe.demo import TINY
    from geoprobe.geometry import GeometrySettings
    from geoprobe.pipeline import scan, scan_config
    from geoprobe.sweep import bridge_dir, bridge_settings, sweep_run

    run = out / "run"
    p = TINY
    if not (run / "ranking.csv").is_file():
        scan(run, scan_config(MODEL, CORPUS, p.doc_blocks, tokens=p.tokens, seq_len=p.seq_len, positions=p.positions,
                              device="cpu"),
             GeometrySettings(k=p.k, anchors=p.anchors, pairs=p.pairs, bootstrap=p.bootstrap))
    settings = bridge_settings(steps=p.bridge_steps, batch_size=p.bridge_batch, seq_len=p.bridge_seq,
                               d_model=p.bridge_width, n_layers=p.bridge_blocks, lr=p.bridge_lr,
                               eval_every=p.bridge_eval_every)
    if not (run / "sweep.json").is_file():
        sweep_run(run, settings, "0-5", "cpu", seeds=list(SEEDS))
    rows = []
    length = p.bridge_seq - 1  # a bridge generates the words after its block's BOS
    for layer in range(6):
        for seed in SEEDS:
            folder = out / "samples" / f"bridge-{layer}-seed{seed}" / "hybrid-32"
            rows.append({"model": f"bridge layer {layer}", "seed": seed, "sampler": "hybrid", "steps": 32,
                         **score_samples(folder, bridge_dir(run, layer, seed), "hybrid", 32, length=length,
                                           start="anywhere")})
    for seed in SEEDS:
        folder = out / "samples" / f"round-seed{seed}" / "mdlm-32"
        rows.append({"model": "layer-0 rounding", "seed": seed, "sampler": "mdlm", "steps": 32,
                     **score_samples(folder, bridge_dir(run, 0, seed), "mdlm", 32, decode="round", length=length,
                                    start="anywhere")})
    log("sampled the bridges")
    return rows, json.loads((run / "sweep.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/testbed"))
    parser.add_argument("--page", type=Path, default=ROOT / "docs" / "testbed.md")
    parser.add_argument("--stages", default="1,2,3", help="which stages to run (the page shows what exists)")
    args = parser.parse_args()
    stages = set(args.stages.split(","))
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    trained = {}
    if "1" in stages:
        for name in VARIANTS:  # MDLM before MDLM -> DSL, which starts from it
            for seed in SEEDS:
                trained[(name, seed)] = {**train_variant(out, name, seed),
                                         **held_out_bound(out / "models" / f"{name}-seed{seed}")}
        (out / "training.json").write_text(json.dumps({f"{n}-seed{s}": v for (n, s), v in trained.items()}))
    samples = sampler_grid(out) if "2" in stages else []
    if samples:
        (out / "samples.json").write_text(json.dumps(samples))
    bridges, sweep = dihal_rows(out) if "3" in stages else ([], None)
    if bridges:
        (out / "bridges.json").write_text(json.dumps(bridges))
    log(f"done in {time.perf_counter() - began:.0f} s; writing {args.page}")
    write_page(out, args.page)


def write_page(out: Path, page: Path) -> None:
    """The results section of docs/testbed.md (below its protocol) from the stored results."""
    raise NotImplementedError


if __name__ == "__main__":
    main()
