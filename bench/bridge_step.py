"""A bridge's training step from the cached teacher states (bridges/states.py, what `bridge` and
`sweep` do now) against the same step with the teacher prefix re-run on every batch (what they
did before), side by side in one run, and the step's achieved FLOP/s against this machine's own
GEMM rate measured in the same run. Target (issue 31): >= 5x the old sweep's 500 tokens/s on
SmolLM2 layer 12 at the default bridge shape.

    python bench/bridge_step.py                                      # the tiny benchmark model, layer 2
    python bench/bridge_step.py --model builtin:smollm2 --corpus kjv --layer 12 --batch 8 --seq 256   # the sweep's

The cached step runs twice: from the host pool (each batch's rows copied into host zeros, then
uploaded) and from the device pool (bridges/states.py `pool_on_device`: one gather where the
states live). No checkpoint is written inside the timed loop (the `bridge` command writes one
every 100 steps; bench/gpu_check.sh's bridge step times them with the steps).

Both variants run the library's own loss (geoprobe.bridges.fit.objective) with the same draws, the same
network and a fused AdamW step; only where h_l comes from differs. FLOPs are counted by
torch.utils.flop_counter on one step (matrix products and attention: what a GEMM rate bounds).
"""

from __future__ import annotations

import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common import tiny_llama, training_step

from geoprobe.bridges.fit import corpus_support, draw_conditions, fit_statistics, objective, training_loss
from geoprobe.bridges.hidden import BridgeConfig, HiddenBridge, Teacher
from geoprobe.bridges.states import teacher_states
from geoprobe.bridges.train import Shard, mixed_precision, step_generator
from geoprobe.backbone import load_backbone
from geoprobe.corpus import iter_blocks, read_documents
from geoprobe.extract import pad_batch
from geoprobe.workflows.sweep import BridgeSettings


def on_the_fly_loss(bridge, teacher, states, batch_size):
    """The old step: the same draws as training_loss, h_l from the frozen prefix on the batch."""
    split = states.train

    def loss_fn(model, generator, shard):
        chosen = torch.randint(0, len(split), (batch_size,), generator=generator).tolist()
        ids, mask = pad_batch([split.blocks[i] for i in chosen], 0, teacher.backbone.input_device)
        draws = draw_conditions(model.cfg, batch_size, ids.shape[1], generator)
        target = teacher.states(ids, mask).target
        return objective(model, teacher, ids, mask, target, draws)

    return loss_fn


def timed(bridge, loss_fn, steps: int, tokens_per_step: int) -> float:
    """Tokens per second over `steps` optimiser steps, after two warm-up steps."""
    step, _ = training_step(bridge, loss_fn, lr=1e-3)
    for i in range(steps + 2):
        if i == 2:
            began = time.perf_counter()
        step(i)
    return steps * tokens_per_step / (time.perf_counter() - began)


