"""The sampler step through a bridge's hybrid, before and after issue 63, side by side in one run.

A tiny random Llama (d = 256, 6 layers) with SmolLM2's vocabulary size (49,152), a random
bridge at layer 2 over a 9,578-token corpus support (the KJV's size), float32 on the CPU.

* before: the step as it was, reproduced here: float32 logits over the whole vocabulary at every
  position (`run_from`), the counting wrapper comparing z with the last call's and reading the
  count back, the teacher's offsets recomputed at each call;
* after: the library's step: the head only at the positions a step draws, no read-back in roar
  and one a step (before the network runs) in mdlm, the offsets kept.

Both draw the same tokens (checked here; tests/test_samplers_step.py checks it exactly). Per
sampler: tokens/s (num x length / seconds, best of `--repeats`, before and after interleaved), and the logits a step holds.

A second table does the same for a DSL model from scratch (d = 256, 4 blocks, the same
vocabulary): before, its float32 logits kept at every position between calls; after, its final
states kept (`DSLModel.features`) and the head applied where a step draws.

    python bench/sampler_step.py [--num 4] [--length 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import transformers

from geoprobe.backbone import Backbone
from geoprobe.bridges.channel import posterior_logits
from geoprobe.bridges.dsl import DSLConfig, DSLModel
from geoprobe.bridges.hidden import BridgeConfig, HiddenBridge, HybridDenoiser, Teacher
from geoprobe.files import human
from geoprobe.samplers import make_sampler
from geoprobe.samplers.base import MASK, RevealState, nucleus
from geoprobe.samplers.plan import logits_bytes

VOCAB, SUPPORT, WIDTH, LAYERS, LAYER = 49_152, 9_578, 256, 6, 2


def hybrid() -> HybridDenoiser:
    config = transformers.LlamaConfig(hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=4,
                                      num_key_value_heads=4, intermediate_size=4 * WIDTH, vocab_size=VOCAB,
                                      max_position_embeddings=1024, bos_token_id=1)
    torch.manual_seed(0)
    backbone = Backbone(transformers.AutoModelForCausalLM.from_config(config))
    cfg = BridgeConfig(layer=LAYER, vocab_size=VOCAB, hidden_size=WIDTH, d_model=128, n_layers=2, n_heads=2,
                       bridge_steps=4, support_size=SUPPORT)
    bridge = HiddenBridge(cfg).eval()
    bridge.set_support(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(1))[:SUPPORT].sort().values)
    return HybridDenoiser(bridge, Teacher(backbone, LAYER), 1)


class Before:
    """The counting wrapper and the hybrid's call as they were before issue 63."""

    def __init__(self, model: HybridDenoiser):
        self.model, self.z, self.logits = model, None, None

    def __call__(self, z):
        changed = torch.ones(len(z), dtype=torch.bool) if self.z is None else (z != self.z).flatten(1).any(1)
        count = int(changed.sum())  # the read-back of every call
        if count == 0:
            return self.logits
        logits = self.logits.clone() if count < len(z) else None
        full = self.full(z[changed] if logits is not None else z)
        logits = full if logits is None else logits.index_put((changed,), full)
        self.z, self.logits = z.clone(), logits
        return logits

    def full(self, z):
        model = self.model
        model.teacher._offsets.clear()  # recomputed at every call, as they were
        logits = model.teacher.backbone.run_from(LAYER, model.hidden(z))[:, :-1].float()
        return model.readable(posterior_logits(z.float(), model.token_table().float(), log_prior=logits))


def gumbel(logits, generator):
    u = torch.rand(logits.shape, generator=generator, dtype=torch.float64)
    tiny = torch.finfo(torch.float64).tiny
    return (logits.double() - torch.log(-torch.log(u.clamp(min=tiny, max=1 - 1e-16)))).argmax(-1)


