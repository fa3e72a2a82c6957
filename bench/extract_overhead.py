"""Extraction overhead: `extract` (hooks on every layer + float16 Parquet shards written on a
background thread) against a bare forward pass through the same blocks over the same batches.

Target (issue 15): ratio <= 1.10 on a tiny Llama (d=256, 8 layers, seq 256) on the CPU.
Both are measured in this process, alternating, best of several repeats; each run's shards
are deleted after it is timed, so the disk and page cache start each repeat alike.
"""

from __future__ import annotations

import dataclasses
import statistics
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common import tiny_llama

from geoprobe.backbone import load_backbone
from geoprobe.corpus import read_documents
from geoprobe.extract import ExtractConfig, extract, pad_batch, plan_blocks

TOKENS, SEQ, BATCH, REPEATS = 49152, 256, 8, 5


def main():
    work = Path(tempfile.mkdtemp(prefix="geoprobe-bench-"))
    model, corpus = tiny_llama(work, n_docs=400)
    backbone = load_backbone(str(model), device="cpu")
    cfg = ExtractConfig(model=str(model), corpus=str(corpus), tokens=TOKENS, seq_len=SEQ,
                        batch_size=BATCH, device="cpu")
    plan = plan_blocks(read_documents(str(corpus)), backbone.tokenizer, cfg)
    batches = [pad_batch([p.block for p in plan[i:i + BATCH]], 0, "cpu") for i in range(0, len(plan), BATCH)]

    def bare():
        with torch.no_grad():
            for ids, mask in batches:
                backbone.base(input_ids=ids, attention_mask=mask, use_cache=False)

    def ours(i, storage):
        extract(dataclasses.replace(cfg, storage=storage), work / f"run-{storage}-{i}", backbone=backbone)

    def clean(i, storage):
        shutil.rmtree(work / f"run-{storage}-{i}", ignore_errors=True)

    bare()  # warm-up
    times = {"bare": [], "float16": [], "float32": []}
    for i in range(REPEATS):
        for name in times:
            start = time.perf_counter()
            bare() if name == "bare" else ours(i, name)
            times[name].append(time.perf_counter() - start)
            if name != "bare":
                clean(i, name)
    shutil.rmtree(work, ignore_errors=True)
    best = {k: min(v) for k, v in times.items()}
    median = {k: statistics.median(v) for k, v in times.items()}
    print(f"tiny Llama d=256, 8 layers, seq {SEQ}, batch {BATCH}, {TOKENS} rows x 9 layers, "
          f"torch threads {torch.get_num_threads()}, {REPEATS} repeats (best / median)")
    print(f"bare forward              : {best['bare']:.3f} / {median['bare']:.3f} s  ({TOKENS / best['bare']:,.0f} tok/s)")
    for storage in ("float16", "float32"):
        print(f"extract, {storage} shards   : {best[storage]:.3f} / {median[storage]:.3f} s  "
              f"({TOKENS / best[storage]:,.0f} tok/s)  ratio {best[storage] / best['bare']:.3f} / "
              f"{median[storage] / median['bare']:.3f}  (target <= 1.10)")

if __name__ == "__main__":
    main()
