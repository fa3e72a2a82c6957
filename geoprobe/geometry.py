"""The geometry of a run: every stored layer's proxies (geoprobe/proxies.py), with
document-bootstrap intervals, over one process or several ranks.

This module reads the run's store, drops massive rows and channels, splits rows across ranks,
draws anchors and pairs, runs the bootstrap, plans the peak memory and fingerprints what it read.

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

from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from geoprobe.distributed import SINGLE, World
from geoprobe.errors import BadInput, GeoprobeError
from geoprobe.proxies import (EPS_REL, GRAM_BELOW, covariance_spectrum, distinct_rows, knn_candidates,
                              massive_channels, nearest, neighbourhood_lambda_max, pair_quotients, row_hash,
                              row_squares, spectrum_summary, weighted_median)
from geoprobe.store import RunReader

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
    drop_massive_channels: bool = False
    channel_factor: float = 20.0
    bootstrap: int = 200
    reseeds: int = 8  # extra draws of anchors and pairs: how stable the choice is against the estimator
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
        if self.reseeds < 0:
            raise BadInput(f"--reseeds must be >= 0, got {self.reseeds}")
        if self.massive_factor <= 1:
            raise BadInput(f"--massive-factor must be > 1, got {self.massive_factor}")
        if self.channel_factor <= 1:
            raise BadInput(f"--channel-factor must be > 1, got {self.channel_factor}")

    def check_rows(self, rows: int) -> None:
        """Refuse, before any extraction, a row count the geometry could never use: every layer
        stores `rows` states, and needs at least --anchors of them and k + 1 distinct ones."""
        if rows < self.anchors:
            raise BadInput(f"--tokens {rows} stores fewer states per layer than --anchors {self.anchors}: raise "
                           f"--tokens or lower --anchors")
        if rows < self.k + 1:
            raise BadInput(f"--tokens {rows} stores fewer states per layer than k + 1 = {self.k + 1}: raise "
                           f"--tokens or lower --k")

    def record(self) -> dict:
        data = asdict(self)
        data.pop("chunk")  # speed only
        return {**data, "eps_rel": EPS_REL, "bootstrap_subspace": SUBSPACE}


# --- resampling and draws -------------------------------------------------------------------


def bootstrap_counts(n_docs: int, replicates: int, seed: int) -> np.ndarray:
    """(B x G) multinomial document counts: each replicate resamples G documents with replacement."""
    rng = np.random.default_rng([seed, 0xB007])
    return rng.multinomial(n_docs, np.full(n_docs, 1.0 / n_docs), size=replicates).astype(np.float64)


MIN_DOCUMENTS = 20  # fewer documents than this: resample blocks instead
MIN_BLOCKS = 5  # fewer blocks than this: no interval at all


def resampling_units(doc_ids: np.ndarray, seq_ids: np.ndarray) -> tuple[np.ndarray, str]:
    """(unit index of every row, unit): documents when at least MIN_DOCUMENTS back the states;
    otherwise blocks (document, sequence), which are nearer to independent than tokens; and
    "none" when even the blocks are fewer than MIN_BLOCKS, so that no interval is printed at
    all (a one-document corpus used to give zero-width intervals and "P(first) 100%")."""
    _, by_document = np.unique(doc_ids, return_inverse=True)
    if by_document.max() + 1 >= MIN_DOCUMENTS:
        return by_document.reshape(-1), "document"
    _, by_block = np.unique(np.stack([doc_ids, seq_ids], 1), axis=0, return_inverse=True)
    return by_block.reshape(-1), ("block" if by_block.max() + 1 >= MIN_BLOCKS else "none")


def interval(replicates: torch.Tensor | np.ndarray) -> list[float]:
    values = np.asarray(replicates, dtype=np.float64)
    if values.size == 0:
        return [float("nan"), float("nan")]
    return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))]


def draw_samples(n: int, settings: GeometrySettings, key: int, reseed: int = 0):
    """Anchor rows (sorted, without replacement) and candidate pair rows, from (seed, key, reseed)
    only (reseed 0 is the estimate; 1..R the draws that measure the estimator's own spread).

    Pairs are drawn 4x over: the first `pairs` candidates whose states differ are used."""
    rng = np.random.default_rng([settings.seed, key] + ([reseed] if reseed else []))
    anchors = np.sort(rng.choice(n, size=settings.anchors, replace=False))
    return anchors, rng.integers(0, n, size=4 * settings.pairs), rng.integers(0, n, size=4 * settings.pairs)


# --- one layer -----------------------------------------------------------------------------


def _without_massive_states(x: torch.Tensor, docs: torch.Tensor, settings: GeometrySettings, world: World):
    """Drop the states whose norm exceeds massive_factor x the median (over every rank's rows)
    when settings say so: (x, docs, the massive mask over all rows, this rank's row offset)."""
    every_norm = world.gather(x.norm(dim=1))
    all_norms = torch.cat(every_norm)
    massive_all = all_norms > settings.massive_factor * all_norms.median()
    keep = [~m for m in torch.split(massive_all, [len(t) for t in every_norm])]  # per rank
    if settings.drop_massive and massive_all.any():  # (a copy of the layer only when something goes)
        x, docs = x[keep[world.rank]], docs[~massive_all]
    else:
        keep = [torch.ones_like(k) for k in keep]
    return x, docs, massive_all, sum(int(k.sum()) for k in keep[: world.rank])


def _centred_spectrum(x: torch.Tensor, n: int, settings: GeometrySettings, world: World, name: str) -> dict:
    """Centre `x` in place, find massive channels (dropped when settings say so), and the
    covariance spectrum (two passes: exact centring). Every later use (kNN distances, duplicates,
    pair differences) is translation invariant, so the layer is held once in float64, not twice."""
    d = x.shape[1]
    x -= world.sum(x.sum(0)) / n
    variances = world.sum((x * x).sum(0)) / max(n - 1, 1)
    channels = massive_channels(variances, settings.channel_factor)
    channel_share = float(variances[channels].sum() / variances.sum().clamp(min=1e-300))
    if settings.drop_massive_channels and len(channels):
        kept = torch.ones(d, dtype=torch.bool, device=x.device)
        kept[channels] = False
        x, d = x[:, kept], int(kept.sum())
    eigenvalues, eigenvectors = covariance_spectrum(x, n, world)
    trace = float(eigenvalues.clamp(min=0).sum())
    if n < 2 or trace <= 0:
        raise BadInput(f"{name}: all states are identical (zero covariance); nothing to measure")
    return {"x": x, "d": d, "channels": channels, "channel_share": channel_share, "eigenvalues": eigenvalues,
            "eigenvectors": eigenvectors, "trace": trace, "scale": trace / d}


def _distinct_reference(x: torch.Tensor, n: int, offset: int, settings: GeometrySettings, world: World,
                        name: str):
    """The kNN reference set of distinct states (split across the ranks that hold it), checked
    against k and --anchors: (reference, its ids, every row's distinct id, local positions)."""
    if world.size == 1:
        reference, inverse = distinct_rows(x)
        reference_ids = torch.arange(len(reference), device=x.device)
    else:
        reference, reference_ids, inverse = _distinct_shared(x, offset, world)
    n_distinct = int(inverse.max()) + 1
    if n_distinct < settings.k + 1:
        raise BadInput(f"{name} has {n_distinct} distinct states, fewer than k+1 = {settings.k + 1}; "
                       "extract more tokens or lower --k")
    if n < settings.anchors:
        raise BadInput(f"{name} has {n} states, fewer than --anchors {settings.anchors}; "
                       "extract more tokens or lower --anchors")
    local_position = torch.full((n_distinct,), -1, dtype=torch.int64, device=x.device)
    local_position[reference_ids] = torch.arange(len(reference_ids), device=x.device)
    return reference, reference_ids, inverse, local_position


def _union_curvature(x, union_rows, offset, *, reference, reference_ids, inverse, local_position, scale,
                     settings: GeometrySettings, world: World) -> torch.Tensor:
    """1 / lambda of every row in `union_rows` (the anchors of every draw): a row's curvature does
    not depend on the draw, so it is computed once for the union."""
    queries = _rows(x, union_rows, offset, world)
    if len(reference):
        dist, idx = knn_candidates(queries, reference, settings.k, exclude=local_position[inverse[union_rows]],
                                   chunk=settings.chunk)
        found = (dist, reference_ids[idx])
    else:
        found = (torch.empty((len(queries), 0), dtype=x.dtype, device=x.device),
                 torch.empty((len(queries), 0), dtype=torch.int64, device=x.device))
    dist = torch.cat(world.gather(found[0].T.contiguous())).T  # candidates of every rank, merged by distance
    ids = torch.cat(world.gather(found[1].T.contiguous())).T
    neighbours = nearest(dist, ids, settings.k)
    lam = _neighbourhood_lambda_shared(reference, local_position, neighbours, world, settings.chunk)
    return 1.0 / lam.clamp(min=EPS_REL * scale)


def _pair_monotonicity(x, i, j, offset, spectrum: dict, ridge: float, world: World) -> torch.Tensor:
    """Per pair, delta' P delta / delta' delta with P = (Sigma + ridge I)^-1."""
    delta = _rows(x, i, offset, world) - _rows(x, j, offset, world)
    return pair_quotients(delta, spectrum["eigenvalues"], spectrum["eigenvectors"], ridge, spectrum["d"])


def layer_geometry(states: torch.Tensor, docs: torch.Tensor, settings: GeometrySettings,
                   counts: torch.Tensor | None = None, rng_key: int = 0, layer: int | None = None,
                   world: World = SINGLE) -> dict:
    """All proxies of one layer. `states` (n x d): this rank's contiguous share of the layer's
    rows, in row order (all of them in a single process); `docs` (N,): the document index in
    0..G-1 of *every* row; `counts` (B x G): bootstrap document counts (shared across layers).

    With several ranks each holds only its rows: sums (mean, covariance, per-document
    statistics) are all-reduced, the kNN runs against each rank's distinct rows and the
    candidates are merged by distance, and the few rows that anchors and pairs need are
    shared. Every rank returns the same result, equal to one process's up to summation order.
    """
    name = f"layer {layer}" if layer is not None else "this layer"
    x = states.to(torch.float64, copy=True)  # centred in place below: never the caller's tensor
    x, docs, massive_all, offset = _without_massive_states(x, docs, settings, world)
    n_all, n = len(massive_all), len(docs)
    spectrum = _centred_spectrum(x, n, settings, world, name)
    x, scale = spectrum["x"], spectrum["scale"]
    reference, reference_ids, inverse, local_position = _distinct_reference(x, n, offset, settings, world, name)

    # every draw of anchors (the estimate's, then --reseeds more): where anchors are a large share
    # of the rows the draws overlap, and R more draws cost far less than R times one
    draws = [draw_samples(n, settings, rng_key, reseed) for reseed in range(settings.reseeds + 1)]
    union = np.unique(np.concatenate([anchors for anchors, _, _ in draws]))
    union_curv = _union_curvature(x, torch.from_numpy(union).to(x.device), offset, reference=reference,
                                  reference_ids=reference_ids, inverse=inverse, local_position=local_position,
                                  scale=scale, settings=settings, world=world)

    def estimate(reseed: int):
        """Per-anchor curvatures and per-pair monotonicities (pairs of non-identical states) for one draw."""
        anchors, cand_i, cand_j = draws[reseed]
        curv_values = union_curv[torch.from_numpy(np.searchsorted(union, anchors)).to(x.device)]
        i, j = torch.from_numpy(cand_i).to(x.device), torch.from_numpy(cand_j).to(x.device)
        valid = (inverse[i] != inverse[j]).nonzero().squeeze(1)[: settings.pairs]
        i, j = i[valid], j[valid]
        mono_values = _pair_monotonicity(x, i, j, offset, spectrum, settings.alpha * scale, world)
        return curv_values, mono_values, torch.from_numpy(anchors).to(x.device), i, j

    curv_values, mono_values, anchor_rows, i, j = estimate(0)
    reseeded = [estimate(r)[:2] for r in range(1, settings.reseeds + 1)]
    reps = {"none": {}, "trace": {}}
    if counts is not None and len(counts):
        reps = _bootstrap(x, docs[offset:offset + len(x)], counts, eigenvectors=spectrum["eigenvectors"],
                          curv_values=curv_values, anchor_docs=docs[anchor_rows], mono_values=mono_values,
                          docs_i=docs[i], docs_j=docs[j], world=world)
    summary = spectrum_summary(spectrum["eigenvalues"])
    result = {
        "layer": layer, "n_states": n_all, "n_used": n, "massive": int(massive_all.sum()),
        "massive_rows": massive_all.nonzero().squeeze(1)[:1000].tolist(),
        "massive_channels": spectrum["channels"].tolist(), "massive_channel_share": spectrum["channel_share"],
        "channels_used": spectrum["d"], "duplicate_fraction": 1.0 - (int(inverse.max()) + 1) / n, "n_pairs": len(i),
        "scale": scale, "participation_ratio": summary["participation_ratio"],
        "entropy_rank": summary["entropy_rank"], "lambda_max": summary["lambda_max"], "trace": spectrum["trace"],
    }
    return _with_estimates(result, summary["erank"], curv_values, mono_values, reseeded, reps)


def _with_estimates(result: dict, erank: float, curv_values, mono_values, reseeded, reps) -> dict:
    """The point estimates (medians), their reseeded medians and bootstrap intervals, raw and trace-normalised."""
    scale = result["scale"]
    # the usual median (mean of the two middle values for an even count), as numpy defines it
    curv, mono = float(torch.quantile(curv_values, 0.5)), float(torch.quantile(mono_values, 0.5))
    points = {"none": {"curv": curv, "mono": mono, "erank": erank},
              "trace": {"curv": curv * scale, "mono": mono * scale, "erank": erank}}
    if reseeded:  # raw medians per draw; the ranking scales them like the point estimate
        result["reseeds"] = {"curv": [float(torch.quantile(c, 0.5)) for c, _ in reseeded],
                             "mono": [float(torch.quantile(m, 0.5)) for _, m in reseeded]}
    if "raw" in reps:
        result["replicates"] = {k: v.cpu().numpy().tolist() for k, v in reps.pop("raw").items()}
    for norm in ("none", "trace"):
        result[norm] = {proxy: {"value": points[norm][proxy],
                                "ci": interval(reps[norm][proxy].cpu().numpy() if proxy in reps[norm] else [])}
                        for proxy in ("curv", "mono", "erank")}
    return result


def _complete(local: torch.Tensor, where: torch.Tensor, world: World) -> torch.Tensor:
    """Rows `local[where]` on every rank, `where` being -1 for rows another rank holds: each
    rank fills in the rows it holds and a sum over ranks completes them (exact: every other
    rank adds zeros)."""
    held = where >= 0
    out = torch.zeros((len(where), local.shape[1]), dtype=local.dtype, device=local.device)
    out[held] = local[where[held]]
    return world.sum(out)


def _rows(x: torch.Tensor, rows: torch.Tensor, offset: int, world: World) -> torch.Tensor:
    """The states of global `rows` (this rank holds rows offset .. offset + len(x) - 1)."""
    if world.size == 1:
        return x[rows]
    local = rows - offset
    return _complete(x, torch.where((local >= 0) & (local < len(x)), local, -1), world)


def _distinct_shared(x: torch.Tensor, offset: int, world: World):
    """Distinct states across ranks: (this rank's distinct rows, their global distinct ids, the
    global distinct id of every row). Rows are grouped by two independent 64-bit integer hashes
    of their bit patterns, gathered from every rank; the first row of a group represents it."""
    hashes = torch.stack([row_hash(x, seed) for seed in (0x5EED, 0xD15C)], 1)
    every = torch.cat(world.gather(hashes)).cpu().numpy()
    _, first, inverse = np.unique(every[:, 0], return_index=True, return_inverse=True)
    if not np.array_equal(every[first[inverse.reshape(-1)], 1], every[:, 1]):
        raise GeoprobeError("two different hidden states share a 64-bit hash; rerun the geometry in one process")
    first = torch.from_numpy(first).to(x.device)
    mine = ((first >= offset) & (first < offset + len(x))).nonzero().squeeze(1)
    return x[first[mine] - offset], mine, torch.from_numpy(inverse.reshape(-1)).to(x.device)


def peak_bytes(n: int, d: int, settings: GeometrySettings) -> int:
    """Device memory of one layer's geometry (`compute_geometry`): the layer in float32 (4nd) and
    layer_geometry's float64 copy (8nd), then the largest of what each phase adds: the channel
    variances' n x d square, or dropping massive rows or channels (one more float64 copy while
    the old one goes), 8nd either way; the spectrum (the n x n Gram matrix, its eigenvectors and
    the d x n directions below n = d; else three d x d matrices), the kNN (a float32 copy of the reference rows, one
    chunk x n float32 distance block, the chunk's exact distances over its candidates),
    the neighbourhoods (a chunk of k x d neighbour sets, centred) and the bootstrap (per-document
    sums and the top eigen-directions' n x r^2 scatter), the last three beside the anchors' rows
    (the union of every draw's) and the kNN reference of distinct rows, a float64 copy when rows
    repeat (8nd at most: counted whole, since a plan made before extraction cannot know how many
    repeat; an H200 run at N = 200k x 4,096 with 10 % repeated rows peaked at 1.37 x the plan that
    left it out). Kernels' workspaces (eigh's) are not counted."""
    take = min(settings.k + max(8, settings.k // 4), n)
    chunk = min(settings.chunk, n)
    spectrum = 16 * n * n + 8 * d * n if n < GRAM_BELOW * d else 24 * d * d
    knn = 4 * n * d + 4 * chunk * n + 16 * chunk * take * d
    neighbourhoods = 16 * chunk * settings.k * d
    bootstrap = 8 * n * (SUBSPACE * SUBSPACE + SUBSPACE + 2)
    queries = 8 * min(n, settings.anchors * (settings.reseeds + 1)) * d  # the anchors' rows, held from the kNN on
    distinct = 8 * n * d
    return 12 * n * d + max(8 * n * d, spectrum, queries + distinct + max(knn, neighbourhoods, bootstrap))


def _neighbourhood_lambda_shared(reference, local_position, neighbours, world: World, chunk: int) -> torch.Tensor:
    """lambda_max of each anchor's neighbourhood when its neighbours may live on any rank: the
    distinct neighbour rows (often far fewer than anchors x k) are completed by one sum over
    ranks, each rank filling in those it holds."""
    if world.size == 1:
        return neighbourhood_lambda_max(reference, neighbours, chunk=chunk)
    needed, position = torch.unique(neighbours, return_inverse=True)
    return neighbourhood_lambda_max(_complete(reference, local_position[needed], world), position, chunk=chunk)


def _bootstrap(centred, docs, counts, *, eigenvectors, curv_values, anchor_docs, mono_values, docs_i, docs_j,
               world: World = SINGLE):
    """Replicate proxies for every row of `counts`, from per-document sufficient statistics
    (`centred` and `docs`: this rank's rows; the statistics are summed over ranks)."""
    d = centred.shape[1]
    n_docs = counts.shape[1]

    def per_doc(values):
        sums = torch.zeros((n_docs, *values.shape[1:]), dtype=centred.dtype, device=centred.device)
        return world.sum(sums.index_add_(0, docs, values))

    local = len(centred)
    n_w = counts @ per_doc(torch.ones(local, dtype=centred.dtype, device=centred.device))
    shift = counts @ per_doc(centred) / n_w[:, None]  # replicate mean minus full-data mean
    trace_w = (counts @ per_doc(row_squares(centred)) - n_w * (shift ** 2).sum(1)) / (n_w - 1)
    proj = centred @ eigenvectors[:, -min(SUBSPACE, d):]  # (n, r): the top-r eigen-directions
    r = proj.shape[1]
    m_r = counts @ per_doc(proj) / n_w[:, None]
    scatter = (counts @ per_doc((proj[:, :, None] * proj[:, None, :]).reshape(local, -1))).reshape(-1, r, r)
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


def finished_run(run, manifest: dict | None = None) -> RunReader:
    """The run opened for reading (every shard checked), or one line saying that its extraction
    has not finished. `manifest`: its manifest where the caller has just read it."""
    reader = RunReader(run, manifest=manifest)
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


def compute_geometry(reader: RunReader, settings: GeometrySettings, device: torch.device, layers=None,
                     progress=None, world: World = SINGLE) -> dict:
    """Proxies of every stored layer of a finished run, opened (`finished_run`); one layer in
    memory at a time; with several ranks, each holds a contiguous share of the layer's rows."""
    settings.validate()
    meta = reader.read_meta()
    doc_ids = meta["doc_id"]
    n_docs = len(np.unique(doc_ids))
    unit_index, unit = resampling_units(doc_ids, meta["seq_id"])
    n_units = int(unit_index.max()) + 1
    docs = torch.from_numpy(unit_index.astype(np.int64)).to(device)
    replicates = settings.bootstrap if unit != "none" else 0
    counts = torch.from_numpy(bootstrap_counts(n_units, replicates, settings.seed)).to(device)
    layers = reader.layers if layers is None else layers
    share = world.share(len(doc_ids))
    results = []
    if progress is not None:
        progress.start(total=len(layers))
    for layer in layers:
        # filled batch by batch (no whole-layer copy on the host), in float32: the stored float16 and
        # float32 rows exactly, at half the bytes of the float64 copy layer_geometry works on
        states = torch.empty((share[1] - share[0], reader.hidden_size), dtype=torch.float32, device=device)
        filled = 0
        for batch in reader.iter_layer(layer, rows=share):
            states[filled:filled + len(batch)] = torch.from_numpy(batch).to(device)
            filled += len(batch)
        result = layer_geometry(states, docs, settings, counts, rng_key=layer, layer=layer, world=world)
        if result["massive_channels"]:  # the ranking is shown both ways: the other choice for this layer
            other = replace(settings, drop_massive_channels=not settings.drop_massive_channels)
            result["other_channels"] = {k: v for k, v in layer_geometry(
                states, docs, other, counts, rng_key=layer, layer=layer, world=world).items()
                if k in ("none", "trace", "replicates", "reseeds", "channels_used", "scale")}
        results.append(result)
        del states
        if progress is not None:
            progress.advance(1)
    manifest = reader.manifest
    return {"tool": "geoprobe", "command": "geometry", "run_fingerprint": run_fingerprint(manifest),
            "model": manifest["model"].get("spec"), "rows": reader.num_rows, "n_docs": n_docs,
            "bootstrap_unit": unit, "bootstrap_units": n_units if unit != "none" else 0,
            "hidden_size": reader.hidden_size, "settings": settings.record(), "layers": results}
