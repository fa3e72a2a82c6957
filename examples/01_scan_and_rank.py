"""Scan a model and read its layer ranking with pandas.

    python examples/01_scan_and_rank.py [MODEL] [OUT]        # default: SmolLM2 on the KJV, 4,000 states
    GEOPROBE_EXAMPLE_TINY=1 python examples/01_scan_and_rank.py   # the testbed, seconds (make test runs this)
"""

import os
import sys

import geoprobe

TINY = os.environ.get("GEOPROBE_EXAMPLE_TINY") == "1"
model = sys.argv[1] if len(sys.argv) > 1 else ("builtin:hmm-tiny" if TINY else "builtin:smollm2")
out = sys.argv[2] if len(sys.argv) > 2 else "runs/example-scan"
settings = (dict(corpus="synthetic:hmm?states=16&vocab=128&emission=0.1&transition=0.1&stick=0.9&docs=300&length=64",
                 tokens=1600, seq_len=65, positions="random:16", anchors=256, k=16, pairs=512, bootstrap=50)
            if TINY else dict(corpus="kjv", tokens=4000, positions="random:64", doc_blocks=1))

# extract -> geometry -> rank in one resumable call (rerun it: nothing is recomputed)
run = geoprobe.scan(model, out, **settings)
print(run)

# the ranking: one row per layer; P(first) is how often the layer wins over bootstrap replicates,
# P(first) reseeds how often over redraws of the estimator's anchors and pairs
ranking = run.ranking().sort_values("rank")
print(ranking[["score", "score_lo", "score_hi", "rank", "p_first", "p_first_reseed"]].head())
chosen = int(ranking.index[0])
print(f"chosen layer {chosen}: first in {ranking.loc[chosen, 'p_first']:.0%} of bootstrap replicates")

# the proxies with their intervals, and where massive channels carry the variance
geometry = run.geometry()
print(geometry[["curv", "curv_lo", "curv_hi", "mono", "erank", "massive_channels", "massive_channel_share"]])

# the states themselves: one layer as a (rows, d) array, with the row metadata beside it
states = run.states(chosen)
rows = run.to_pandas()
print(f"layer {chosen}: {states.shape[0]} states of d={states.shape[1]} from {rows.doc_id.nunique()} documents")
