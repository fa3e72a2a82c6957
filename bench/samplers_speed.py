"""Samplers on one tiny DSL model (untrained weights: speed does not depend on them).

Per sampler: tokens/s and NFE at length 128; the gain of skipping unchanged states (mdlm with
more steps than tokens: many steps reveal nothing, so the denoiser input is unchanged); and
ROAR (one token per step, a full bidirectional pass each) against plain autoregressive decoding
of a same-size causal transformer with a KV cache (transformers' `generate`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import transformers

from geoprobe.bridges.dsl import DSLConfig, DSLModel
from geoprobe.samplers import make_sampler

V, D, LAYERS, HEADS, LENGTH, NUM = 4096, 256, 4, 4, 128, 8


def main():
    model = DSLModel(DSLConfig(vocab_size=V, d_tok=64, d_model=D, n_layers=LAYERS, n_heads=HEADS)).eval()
    rows = []
    for name, opts in [("mdlm", {"steps": 64}), ("remdm-cap", {"steps": 64}), ("remdm-rescale", {"steps": 64}),
                       ("remdm-loop", {"steps": 64}), ("roar", {}), ("roar", {"per_step": 4}),
                       ("continuous", {"steps": 64}), ("hybrid", {"steps": 48})]:
        make_sampler(name, **opts).sample(model, 1, 8, seed=0)  # warm-up
        result = make_sampler(name, **opts).sample(model, NUM, LENGTH, seed=0)
        label = name + (f" (per-step {opts['per_step']})" if "per_step" in opts else "")
        rows.append((label, result.nfe, NUM * LENGTH / result.seconds, result.seconds))
    print(f"DSL d_model={D}, {LAYERS} layers, V={V}, {NUM} samples x {LENGTH} tokens, "
          f"torch threads {torch.get_num_threads()}")
    print(f"{'sampler':28s} {'NFE':>5s} {'tok/s':>9s} {'seconds':>8s}")
    for label, nfe, rate, secs in rows:
        print(f"{label:28s} {nfe:5d} {rate:9.1f} {secs:8.3f}")

    for steps in (64, 256):
        cached = make_sampler("mdlm", steps=steps).sample(model, NUM, 64, seed=1)
        uncached = make_sampler("mdlm", steps=steps, cache=False).sample(model, NUM, 64, seed=1)
        assert torch.equal(cached.tokens, uncached.tokens)
        print(f"mdlm {steps:3d} steps x 64 tokens, cached  : NFE {cached.nfe:4d}, rows {cached.rows:5d}, "
              f"{cached.seconds:.3f} s")
        print(f"mdlm {steps:3d} steps x 64 tokens, uncached: NFE {uncached.nfe:4d}, rows {uncached.rows:5d}, "
              f"{uncached.seconds:.3f} s   saving {uncached.seconds / cached.seconds:.2f}x (identical samples)")

    config = transformers.LlamaConfig(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                      num_key_value_heads=HEADS, intermediate_size=int(D * 4 * 2 / 3),
                                      vocab_size=V, max_position_embeddings=LENGTH + 8)
    torch.manual_seed(0)
    ar = transformers.AutoModelForCausalLM.from_config(config).eval()
    prompt = torch.ones(NUM, 1, dtype=torch.long)
    options = dict(do_sample=True, use_cache=True, pad_token_id=0, eos_token_id=None,
                   attention_mask=torch.ones_like(prompt))
    with torch.no_grad():
        ar.generate(prompt, max_new_tokens=8, **options)
        start = time.perf_counter()
        ar.generate(prompt, max_new_tokens=LENGTH, min_new_tokens=LENGTH, **options)
        ar_seconds = time.perf_counter() - start
    roar = make_sampler("roar").sample(model, NUM, LENGTH, seed=2)
    print(f"causal AR + KV cache    : {NUM * LENGTH / ar_seconds:9.1f} tok/s ({ar_seconds:.3f} s)")
    print(f"roar, one token per step: {NUM * LENGTH / roar.seconds:9.1f} tok/s ({roar.seconds:.3f} s)   "
          f"ratio roar/AR = {ar_seconds / roar.seconds:.3f}")


if __name__ == "__main__":
    main()
