"""The three geometry proxies of a layer's hidden states, as functions over a tensor.

For states X (N x d) with covariance Sigma (float64 throughout, on X's device):

* effective rank  k = tr(Sigma) / lambda_max(Sigma) (`effective_rank`); `spectrum_summary` also
  gives the participation ratio tr(Sigma)^2 / tr(Sigma^2) and the entropy effective rank
  exp(H(lambda / sum lambda));
* local curvature m_curv = median over anchors of 1 / lambda_max(C_i), C_i the covariance
  (ddof 1) of the anchor's k nearest *distinct* states (Euclidean, itself excluded), floored at
  EPS_REL * tr(Sigma)/d (`local_curvature`);
* global monotonicity m_mono = median over pairs of (x_i - x_j)^T P (x_i - x_j) / |x_i - x_j|^2
  with P = (Sigma + lambda I)^-1, lambda = alpha * tr(Sigma)/d (`global_monotonicity`).

Tensors in, numbers out, no state and no files. The run-level driver (store reading, massive
rows and channels, several ranks, the bootstrap, plans) is geoprobe/geometry.py, which builds on
the same blocks below.
"""

from __future__ import annotations

import numpy as np
import torch

import geoprobe.device  # noqa: F401 (denormals flushed before any parallel work: device.flush_denormals)
from geoprobe.distributed import SINGLE, World

EPS_REL = 1e-6  # floor of a neighbourhood's lambda_max, relative to the layer's tr(Sigma)/d
GRAM_BELOW = 1.0  # use the N x N Gram matrix when N < GRAM_BELOW * d


# --- the three proxies of one layer (one process, every row) -------------------------------


def centre(x: torch.Tensor) -> torch.Tensor:
    """A float64 copy of `x` (N x d) minus its column means (the caller's tensor is untouched)."""
    out = x.to(torch.float64, copy=True)
    out -= out.sum(0) / len(out)
    return out


def effective_rank(x: torch.Tensor) -> float:
    """tr(Sigma) / lambda_max(Sigma) of the states `x` (N x d)."""
    centred = centre(x)
    return spectrum_summary(covariance_spectrum(centred, len(centred))[0])["erank"]


def local_curvature(x: torch.Tensor, anchors, k: int = 32, chunk: int = 512) -> float:
    """The median over `anchors` (row indices of `x`) of 1 / lambda_max of the covariance of each
    anchor's k nearest distinct states, floored at EPS_REL * tr(Sigma)/d.

    Args:
        x: the states, N x d (at least k + 1 distinct rows).
        anchors: the anchor rows (a tensor or array of indices).
        k: the neighbourhood's size.
        chunk: anchors per kNN block (speed and memory only).
    """
    centred = centre(x)
    values, _ = covariance_spectrum(centred, len(centred))
    return float(torch.quantile(anchor_curvatures(centred, torch.as_tensor(anchors, device=x.device), k,
                                                  float(values.clamp(min=0).sum()) / x.shape[1], chunk), 0.5))


def anchor_curvatures(centred: torch.Tensor, anchors: torch.Tensor, k: int, scale: float,
                      chunk: int = 512) -> torch.Tensor:
    """1 / lambda_max of each anchor's k-neighbourhood covariance, floored at EPS_REL * scale
    (`scale`: tr(Sigma)/d), for the rows `anchors` of the centred states."""
    reference, inverse = distinct_rows(centred)
    neighbours = knn(centred[anchors], reference, k, exclude=inverse[anchors], chunk=chunk)
    return 1.0 / neighbourhood_lambda_max(reference, neighbours, chunk=chunk).clamp(min=EPS_REL * scale)


def global_monotonicity(x: torch.Tensor, i, j, alpha: float = 1e-3) -> float:
    """The median over the pairs (i, j) of distinct states of
    (x_i - x_j)^T (Sigma + lambda I)^-1 (x_i - x_j) / |x_i - x_j|^2, lambda = alpha * tr(Sigma)/d.

    Args:
        x: the states, N x d.
        i, j: the pairs' rows (tensors or arrays of indices); pairs of identical states are skipped.
        alpha: the ridge, relative to the mean variance tr(Sigma)/d.
    """
    centred = centre(x)
    values, vectors = covariance_spectrum(centred, len(centred))
    d = centred.shape[1]
    i, j = torch.as_tensor(i, device=x.device), torch.as_tensor(j, device=x.device)
    _, inverse = distinct_rows(centred)
    valid = (inverse[i] != inverse[j]).nonzero().squeeze(1)
    ridge = alpha * float(values.clamp(min=0).sum()) / d
    return float(torch.quantile(pair_quotients(centred[i[valid]] - centred[j[valid]], values, vectors, ridge, d), 0.5))