def step_flops(bridge, loss_fn) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        loss_fn(bridge, step_generator(0, 0), Shard()).backward()
    bridge.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def gemm_rate(n: int, repeats: int = 5, rounds: int = 5) -> float:
    """This machine's float32 GEMM FLOP/s (bf16 where training autocasts to it) at n x n x n: the
    best of `rounds` timings, since one timing on a shared virtual machine varied 3x between runs
    (bench/README.md, 2026-12-05)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    with mixed_precision(torch.device("cpu")):
        a @ b
        for _ in range(rounds):
            began = time.perf_counter()
            for _ in range(repeats):
                a @ b
            best = min(best, time.perf_counter() - began)
    return 2 * n ** 3 * repeats / best


def arguments(argv=None):
    """The bench's flags (bench/heap.py's bridge workload takes the same)."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", help="a backbone (default: the tiny benchmark Llama)")
    parser.add_argument("--corpus", help="its corpus (default: the benchmark's)")
    parser.add_argument("--layer", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--pool", type=int, default=32, help="training blocks whose states are cached")
    parser.add_argument("--support-tokens", type=int, default=BridgeSettings.train_tokens,
                        help="tokens whose ids make the converter's support, as a sweep's training pool does (the "
                             "mixture's cost grows with it: 1,592 ids in 36 KJV blocks, 6,782 in 262,144 tokens; a "
                             "SmolLM2 run's own, from its train, stop and validation blocks, has 6,812)")
    parser.add_argument("--d-model", type=int, default=0, help="the bridge's width (0: the default shape's)")
    parser.add_argument("--n-layers", type=int, default=0, help="its blocks (0: the default shape's)")
    return parser.parse_args(argv)


def build(args):
    """(bridge, teacher, states, cached-state loss, a description with the teacher pass's seconds)
    at the bench's settings."""
    work = Path(tempfile.mkdtemp(prefix="geoprobe-bench-bridge-"))
    model, corpus = tiny_llama(work, n_docs=200) if args.model is None else (args.model, args.corpus)
    backbone = load_backbone(str(model), device="cpu")
    pool = list(islice((b for b in iter_blocks(read_documents(str(corpus)), backbone.tokenizer, args.seq, seed=0)
                        if len(b.tokens) == args.seq), max(args.pool + 4, args.support_tokens // args.seq)))
    blocks = pool[:args.pool + 4]
    began = time.perf_counter()
    states = teacher_states(backbone, blocks[:args.pool], [], blocks[args.pool:], [args.layer])
    cache_seconds = time.perf_counter() - began
    support = corpus_support(pool, backbone.tokenizer)
    cfg = BridgeConfig(layer=args.layer, vocab_size=backbone.config.vocab_size, hidden_size=backbone.hidden_size,
                       support_size=len(support), d_model=args.d_model, n_layers=args.n_layers)
    bridge = HiddenBridge(cfg)
    bridge.set_support(support)
    fit_statistics(bridge, states)
    teacher = Teacher(backbone, args.layer)
    line = (f"{args.model or 'tiny Llama d=256, 8 layers'}, bridge at layer {args.layer} of {backbone.num_layers}: "
            f"{cfg.d_model} wide x {cfg.n_layers} blocks, batch {args.batch} x {args.seq}, {args.steps} steps, "
            f"support {len(support):,} ids from {len(pool) * args.seq:,} tokens, "
            f"torch threads {torch.get_num_threads()}\n"
            f"teacher pass: {args.pool + 4} blocks at layers 0 and {args.layer} in {cache_seconds:.1f} s "
            f"({(args.pool + 4) * args.seq / cache_seconds:,.0f} tokens/s), {states.nbytes / 1e6:.0f} MB")
    return bridge, teacher, states, training_loss(bridge, teacher, states, args.batch), line


def device_pool(states, device):
    """A copy of the states pooled on `device` (bridges/states.py): each batch one gather there."""
    import copy

    pooled = copy.deepcopy(states)
    for split in (pooled.train, pooled.stop, pooled.val):
        split.to_device(device)
    return pooled


def main():
    args = arguments()
    bridge, teacher, states, cached_loss, line = build(args)
    print(line)
    tokens = args.batch * args.seq
    fly_loss = on_the_fly_loss(bridge, teacher, states, args.batch)
    # the host pool (rows copied into host zeros, then uploaded) beside the device pool (one gather
    # where the states live; on a CPU the same memory, so only the copying differs)
    pooled_loss = training_loss(bridge, teacher, device_pool(states, teacher.backbone.input_device), args.batch)
    flops = {name: step_flops(bridge, fn) for name, fn in (("cached", cached_loss), ("on the fly", fly_loss))}
    flops["device pool"] = flops["cached"]
    rates = {}
    for name, fn in (("on the fly", fly_loss), ("cached", cached_loss), ("device pool", pooled_loss)):
        rates[name] = max(timed(bridge, fn, args.steps, tokens) for _ in range(2))  # the better of two
    gemm = gemm_rate(1024)
    for name, rate in rates.items():
        achieved = flops["cached"] * rate / tokens  # the bridge's own work per second
        print(f"  {name:11s}: {rate:8,.0f} tokens/s  step {1000 * tokens / rate:7.1f} ms  "
              f"{flops[name] / 1e9:6.2f} GFLOP/step  bridge work {achieved / 1e9:6.1f} GFLOP/s "
              f"= {achieved / gemm:.0%} of the GEMM rate")
    print(f"  GEMM 1024^3 in the training precision: {gemm / 1e9:.1f} GFLOP/s")
    print(f"cached / on the fly: {rates['cached'] / rates['on the fly']:.2f}x tokens/s; "
          f"device pool / host pool: {rates['device pool'] / rates['cached']:.2f}x")


if __name__ == "__main__":
    main()
