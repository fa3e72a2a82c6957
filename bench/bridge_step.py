"""Where a bridge training step spends its time: the teacher prefix (frozen blocks 1..l with
early stop), the bridge (converter, source mixing, forward and backward), the optimizer (AdamW +
EMA). Target (issue 4): the teacher costs <= 25% of a step at l <= N/4 on the tiny benchmark
model (Llama d=256, 8 layers, so l = 2).

    python bench/bridge_step.py                                          # the tiny benchmark model
    python bench/bridge_step.py --model builtin:smollm2 --corpus kjv --layer 3 --steps 10   # issue 12's figure

Each run measures the converter over the whole vocabulary (--vocab all, the old path) and over
the corpus's tokens (--vocab corpus, the default) side by side.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common import tiny_llama

from bridges.channel import channel, draw_snr
from bridges.fit import BlockBatches, corpus_support, fit_statistics, positions_weight
from bridges.train import mixed_precision
from bridges.hidden import BridgeConfig, HiddenBridge, Teacher
from geoprobe.backbone import load_backbone
from geoprobe.corpus import iter_blocks, read_documents

BATCH, SEQ = 8, 128


def main():
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", help="a backbone (default: the tiny benchmark Llama)")
    parser.add_argument("--corpus", help="its corpus (default: the benchmark's)")
    parser.add_argument("--layer", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--vocab", default="all,corpus", help="the converter vocabularies to compare")
    parser.add_argument("--precision", default="auto", choices=["auto", "float32"],
                        help="auto: bf16 products where the CPU has them natively, as training does")
    args = parser.parse_args()
    LAYER, STEPS = args.layer, args.steps
    work = Path(tempfile.mkdtemp(prefix="geoprobe-bench-bridge-"))
    model, corpus = tiny_llama(work, n_docs=200) if args.model is None else (args.model, args.corpus)
    backbone = load_backbone(str(model), device="cpu")
    blocks = list(iter_blocks(read_documents(str(corpus)), backbone.tokenizer, SEQ, seed=0))
    batches = BlockBatches(blocks, 0, backbone.input_device)
    teacher = Teacher(backbone, LAYER)
    support = corpus_support(blocks, backbone.tokenizer)
    print(f"{args.model or 'tiny Llama d=256, 8 layers'} (vocabulary {backbone.config.vocab_size:,}, "
          f"{len(support):,} in the corpus), bridge at layer {LAYER}, bridge d_model 256 x 4 blocks, batch {BATCH} x "
          f"{SEQ}, {STEPS} steps, torch threads {torch.get_num_threads()}")
    print("  source = the converter's posterior and the embedding mixture (forward); network = the bridge's loss "
          "forward and the whole backward")
    results = {vocab: measure(vocab, teacher, batches, support, backbone, STEPS, args.precision)
               for vocab in args.vocab.split(",")}
    for vocab, (tokens_per_s, ms, times) in results.items():
        total = sum(times.values())
        print(f"--vocab {vocab}: {tokens_per_s:,.0f} tokens/s, {ms:.1f} ms/step, teacher share "
              f"{times['teacher'] / total:.1%} (target <= 25%)")
        for name, seconds in times.items():
            print(f"  {name:9s}: {1000 * seconds / STEPS:7.1f} ms/step  {seconds / total:6.1%}")
    if len(results) == 2:
        print(f"corpus / all: {results['corpus'][0] / results['all'][0]:.2f}x tokens/s")


def measure(vocab, teacher, batches, support, backbone, steps, precision="auto"):
    """Tokens/s and the per-part seconds of `steps` training steps (after 3 warm-up steps), with
    the converter over the corpus's tokens or the whole vocabulary; clean rows as in training."""
    bridge = HiddenBridge(BridgeConfig(layer=teacher.layer, vocab_size=backbone.config.vocab_size,
                                       hidden_size=backbone.hidden_size, d_model=256, n_layers=4, vocab=vocab,
                                       support_size=len(support) if vocab == "corpus" else 0, precision=precision))
    if vocab == "corpus":
        bridge.set_support(support)
    fit_statistics(bridge, teacher, batches, BATCH, 0)
    params = [p for p in bridge.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3, fused=True)  # as the training loop does on a CPU
    ema = [p.detach().clone() for p in params]
    times = {"teacher": 0.0, "source": 0.0, "network": 0.0, "optimizer": 0.0}
    tokens = 0
    for step in range(steps + 3):
        g = torch.Generator().manual_seed(step)
        ids, mask = batches.draw(BATCH, g)
        t0 = time.perf_counter()
        h0, hl = teacher.states(ids, mask)
        t1 = time.perf_counter()
        snr = draw_snr("mixed", ids.shape, generator=g)
        clean = torch.rand(BATCH, generator=g) < bridge.cfg.clean_frac
        z = channel(bridge.table(), ids, snr, generator=g)
        a = bridge.source(z, teacher.embeddings, teacher.offsets(ids.shape[1]), ids, clean)
        t_source = time.perf_counter()
        with mixed_precision(torch.device("cpu"), precision):  # as the training loop does
            loss = bridge.loss(a, hl, positions_weight(mask), g)
        optimizer.zero_grad()
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        with torch.no_grad():
            for e, p in zip(ema, params):
                e.lerp_(p, 0.01)
        t3 = time.perf_counter()
        if step >= 3:  # warm-up excluded
            times["teacher"] += t1 - t0
            times["source"] += t_source - t1
            times["network"] += t2 - t_source
            times["optimizer"] += t3 - t2
            tokens += int(mask.sum())
    total = sum(times.values())
    return tokens / total, 1000 * total / steps, times

if __name__ == "__main__":
    main()