def pair_quotients(delta: torch.Tensor, eigenvalues: torch.Tensor, eigenvectors: torch.Tensor, ridge: float,
                   d: int) -> torch.Tensor:
    """Per difference row: delta' P delta / delta' delta with P = (Sigma + ridge I)^-1, from
    Sigma's eigendecomposition (thin where it has fewer than `d` eigenvectors: the rest of delta
    lies where Sigma is 0)."""
    sq = (delta @ eigenvectors) ** 2
    quotient = (sq / (eigenvalues.clamp(min=0) + ridge)).sum(1)
    if eigenvectors.shape[1] < d:
        total = (delta * delta).sum(1)
        return (quotient + (total - sq.sum(1)).clamp(min=0) / ridge) / total
    return quotient / sq.sum(1)


# --- building blocks (plain tensors in, plain tensors out) -----------------------------------


def knn(queries: torch.Tensor, reference: torch.Tensor, k: int, exclude: torch.Tensor | None = None,
        chunk: int = 512) -> torch.Tensor:
    """Indices (M x k) of each query's k nearest reference rows, nearest first.

    Squared distances |q|^2 - 2 q.r + |r|^2 by one matrix product per chunk of queries, in
    float32 (twice the matmul rate of float64 on a CPU, far more on a GPU) for k + margin
    candidates, which are then re-ranked with exact float64 distances: the result is the
    float64 answer unless float32 rounding moved a true neighbour past the margin.
    `exclude[i]` (a reference index, or -1) is never returned for query i.
    """
    distances, candidates = knn_candidates(queries, reference, k, exclude, chunk)
    return nearest(distances, candidates, k)


def nearest(distances: torch.Tensor, ids: torch.Tensor, k: int) -> torch.Tensor:
    """The k ids of smallest distance in each row, ties broken by the smaller id: the same
    answer however the candidates were split (across ranks, or by chunk)."""
    by_id = torch.argsort(ids, dim=1, stable=True)
    by_distance = torch.argsort(distances.gather(1, by_id), dim=1, stable=True)
    return ids.gather(1, by_id.gather(1, by_distance[:, :k]))


