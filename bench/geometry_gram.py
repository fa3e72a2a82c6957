"""Geometry with fewer states than dimensions: the N x N Gram-matrix spectrum against the d x d
eigendecomposition of Sigma, same states, same settings, in one process.

Target (issue 15): a layer of d = 4,096 with a few thousand states costs seconds on a CPU, with
the same numbers as the d x d path (to 1e-8 relative on the proxies).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

import geoprobe.proxies as proxies
from geoprobe.geometry import GeometrySettings, bootstrap_counts, layer_geometry

N, D = 2000, 4096


def one_layer(x, docs, counts, settings):
    start = time.perf_counter()
    result = layer_geometry(x, docs, settings, counts, rng_key=0)
    return time.perf_counter() - start, result


def main() -> None:
    rng = np.random.default_rng(0)
    # a spectrum that decays like a real layer's: a few strong directions, a long tail
    scales = np.sqrt(np.geomspace(50.0, 0.01, D))
    x = torch.from_numpy(rng.standard_normal((N, D)) * scales)
    docs = torch.arange(N) // 16
    settings = GeometrySettings(k=32, anchors=1024, pairs=4096, bootstrap=200)
    counts = torch.from_numpy(bootstrap_counts(int(docs.max()) + 1, settings.bootstrap, 0))
    gram_s, gram = one_layer(x, docs, counts, settings)
    proxies.GRAM_BELOW = 0.0
    full_s, full = one_layer(x, docs, counts, settings)
    worst = max(abs(gram["trace"][p]["value"] / full["trace"][p]["value"] - 1) for p in ("curv", "mono", "erank"))
    print(f"N = {N}, d = {D}, k = 32, anchors = 1024, pairs = 4096, bootstrap = 200, threads = "
          f"{torch.get_num_threads()}")
    print(f"Gram (N x N) path: {gram_s:6.2f} s per layer")
    print(f"d x d path:        {full_s:6.2f} s per layer")
    print(f"speed-up {full_s / gram_s:.1f}x, largest relative difference of a proxy {worst:.2e}")


if __name__ == "__main__":
    main()
