"""The three proxies as functions over a tensor (geoprobe/proxies.py): against the independent
slow implementation (bench/naive_geometry.py) and against the run-level driver's numbers."""

import numpy as np
import pytest
import torch

from bench.naive_geometry import gaussian, slow_reference
from geoprobe.geometry import GeometrySettings, draw_samples, layer_geometry
from geoprobe.proxies import effective_rank, global_monotonicity, local_curvature


def states(n=600, d=12, repeated=40, seed=3):
    """Gaussian states with a decaying spectrum and `repeated` rows copied from others."""
    x = gaussian(n, np.geomspace(5.0, 0.1, d), seed=seed)
    x[:repeated] = x[repeated:2 * repeated]
    return x


def pairs_used(x, ci, cj, pairs):
    """The first `pairs` candidate pairs whose states differ (as the driver and the slow oracle take them)."""
    keep = np.flatnonzero(np.any((x[ci] - x[cj]).numpy() != 0, axis=1))[:pairs]
    return ci[keep], cj[keep]


def test_the_pure_proxies_match_the_slow_oracle():
    settings = GeometrySettings(k=10, anchors=150, pairs=300)
    x = states()
    anchors, ci, cj = draw_samples(len(x), settings, key=5)
    slow = slow_reference(x.numpy(), settings, key=5)
    i, j = pairs_used(x, ci, cj, settings.pairs)
    assert local_curvature(x, anchors, k=settings.k) == pytest.approx(slow["curv"], rel=1e-9)
    assert global_monotonicity(x, i, j, alpha=settings.alpha) == pytest.approx(slow["mono"], rel=1e-9)
    assert effective_rank(x) == pytest.approx(slow["erank"], rel=1e-9)


def test_the_pure_proxies_give_the_drivers_raw_estimates():
    settings = GeometrySettings(k=8, anchors=120, pairs=200, bootstrap=0, reseeds=0, drop_massive=False, chunk=50)
    x = states(d=20, seed=4)
    anchors, ci, cj = draw_samples(len(x), settings, key=2)
    i, j = pairs_used(x, ci, cj, settings.pairs)
    raw = layer_geometry(x, torch.arange(len(x)) // 10, settings, rng_key=2)["none"]
    assert local_curvature(x, anchors, k=settings.k, chunk=settings.chunk) == pytest.approx(raw["curv"]["value"],
                                                                                            rel=1e-12)
    assert global_monotonicity(x, i, j, alpha=settings.alpha) == pytest.approx(raw["mono"]["value"], rel=1e-12)
    assert effective_rank(x) == pytest.approx(raw["erank"]["value"], rel=1e-12)


def test_the_effective_rank_of_a_known_spectrum_and_the_inputs_stay_untouched():
    # rows +-sqrt(n-1 share) e_c: the covariance is exactly diag(4, 1, 1), so tr / lambda_max = 1.5
    e = torch.eye(3, dtype=torch.float64)
    x = torch.cat([e * torch.tensor([2.0, 1.0, 1.0], dtype=torch.float64), -e * torch.tensor([2.0, 1.0, 1.0],
                                                                                             dtype=torch.float64)])
    before = x.clone()
    assert effective_rank(x) == pytest.approx(1.5, rel=1e-12)
    assert torch.equal(x, before)