def knn_candidates(queries: torch.Tensor, reference: torch.Tensor, k: int, exclude: torch.Tensor | None = None,
                   chunk: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """(exact float64 squared distances, reference indices) of the k + margin float32 candidates
    of each query (fewer when the reference is small; an excluded row has distance inf). Each distance is a row-wise sum over the
    d coordinates, so its bits do not depend on how many candidates were computed with it."""
    take = min(k + max(8, k // 4), len(reference))  # the margin absorbs float32 rounding
    ref32 = reference.to(torch.float32)
    ref_sq32 = row_squares(reference).to(torch.float32)
    distances, indices = [], []
    for start in range(0, len(queries), chunk):
        q = queries[start:start + chunk]
        q32 = q.to(torch.float32)
        dist = torch.addmm(ref_sq32, q32, ref32.T, alpha=-2.0).add_((q32 * q32).sum(1, keepdim=True))
        if exclude is not None:
            ex = exclude[start:start + chunk]
            rows = torch.nonzero(ex >= 0).squeeze(1)
            dist[rows, ex[rows]] = float("inf")
        candidates = dist.topk(take, dim=1, largest=False).indices
        exact = ((reference[candidates] - q[:, None, :]) ** 2).sum(2)
        if exclude is not None:  # a small reference may have had to take the excluded row too
            exact[candidates == exclude[start:start + chunk, None]] = float("inf")
        distances.append(exact)
        indices.append(candidates)
    return torch.cat(distances), torch.cat(indices)


def row_squares(x: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    """(x * x).sum(1) without an n x d temporary (each row's sum is the same whatever the chunk)."""
    return torch.cat([(part * part).sum(1) for part in x.split(chunk)]) if len(x) else x.new_zeros(0)


def distinct_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(distinct rows, inverse index) like torch.unique(dim=0) for a float64 matrix, but by
    hashing rows instead of sorting d-wide rows lexicographically. The hash is integer
    arithmetic on the bit patterns (wrapping, so exact whatever the reduction order: a float
    projection could round identical rows differently). The grouping is then verified
    exactly, with torch.unique as the fallback should two different rows collide."""
    hashes = row_hash(x.to(torch.float64), 0x5EED)
    _, first, inverse = np.unique(hashes.cpu().numpy(), return_index=True, return_inverse=True)
    inverse = torch.from_numpy(inverse.reshape(-1)).to(x.device)
    if len(first) == len(x):  # equal rows hash equal, so every row is distinct: no copy needed
        return x, torch.arange(len(x), device=x.device)
    first = torch.from_numpy(first).to(x.device)
    merged = torch.nonzero(first[inverse] != torch.arange(len(x), device=x.device)).squeeze(1)
    if torch.equal(x[merged], x[first[inverse[merged]]]):
        return x[first], inverse
    return torch.unique(x, dim=0, return_inverse=True)


def row_hash(x: torch.Tensor, seed: int) -> torch.Tensor:
    """sum_j fold(bits(x_ij)) * m_j mod 2^64 with random odd m_j. The fold xors the high word
    into the low one first: states stored as float16 have 42 zero low bits in float64, and an
    unfolded product would keep only ~22 bits of hash (colliding on a few thousand rows)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    multipliers = (torch.randint(-2**62, 2**62, (x.shape[1],), generator=g, dtype=torch.int64) | 1).to(x.device)
    hashes = []
    for chunk in x.split(4096):  # the integer temporaries of a chunk, not of the whole layer
        bits = chunk.contiguous().view(torch.int64)
        bits = bits ^ ((bits >> 32) & 0xFFFFFFFF)
        hashes.append((bits * multipliers).sum(1))
    return torch.cat(hashes) if hashes else torch.zeros(0, dtype=torch.int64, device=x.device)


def neighbourhood_lambda_max(reference: torch.Tensor, neighbours: torch.Tensor, chunk: int = 512) -> torch.Tensor:
    """lambda_max of the covariance (ddof 1) of each row's neighbour set, via the k x k Gram matrix."""
    k = neighbours.shape[1]
    values = []
    for start in range(0, len(neighbours), chunk):
        y = reference[neighbours[start:start + chunk]]  # (m, k, d)
        y = y - y.mean(dim=1, keepdim=True)
        gram = y @ y.transpose(1, 2) / (k - 1)
        values.append(torch.linalg.eigvalsh(gram)[:, -1])
    return torch.cat(values)


def covariance_spectrum(centred: torch.Tensor, n: int, world: World = SINGLE) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues (ascending) and eigenvectors (columns) of Sigma = X^T X / (n - 1).

    With fewer states than dimensions (one process), Sigma has at most N non-zero eigenvalues,
    and they are those of the N x N Gram matrix G = X X^T / (n - 1): with G u = lambda u, the
    unit eigenvector of Sigma is X^T u / sqrt((n - 1) lambda). One N x N eigendecomposition
    instead of a d x d one (for d = 4096 and a few thousand states, seconds instead of a
    minute); only the non-zero part of the spectrum is returned (the `thin` case), which every
    proxy handles. Otherwise one d x d eigendecomposition of the all-reduced covariance."""
    d = centred.shape[1]
    if world.size == 1 and n < GRAM_BELOW * d:
        gram = centred @ centred.T / max(n - 1, 1)
        values, vectors = torch.linalg.eigh(gram)
        # the centring null direction (and any numerically zero one): its u would be noise
        keep = values > values.max().clamp(min=0) * 1e-10
        values, vectors = values[keep], vectors[:, keep]
        directions = centred.T @ vectors / (values * max(n - 1, 1)).sqrt()
        return values, directions
    sigma = world.sum(centred.T @ centred) / max(n - 1, 1)
    return torch.linalg.eigh(sigma)


def massive_channels(variances: torch.Tensor, factor: float) -> torch.Tensor:
    """Channels whose variance exceeds `factor` x the median channel variance (sorted indices).

    The rule: a massive channel is one hidden dimension that carries an outsized share of the
    layer's variance in every token, which a per-token norm filter cannot see. Against the
    median (not the mean) so that the massive channel does not raise its own threshold."""
    return torch.nonzero(variances > factor * variances.median()).squeeze(1)


def weighted_median(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Lower weighted median of `values` (n,) under each row of `weights` (B x n)."""
    order = torch.argsort(values)
    cum = torch.cumsum(weights[:, order], dim=1)
    half = cum[:, -1:] / 2
    idx = torch.searchsorted(cum, half).clamp(max=len(values) - 1).squeeze(1)
    return values[order][idx]


def spectrum_summary(eigenvalues: torch.Tensor) -> dict:
    e = eigenvalues.clamp(min=0)
    total = e.sum()
    p = e / total
    entropy = -(p[p > 0] * p[p > 0].log()).sum()
    return {"trace": float(total), "lambda_max": float(e.max()),
            "erank": float(total / e.max()),
            "participation_ratio": float(total ** 2 / (e ** 2).sum()),
            "entropy_rank": float(entropy.exp())}
