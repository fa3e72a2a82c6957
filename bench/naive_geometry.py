"""The naive geometry: an independent slow implementation of the three proxies (scikit-learn
brute-force kNN, a d x d covariance and numpy's eigvalsh per anchor, numpy's covariance and a
matrix inverse for P), and Gaussian test data. It is the baseline bench/geometry_speed.py
times ours against and the oracle tests/test_geometry.py checks ours with; it lives here so
that no benchmark imports the tests."""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import ortho_group
from sklearn.neighbors import NearestNeighbors

from geoprobe.geometry import GeometrySettings, draw_samples
from geoprobe.proxies import EPS_REL


def gaussian(n, eigenvalues, seed=0, rotate=True):
    rng = np.random.default_rng(seed)
    d = len(eigenvalues)
    x = rng.standard_normal((n, d)) * np.sqrt(eigenvalues)
    if rotate:
        x = x @ ortho_group.rvs(d, random_state=seed).T
    return torch.from_numpy(x + 3.0)


def slow_reference(x: np.ndarray, settings: GeometrySettings, key: int):
    """Independent implementation: sklearn brute-force kNN, a d x d covariance and numpy
    eigvalsh per anchor, numpy's covariance and a matrix inverse for P."""
    n, d = x.shape
    anchors, ci, cj = draw_samples(n, settings, key)
    distinct, inverse = np.unique(x, axis=0, return_inverse=True)
    nn = NearestNeighbors(n_neighbors=settings.k + 1, algorithm="brute").fit(distinct)
    _, idx = nn.kneighbors(x[anchors])
    scale = np.trace(np.cov(x, rowvar=False)) / d
    curv = []
    for row, neighbours in zip(anchors, idx):
        neighbours = [j for j in neighbours if j != inverse.ravel()[row]][: settings.k]
        cov = np.cov(distinct[neighbours], rowvar=False)
        curv.append(1.0 / max(np.linalg.eigvalsh(cov)[-1], EPS_REL * scale))
    sigma = np.cov(x, rowvar=False)
    p = np.linalg.inv(sigma + settings.alpha * np.trace(sigma) / d * np.eye(d))
    diff = x[ci] - x[cj]
    keep = np.flatnonzero(np.any(diff != 0, axis=1))[: settings.pairs]
    q = np.einsum("pi,ij,pj->p", diff[keep], p, diff[keep]) / (diff[keep] ** 2).sum(1)
    ev = np.linalg.eigvalsh(sigma)
    return {"curv": np.median(curv), "mono": np.median(q), "erank": ev.sum() / ev[-1]}
