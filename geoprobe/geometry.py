"""Per-layer geometry proxies of stored hidden states, with document-bootstrap intervals.

For a layer's states X (N x d) with covariance Sigma (float64 throughout, on the device):

* effective rank  k = tr(Sigma) / lambda_max(Sigma); also the participation ratio
  tr(Sigma)^2 / tr(Sigma^2) and the entropy effective rank exp(H(lambda / sum lambda));
* local curvature m_curv = median over M anchors of 1 / lambda_max(C_i), C_i the covariance
  (ddof 1) of the anchor's k nearest *distinct* states (Euclidean, itself excluded). The kNN
  is chunked matrix products + `topk`; lambda_max(C_i) comes from the k x k Gram matrix of the
  centred neighbours (same non-zero spectrum as the d x d covariance), floored at
  EPS_REL * tr(Sigma)/d so near-identical neighbourhoods stay finite;
* global monotonicity m_mono = median over random pairs of
  (x_i - x_j)^T P (x_i - x_j) / |x_i - x_j|^2 with P = (Sigma + lambda I)^-1,
  lambda = alpha * tr(Sigma)/d, from one eigendecomposition of Sigma; pairs of identical
  states are skipped.

Normalisation: `trace` divides each layer by sqrt(tr(Sigma)/d) first. The effective rank is
scale-free; curvature and monotonicity scale as 1/c^2, so their trace-normalised values are
the raw ones times tr(Sigma)/d. Both are reported.

Uncertainty: B bootstrap replicates resample *documents* with replacement (the same
replicate weights for every layer, so ranks can be compared). A replicate reuses the kNN
graph, the anchors' 1/lambda_max values, the pairs' quotients and per-document sufficient
statistics: curvature and monotonicity become weighted medians; tr(Sigma_w) is exact;
lambda_max(Sigma_w) is the Rayleigh-Ritz value in the top-r eigenvectors of Sigma (exact to
first order, a lower bound); P is held at the full-data estimate. Intervals are the 2.5% and
97.5% percentiles.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from geoprobe.errors import BadInput

EPS_REL = 1e-6  # floor of a neighbourhood's lambda_max, relative to the layer's tr(Sigma)/d
SUBSPACE = 16  # eigenvectors kept for the bootstrap's lambda_max(Sigma_w)


@dataclass(frozen=True)
class GeometrySettings:
    k: int = 32
    anchors: int = 2048
    pairs: int = 4096
    alpha: float = 1e-3
    normalize: str = "trace"
    drop_massive: bool = True
    massive_factor: float = 20.0
    bootstrap: int = 200
    seed: int = 0
    chunk: int = 512  # anchors per kNN chunk: bounds the (chunk x N) distance matrix

    def validate(self) -> None:
        if self.k < 2:
            raise BadInput(f"--k must be at least 2 (a neighbourhood needs a spread), got {self.k}")
        if self.anchors < 1:
            raise BadInput(f"--anchors must be at least 1, got {self.anchors}")
        if self.pairs < 1:
            raise BadInput(f"--pairs must be at least 1, got {self.pairs}")
        if not 0 < self.alpha <= 1e3:
            raise BadInput(f"--alpha must be in (0, 1000], got {self.alpha}")
        if self.normalize not in ("trace", "none"):
            raise BadInput(f"--normalize must be trace or none, got {self.normalize!r}")
        if self.bootstrap < 0:
            raise BadInput(f"--bootstrap must be >= 0, got {self.bootstrap}")
        if self.massive_factor <= 1:
            raise BadInput(f"--massive-factor must be > 1, got {self.massive_factor}")

    def record(self) -> dict:
        data = asdict(self)
        data.pop("chunk")  # speed only
        return {**data, "eps_rel": EPS_REL, "bootstrap_subspace": SUBSPACE}


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
    margin = min(max(8, k // 4), len(reference) - k - (exclude is not None))
    ref32 = reference.to(torch.float32)
    ref_sq = (reference * reference).sum(1)
    ref_sq32 = ref_sq.to(torch.float32)
    out = []
    for start in range(0, len(queries), chunk):
        q = queries[start:start + chunk]
        q32 = q.to(torch.float32)
        dist = torch.addmm(ref_sq32, q32, ref32.T, alpha=-2.0).add_((q32 * q32).sum(1, keepdim=True))
        if exclude is not None:
            ex = exclude[start:start + chunk]
            rows = torch.nonzero(ex >= 0).squeeze(1)
            dist[rows, ex[rows]] = float("inf")
        candidates = dist.topk(k + margin, dim=1, largest=False).indices
        dots = torch.bmm(reference[candidates], q[:, :, None]).squeeze(2)
        exact = ref_sq[candidates] - 2.0 * dots + (q * q).sum(1, keepdim=True)
        out.append(candidates.gather(1, exact.topk(k, dim=1, largest=False).indices))
    return torch.cat(out)


def distinct_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(distinct rows, inverse index) like torch.unique(dim=0) for a float64 matrix, but by
    hashing rows instead of sorting d-wide rows lexicographically. The hash is integer
    arithmetic on the bit patterns (wrapping, so exact whatever the reduction order: a float
    projection could round identical rows differently). The grouping is then verified
    exactly, with torch.unique as the fallback should two different rows collide."""
    g = torch.Generator(device="cpu").manual_seed(0x5EED)
    multipliers = (torch.randint(-2**62, 2**62, (x.shape[1],), generator=g, dtype=torch.int64) | 1).to(x.device)
    hashes = (x.to(torch.float64).contiguous().view(torch.int64) * multipliers).sum(1)
    _, first, inverse = np.unique(hashes.cpu().numpy(), return_index=True, return_inverse=True)
    inverse = torch.from_numpy(inverse.reshape(-1)).to(x.device)
    if len(first) == len(x):  # equal rows hash equal, so every row is distinct: no copy needed
        return x, torch.arange(len(x), device=x.device)
    first = torch.from_numpy(first).to(x.device)
    merged = torch.nonzero(first[inverse] != torch.arange(len(x), device=x.device)).squeeze(1)
    if torch.equal(x[merged], x[first[inverse[merged]]]):
        return x[first], inverse
    return torch.unique(x, dim=0, return_inverse=True)


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


