"""Train a DSL model, then sample it with every sampler at one budget.

    python examples/03_dsl_and_samplers.py [OUT]
    GEOPROBE_EXAMPLE_TINY=1 python examples/03_dsl_and_samplers.py
"""

import os
import subprocess
import sys
from pathlib import Path

import geoprobe
from geoprobe.samplers import TOKEN_SAMPLERS

TINY = os.environ.get("GEOPROBE_EXAMPLE_TINY") == "1"
out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/example-dsl")
corpus = "synthetic:hmm?states=16&vocab=128&docs=300&length=64" if TINY else "kjv"
shape = ["--steps", "40", "--batch-size", "8", "--seq-len", "32", "--d-model", "32", "--n-layers", "1",
         "--warmup", "5"] if TINY else ["--steps", "2000", "--tokenizer", "train:4096"]

subprocess.run([sys.executable, "-m", "geoprobe", "-q", "dsl", "train", "--corpus", corpus, "--tokenizer", "words",
                *shape, "--out", str(out)], check=True)

length, steps = (16, 8) if TINY else (128, 64)
for sampler in TOKEN_SAMPLERS:  # mdlm, remdm-*, roar, continuous, hybrid (ancestral samples the embedding baselines)
    texts = geoprobe.sample(out, sampler=sampler, out=out / "samples" / sampler, num=2, length=length,
                            steps=max(steps, 3))
    print(f"{sampler:14s} {texts[0][:80]!r}")
