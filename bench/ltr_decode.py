"""Left-to-right decoding through a bridge (`--sampler ltr`): a bidirectional bridge, whose prefix
is reconstructed every step, against a causal one, whose prefix and upper-stack keys and values
are kept (bridges/decode.py), on the testbed (builtin:hmm-tiny and its HMM corpus).

Per training seed, two bridges at one layer, trained alike (the tiny demo's network and
optimiser, TINY, for exactly its step cap) except for their attention. Per row: tokens/s of the
sampler (best of `--repeats`, after a warm-up) and the exact NLL per word of its samples under
the HMM, mean ± standard error over samples. Beside them: the causal bridge decoded without its
cache (its tokens are the cached decoding's: tests/test_decode.py), the random-order `hybrid`
sampler at the demo's budget with and without the channel evidence (`--decode stack` and
`stack-only`), the AR ceiling (the testbed model itself) and the HMM's own samples.

    python bench/ltr_decode.py [--layer 3] [--seeds 0,1] [--num 64] [--length 32] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from geoprobe.assets import builtin_model
from geoprobe.bridges.hidden import FIRST_DIFFUSION, HybridDenoiser
from geoprobe.synthetic import hmm_from_spec, oracle_scores, parse_spec, reference_sample_scores
from geoprobe.testbed import CORPUS
from geoprobe.workflows.demo import TINY
from geoprobe.workflows.evaluate import oracle_start_for
from geoprobe.workflows.generate import SampleSettings, generate
from geoprobe.workflows.sweep import bridge_dir, bridge_run, bridge_settings


def train(out: Path, layer: int, seed: int, attention: str) -> Path:
    """The bridge at `layer` with the tiny demo's settings, for exactly its step cap."""
    p = TINY
    settings = bridge_settings(steps=p.bridge_steps, batch_size=p.bridge_batch, seq_len=p.bridge_seq,
                               d_model=p.bridge_width, n_layers=p.bridge_blocks, lr=p.bridge_lr,
                               eval_every=p.bridge_eval_every, until="steps", seed=seed, attention=attention,
                               **FIRST_DIFFUSION)  # the bridge of bench/README's table (2026-12-06)
    root = out / attention
    if not (bridge_dir(root, layer, seed) / "metrics.json").is_file():
        bridge_run(settings, layer, model=p.model, corpus=CORPUS, out=root, device="cpu")
    return bridge_dir(root, layer, seed)


LEFT_TO_RIGHT = HybridDenoiser.left_to_right


def recomputed(self, num, length, generator=None, cached=None):
    """HybridDenoiser.left_to_right, the prefix reconstructed every step whatever the bridge."""
    return LEFT_TO_RIGHT(self, num, length, generator, cached=False)


def sampled(model, sampler: str, folder: Path, args, decode: str = "stack", repeats: int = 1,
            uncached: bool = False) -> dict:
    """The row's samples (best time of `repeats`, after a warm-up), scored by the HMM."""
    settings = SampleSettings(num=args.num, length=args.length, steps=args.length if sampler == "ltr" else TINY.steps,
                              decode=decode)
    with mock.patch.object(HybridDenoiser, "left_to_right", recomputed) if uncached else nullcontext():
        generate(model, sampler, SampleSettings(num=2, length=4, steps=4, decode=decode), folder / "warm-up", "cpu")
        seconds = min(generate(model, sampler, settings, folder, "cpu")["meta"]["seconds"] for _ in range(repeats))
    rows = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    meta = json.loads((folder / "samples.meta.jsonl").read_text().splitlines()[-1])
    length = parse_spec(CORPUS)["length"]
    scores = oracle_scores(HMM, [r["text"] for r in rows], oracle_start_for(folder / "samples.jsonl", length), length,
                           meta["eos"])
    nll = [v for v in scores["oracle_nll_per_sample"] if math.isfinite(v)]
    return {"tokens_per_s": args.num * args.length / seconds, "nll": float(np.mean(nll)),
            "se": float(np.std(nll, ddof=1) / math.sqrt(len(nll))), "invalid": scores["oracle_invalid"]}


HMM = hmm_from_spec(CORPUS)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layer", type=int, default=3)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--num", type=int, default=64)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("/tmp/geoprobe-bench-ltr"))
    args = parser.parse_args()
    builtin_model(TINY.model.split(":", 1)[1])  # trains the testbed on first use
    rows: dict[str, list[dict]] = {}
    for seed in (int(s) for s in args.seeds.split(",")):
        bridges = {a: train(args.out, args.layer, seed, a) for a in ("bidirectional", "causal")}
        samples = args.out / f"samples-{seed}"
        table = {"ltr, bidirectional (recomputed)": (bridges["bidirectional"], "ltr", "stack", False),
                 "ltr, causal (cached)": (bridges["causal"], "ltr", "stack", False),
                 "ltr, causal (recomputed)": (bridges["causal"], "ltr", "stack", True)}
        for attention, folder in bridges.items():
            for decode in ("stack", "stack-only"):
                table[f"hybrid {TINY.steps} steps, {attention}, --decode {decode}"] = (folder, "hybrid", decode, False)
        for name, (folder, sampler, decode, uncached) in table.items():
            where = samples / name.replace(" ", "_").replace(",", "").replace("(", "").replace(")", "")
            repeats = args.repeats if sampler == "ltr" else 1
            rows.setdefault(name, []).append(sampled(folder, sampler, where, args, decode, repeats, uncached))
    ar = args.out / "samples-ar"
    generate(TINY.model, "ar", SampleSettings(num=args.num, length=args.length), ar, "cpu")
    text = [json.loads(l)["text"] for l in (ar / "samples.jsonl").read_text().splitlines()]
    length = parse_spec(CORPUS)["length"]
    ar_scores = oracle_scores(HMM, text, oracle_start_for(ar / "samples.jsonl", length), length,
                              json.loads((ar / "samples.meta.jsonl").read_text().splitlines()[-1])["eos"])
    ar_tps = json.loads((ar / "samples.meta.jsonl").read_text().splitlines()[-1])["tokens_per_second"]
    print(f"testbed builtin:hmm-tiny, bridges at layer {args.layer} (TINY: width {TINY.bridge_width}, "
          f"{TINY.bridge_blocks} blocks, {TINY.bridge_steps} steps), seeds {args.seeds}; {args.num} samples x "
          f"{args.length} tokens; torch threads {torch.get_num_threads()}")
    print(f"{'row':52s} {'tokens/s':>9s}  {'HMM NLL/word (seeds: mean ± se)':s}")
    for name, per_seed in rows.items():
        rate = np.mean([r["tokens_per_s"] for r in per_seed])
        cells = "  ".join(f"{r['nll']:.3f} ± {r['se']:.3f}" + (f" ({r['invalid']} invalid)" if r["invalid"] else "")
                          for r in per_seed)
        print(f"{name:52s} {rate:9.0f}  {cells}")
    print(f"{'AR ceiling (the testbed itself, KV cache)':52s} {ar_tps:9.0f}  {ar_scores['oracle_nll_per_word']:.3f}")
    print(f"{'the HMM own samples':52s} {'':9s}  {reference_sample_scores(HMM, args.length)['hmm']:.3f}")


if __name__ == "__main__":
    main()