def bootstrap_counts(n_docs: int, replicates: int, seed: int) -> np.ndarray:
    """(B x G) multinomial document counts: each replicate resamples G documents with replacement."""
    rng = np.random.default_rng([seed, 0xB007])
    return rng.multinomial(n_docs, np.full(n_docs, 1.0 / n_docs), size=replicates).astype(np.float64)


def interval(replicates: torch.Tensor | np.ndarray) -> list[float]:
    values = np.asarray(replicates, dtype=np.float64)
    if values.size == 0:
        return [float("nan"), float("nan")]
    return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))]


def draw_samples(n: int, settings: GeometrySettings, key: int):
    """Anchor rows (sorted, without replacement) and candidate pair rows, from (seed, key) only.

    Pairs are drawn 4x over: the first `pairs` candidates whose states differ are used."""
    rng = np.random.default_rng([settings.seed, key])
    anchors = np.sort(rng.choice(n, size=settings.anchors, replace=False))
    return anchors, rng.integers(0, n, size=4 * settings.pairs), rng.integers(0, n, size=4 * settings.pairs)


# --- one layer -----------------------------------------------------------------------------


def layer_geometry(states: torch.Tensor, docs: torch.Tensor, settings: GeometrySettings,
                   counts: torch.Tensor | None = None, rng_key: int = 0, layer: int | None = None) -> dict:
    """All proxies of one layer. `states` (N x d) float64, `docs` (N,) document index in
    0..G-1, `counts` (B x G) bootstrap document counts (shared across layers)."""
    name = f"layer {layer}" if layer is not None else "this layer"
    x = states.to(torch.float64)
    n_all, d = x.shape

    norms = x.norm(dim=1)
    massive = norms > settings.massive_factor * norms.median()
    if settings.drop_massive and massive.any():
        x, docs = x[~massive], docs[~massive]
    n = len(x)

    # covariance and its spectrum: one eigendecomposition per layer
    mean = x.mean(0)
    centred = x - mean
    sigma = centred.T @ centred / max(n - 1, 1)
    eigenvalues, eigenvectors = torch.linalg.eigh(sigma)
    trace = float(eigenvalues.clamp(min=0).sum())
    if n < 2 or trace <= 0:
        raise BadInput(f"{name}: all states are identical (zero covariance); nothing to measure")
    scale = trace / d
    spectrum = spectrum_summary(eigenvalues)

    # kNN among distinct states
    distinct, inverse = distinct_rows(x)
    duplicate_fraction = 1.0 - len(distinct) / n
    if len(distinct) < settings.k + 1:
        raise BadInput(f"{name} has {len(distinct)} distinct states, fewer than k+1 = {settings.k + 1}; "
                       "extract more tokens or lower --k")
    if n < settings.anchors:
        raise BadInput(f"{name} has {n} states, fewer than --anchors {settings.anchors}; "
                       "extract more tokens or lower --anchors")
    anchors, cand_i, cand_j = draw_samples(n, settings, rng_key)
    anchor_rows = torch.from_numpy(anchors).to(x.device)
    neighbours = knn(x[anchor_rows], distinct, settings.k, exclude=inverse[anchor_rows], chunk=settings.chunk)
    lam = neighbourhood_lambda_max(distinct, neighbours, chunk=settings.chunk).clamp(min=EPS_REL * scale)
    curv_values = 1.0 / lam

    # monotonicity on random pairs of non-identical states
    i, j = torch.from_numpy(cand_i).to(x.device), torch.from_numpy(cand_j).to(x.device)
    valid = (inverse[i] != inverse[j]).nonzero().squeeze(1)[: settings.pairs]
    i, j = i[valid], j[valid]
    projected = (x[i] - x[j]) @ eigenvectors
    ridge = settings.alpha * scale
    sq = projected ** 2
    mono_values = (sq / (eigenvalues.clamp(min=0) + ridge)).sum(1) / sq.sum(1)

    # the usual median (mean of the two middle values for an even count), as numpy defines it
    curv, mono = float(torch.quantile(curv_values, 0.5)), float(torch.quantile(mono_values, 0.5))
    result = {
        "layer": layer, "n_states": n_all, "n_used": n, "massive": int(massive.sum()),
        "duplicate_fraction": duplicate_fraction, "n_pairs": len(valid), "scale": scale,
        "participation_ratio": spectrum["participation_ratio"], "entropy_rank": spectrum["entropy_rank"],
        "lambda_max": spectrum["lambda_max"], "trace": trace,
    }
    points = {"none": {"curv": curv, "mono": mono, "erank": spectrum["erank"]},
              "trace": {"curv": curv * scale, "mono": mono * scale, "erank": spectrum["erank"]}}
    reps = {"none": {}, "trace": {}}
    if counts is not None and len(counts):
        reps = _bootstrap(x, centred, docs, counts, eigenvectors, curv_values, docs[anchor_rows],
                          mono_values, docs[i], docs[j])
        result["replicates"] = {k: v.cpu().numpy().tolist() for k, v in reps.pop("raw").items()}
    for norm in ("none", "trace"):
        result[norm] = {proxy: {"value": points[norm][proxy],
                                "ci": interval(reps[norm][proxy].cpu().numpy() if proxy in reps[norm] else [])}
                        for proxy in ("curv", "mono", "erank")}
    return result