@torch.no_grad()
def before(sampler, model, num, length, seed=0) -> torch.Tensor:
    """roar or mdlm (no nucleus) as the samplers ran them before issue 63."""
    generator, wrapped = torch.Generator().manual_seed(seed), Before(model)
    state = RevealState(model.token_table(), model.s_max, num, length, generator)
    if sampler.name == "roar":
        order = torch.rand(num, length, generator=generator).argsort(dim=1)
        rows = torch.arange(num)[:, None]
        for start in range(length):
            logits = wrapped(state.z())
            cols = order[:, start:start + 1]
            state.tokens[rows, cols] = gumbel(logits[rows, cols], generator)
        return state.tokens
    for alpha_t, alpha_s, t in sampler.schedule(sampler.steps):
        _, reveal_p = sampler.probabilities(state, alpha_t, alpha_s, t)
        logits = wrapped(state.z())
        reveal = state.masked & (torch.rand(state.masked.shape, generator=generator) < reveal_p)
        if reveal.any():
            filtered = nucleus(logits[reveal], sampler.top_p)
            tokens = gumbel(filtered, generator)
            state.tokens[reveal] = tokens
            state.probability[reveal] = filtered.softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
    return state.tokens


class WholeLogits:
    """A DSL model as the samplers drove it before `features`: float32 logits at every position."""

    def __init__(self, model: DSLModel):
        self.model, self.vocab_size, self.s_max = model, model.vocab_size, model.s_max

    def token_table(self):
        return self.model.token_table()

    def __call__(self, z):
        return self.model(z)


def timed(runs: dict, repeats: int) -> dict:
    """{label: (best seconds, tokens)}, the runs interleaved, so that a load that comes and goes
    on a shared machine falls on both alike."""
    best = {label: (float("inf"), None) for label in runs}
    for _ in range(repeats):
        for label, run in runs.items():
            torch.manual_seed(0)  # the bridge's noise
            start = time.perf_counter()
            tokens = run()
            best[label] = (min(best[label][0], time.perf_counter() - start), tokens)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num", type=int, default=4)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model, num, length = hybrid(), args.num, args.length
    make_sampler("roar").sample(model, 1, 4)  # warm-up
    print(f"hybrid: Llama d={WIDTH}, {LAYERS} layers, V={VOCAB:,}, support {SUPPORT:,}, bridge at layer {LAYER} "
          f"(K=4); {num} samples x {length} tokens, float32, torch threads {torch.get_num_threads()}")
    table(lambda sampler, name, knobs: before(sampler, model, num, length), model, num, length, args.repeats)
    dsl = DSLModel(DSLConfig(vocab_size=VOCAB, d_tok=64, d_model=WIDTH, n_layers=4, n_heads=4)).eval()
    print(f"\nDSL from scratch: d={WIDTH}, 4 blocks, V={VOCAB:,}; the same samples; before: its logits kept "
          f"at every position, after: its final states ({human(num * length * WIDTH * 4)} a call against "
          f"{human(num * length * VOCAB * 4)})")
    table(lambda sampler, name, knobs: make_sampler(name, **knobs).sample(WholeLogits(dsl), num, length).tokens,
          dsl, num, length, args.repeats)


def table(old_run, model, num: int, length: int, repeats: int) -> None:
    """One line per sampler: before and after side by side (`old_run(sampler, name, knobs)` the before)."""
    print(f"{'sampler':12s} {'before tok/s':>12s} {'after tok/s':>12s} {'ratio':>6s} {'logits before':>14s} "
          f"{'after':>10s}  same tokens")
    for name, knobs in (("roar", {}), ("mdlm", {"steps": 32})):
        sampler = make_sampler(name, **knobs)
        got = timed({"before": lambda: old_run(sampler, name, knobs),
                     "after": lambda: make_sampler(name, **knobs).sample(model, num, length).tokens}, repeats)
        (old, old_tokens), (new, new_tokens) = got["before"], got["after"]
        # the plan's estimate (samplers/plan.py) at every position, and at the positions drawn at
        full, drawn = logits_bytes(num * length, VOCAB), logits_bytes(sampler.logit_rows(num, length), VOCAB)
        print(f"{name:12s} {num * length / old:12.1f} {num * length / new:12.1f} {old / new:6.2f} {human(full):>14s} "
              f"{human(drawn):>10s}  {torch.equal(old_tokens, new_tokens)}")

if __name__ == "__main__":
    main()
