"""Where a DSL training step's time goes, under torch.profiler: DSL from a pretrained LM
(`dsl train --init-from`), the row of `make results --generation` that takes most of its hours
(docs/baselines.md, "What it costs on 2 cores"). Prints the step's seconds, the share of the
matrix products, dtype copies, attention and the log-softmax, and the GEMMs' achieved rate.

    python bench/dsl_step.py                                   # SmolLM2, 8 x 256 tokens, as --generation
    python bench/dsl_step.py --model builtin:hmm-tiny --seq 64 \
        --corpus "$(python -c 'from geoprobe.testbed import CORPUS; print(CORPUS)')"   # a quick one
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from geoprobe.bridges.dsl import DSLTrainSettings, dsl_objective, pretrained_dsl, sequences, split_documents, token_stream
from geoprobe.bridges.train import TrainConfig
from geoprobe.backbone import load_tokenizer

from common import training_step

GROUPS = {"matrix products": ("aten::mm", "aten::addmm", "aten::bmm"), "dtype copies": ("aten::copy_",),
          "attention": ("flash_attention",), "log-softmax": ("_log_softmax",)}


def arguments(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="builtin:smollm2")
    parser.add_argument("--corpus", default="kjv")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    return parser.parse_args(argv)


def build(args):
    """(one training step of `dsl train --init-from` at the bench's settings as step(i), its
    trained parameters)."""
    settings = DSLTrainSettings(snr="mixed", seq_len=args.seq, train=TrainConfig(batch_size=args.batch, lr=1e-4))
    documents, _ = split_documents(args.corpus, 0)
    tokenizer = load_tokenizer(args.model)
    model = pretrained_dsl(args.model, tokenizer, 64)
    data = sequences(token_stream(documents[:200], tokenizer), args.seq)
    loss_fn, _ = dsl_objective(model, data, settings, torch.device("cpu"))
    return training_step(model, loss_fn, lr=1e-4)


def main() -> None:
    args = arguments()
    step, params = build(args)
    step(0)  # warm-up: allocations, the first kernels
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        began = time.perf_counter()
        step(1)
        seconds = time.perf_counter() - began
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    print(f"{args.model}: {sum(p.numel() for p in params) / 1e6:.1f} M trained parameters, {args.batch} x {args.seq} "
          f"tokens, {torch.get_num_threads()} threads: {seconds:.2f} s a step")
    for name, keys in GROUPS.items():
        mine = [e for e in events if any(k in e.key for k in keys)]
        share = sum(e.self_cpu_time_total for e in mine) / total
        line = f"  {name:16s} {share:6.1%} of the step's CPU time"
        if name == "matrix products":
            flops = sum(e.flops for e in mine)
            line += f", {flops / 1e9:,.0f} GFLOP at {flops / (share * seconds) / 1e9:,.0f} GFLOP/s"
        print(line)


if __name__ == "__main__":
    main()