def _bootstrap(x, centred, docs, counts, eigenvectors, curv_values, anchor_docs, mono_values, docs_i, docs_j):
    """Replicate proxies for every row of `counts`, from per-document sufficient statistics."""
    n, d = x.shape
    n_docs = counts.shape[1]

    def per_doc(values):
        return torch.zeros((n_docs, *values.shape[1:]), dtype=x.dtype, device=x.device).index_add_(0, docs, values)

    n_w = counts @ per_doc(torch.ones(n, dtype=x.dtype, device=x.device))
    shift = counts @ per_doc(centred) / n_w[:, None]  # replicate mean minus full-data mean
    trace_w = (counts @ per_doc((centred ** 2).sum(1)) - n_w * (shift ** 2).sum(1)) / (n_w - 1)
    proj = centred @ eigenvectors[:, -min(SUBSPACE, d):]  # (n, r): the top-r eigen-directions
    r = proj.shape[1]
    m_r = counts @ per_doc(proj) / n_w[:, None]
    scatter = (counts @ per_doc((proj[:, :, None] * proj[:, None, :]).reshape(n, -1))).reshape(-1, r, r)
    sigma_r = (scatter - n_w[:, None, None] * m_r[:, :, None] * m_r[:, None, :]) / (n_w - 1)[:, None, None]
    lam_max_w = torch.linalg.eigvalsh(sigma_r)[:, -1]
    curv_w = weighted_median(curv_values, counts[:, anchor_docs])
    mono_w = weighted_median(mono_values, counts[:, docs_i] * counts[:, docs_j])
    erank_w = trace_w / lam_max_w
    scale_w = trace_w / d
    return {"none": {"curv": curv_w, "mono": mono_w, "erank": erank_w},
            "trace": {"curv": curv_w * scale_w, "mono": mono_w * scale_w, "erank": erank_w},
            "raw": {"curv": curv_w, "mono": mono_w, "erank": erank_w, "scale": scale_w}}


# --- a whole run ---------------------------------------------------------------------------


def finished_run(run):
    from geoprobe.store import RunReader

    reader = RunReader(run)
    manifest = reader.manifest
    if manifest.get("status") != "complete":
        done = sum(s["rows"] for s in manifest.get("shards", []))
        raise BadInput(f"{run} has not finished extracting ({done} of {manifest.get('rows_target')} rows); "
                       "rerun the extract command to resume it")
    return reader


def run_fingerprint(manifest: dict) -> str:
    """What the geometry was computed from: the extraction config and every shard's checksum."""
    import hashlib

    shards = ",".join(s["sha256"] for s in manifest["shards"])
    return hashlib.sha256(f"{manifest['config_sha256']}|{shards}".encode()).hexdigest()


def compute_geometry(run, settings: GeometrySettings, device: torch.device, layers=None, progress=None) -> dict:
    """Proxies of every stored layer of `run` (one layer in memory at a time)."""
    settings.validate()
    reader = finished_run(run)
    doc_ids = reader.read_meta()["doc_id"]
    _, doc_index = np.unique(doc_ids, return_inverse=True)
    n_docs = int(doc_index.max()) + 1
    docs = torch.from_numpy(doc_index.astype(np.int64)).to(device)
    counts = torch.from_numpy(bootstrap_counts(n_docs, settings.bootstrap, settings.seed)).to(device)
    layers = reader.layers if layers is None else layers
    results = []
    if progress is not None:
        progress.start(total=len(layers))
    for layer in layers:
        states = torch.cat([torch.from_numpy(b) for b in reader.iter_layer(layer)]).to(device, torch.float64)
        results.append(layer_geometry(states, docs, settings, counts, rng_key=layer, layer=layer))
        del states
        if progress is not None:
            progress.advance(1)
    manifest = reader.manifest
    return {"tool": "geoprobe", "command": "geometry", "run_fingerprint": run_fingerprint(manifest),
            "model": manifest["model"].get("spec"), "rows": reader.num_rows, "n_docs": n_docs,
            "hidden_size": reader.hidden_size, "settings": settings.record(), "layers": results}
