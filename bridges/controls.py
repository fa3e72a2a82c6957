"""Closed-form controls for the hidden-state bridges: what "learned" means.

A bridge reconstructs h_l at every position from the tokens. Its nmse means little on its own: a
layer whose state is mostly a function of the current token is "reconstructed" by a lookup table.
These controls are simple predictors of h_l, fitted on the training positions and scored on
held-out ones; a reviewer wants them beside every bridge number, because a bridge is only worth
its cost by the margin it has over the best of them.

* `mean_control`: the train mean state everywhere. Its nmse is 1 by definition (up to the gap
  between train and query means): the floor that says "predicts nothing".
* `token_lookup`: the mean train state of each token id (unigram). It measures how much of h_l is
  a per-token constant, i.e. how much the layer still looks like an embedding table.
* `ridge_control`: ridge regression of h_l on the input-embedding rows of the current token and
  the `window` tokens before it (left context only, as the causal model sees). It measures how
  much is a linear function of a short context: what a bridge beats only if it uses longer-range
  or non-linear structure. Closed form (one eigendecomposition serves every penalty); the penalty
  is chosen on a separate `stop` split, never on the positions it is reported on.
* `lookup_ridge`: the token lookup plus the same ridge fitted to what the lookup leaves (h_l minus
  the token's mean state): the simplest predictor that has both the table the default bridge
  starts from and a short left context. A bridge whose update beats the lookup but not this has
  learned no more context than a linear map of the previous `window` embeddings gives. (The
  residual is in-sample for the table: a token seen once has residual 0 there, which shrinks the
  context the ridge can find, so the control errs towards being easy to beat.)

Splits are duck-typed: `split.ids` (N,) token ids of every block concatenated, `split.starts`
(B+1,) block offsets (position 0 of each block is its BOS token), `split.states[layer]` (N, d)
float32 teacher states row-aligned with ids. Position 0 (BOS) is excluded from ridge fitting and
selection: the bridge never generates it (its state is the backbone's own), and its state is an
outlier (attention sink) that would dominate a least-squares fit. Every control still returns a
prediction for every query position, BOS included; score positions >= 1 as for a bridge.
`nmse_dim` is the per-channel nmse of geoprobe.bridges.fit.validate: the mean over channels with nonzero
variance of sum of squared error / sum of squared deviation from the channel's mean.
"""

from __future__ import annotations

import torch

from geoprobe.bridges.scoring import fitted_rows, generated_rows, scored_rows, state_losses

CHUNK = 8192  # rows per chunk: bounds the features (and float64 copies of states) held at once


def _ids(query) -> torch.Tensor:
    """A split's ids, or the ids themselves: lookup and mean need nothing else of the query."""
    return query.ids if hasattr(query, "ids") else torch.as_tensor(query, dtype=torch.long)


def mean_control(train, layer: int, query, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The train mean state (over the flat indices `rows`, default all) at every query position
    (Nq, d) float32."""
    states = train.states[layer] if rows is None else train.states[layer][rows]
    total = sum(states[s:s + CHUNK].double().sum(0) for s in range(0, len(states), CHUNK))
    mean = (total / len(states)).float()
    return mean.expand(len(_ids(query)), -1).clone()


def lookup_table(train, layer: int, rows: torch.Tensor | None = None):
    """The token lookup fitted on `train` (the flat indices `rows`, default all): a function from
    token ids (n,) to each id's mean train state (n, d) float32, the overall train mean for an id
    never seen in training (the best guess that knows nothing of the token)."""
    states = train.states[layer] if rows is None else train.states[layer][rows]
    train_ids = train.ids if rows is None else train.ids[rows]
    # Rows only for the ids that occur: a dense V x d float64 table would be 4 GB at V = 128k,
    # d = 4096, while a corpus touches a small share of the vocabulary.
    unique, slot = torch.unique(train_ids, return_inverse=True)
    sums = torch.zeros(len(unique), states.shape[1], dtype=torch.float64, device=states.device)
    for s in range(0, len(states), CHUNK):  # float64 sums: long token histories lose float32 digits
        sums.index_add_(0, slot[s:s + CHUNK].to(states.device), states[s:s + CHUNK].double())
    counts = torch.bincount(slot, minlength=len(unique)).to(sums)
    overall = (sums.sum(0) / max(len(states), 1)).float()
    table = (sums / counts.clamp(min=1)[:, None]).float()

    def lookup(ids: torch.Tensor) -> torch.Tensor:
        ids = ids.to(unique.device)
        at = torch.searchsorted(unique, ids).clamp(max=max(len(unique) - 1, 0))
        seen = (unique[at] == ids) if len(unique) else torch.zeros_like(ids, dtype=torch.bool)
        found = table[at.to(table.device)] if len(unique) else overall.expand(len(ids), -1)
        return torch.where(seen.to(table.device)[:, None], found, overall)

    return lookup


def token_lookup(train, layer: int, query, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The mean train state (over the flat indices `rows`, default all) of each query token id
    (Nq, d) float32 (`lookup_table`)."""
    return lookup_table(train, layer, rows)(_ids(query))


def window_features(split, embeddings: torch.Tensor, window: int, rows: torch.Tensor | None = None) -> torch.Tensor:
    """[E[x_i], E[x_{i-1}], ..., E[x_{i-window}]] for each position i (all, or the flat indices
    `rows`): (n, (window+1) * d_e) float32, zeros where i-k falls before the block's start (the
    true state is causal and sees only its own block's earlier tokens)."""
    ids = split.ids.to(embeddings.device)
    starts = split.starts.to(embeddings.device)
    rows = torch.arange(len(ids), device=ids.device) if rows is None else rows.to(ids.device)
    # right=True: the last block starting at or before the row (skips empty blocks' repeated starts)
    block_start = starts[torch.searchsorted(starts, rows, right=True) - 1]
    parts = []
    for k in range(window + 1):
        src = rows - k
        inside = (src >= block_start).unsqueeze(1)
        parts.append(embeddings[ids[src.clamp(min=0)]].float() * inside)
    return torch.cat(parts, dim=1)


def _chunks(rows: torch.Tensor):
    return (rows[s:s + CHUNK] for s in range(0, len(rows), CHUNK))


def _target(split, rows, layer, base) -> torch.Tensor:
    """What the ridge fits at `rows`: the state, less the base prediction of the row's token."""
    states = split.states[layer][rows.to(split.states[layer].device)]
    return states if base is None else states - base(split.ids[rows]).to(states.device)


def _normal_equations(split, rows, layer, embeddings, window, base=None):
    """Means of X and Y over `rows` and the centred XᵀX, XᵀY in float64, a chunk of features at a
    time. Two passes (means first) rather than XᵀX - n mu muᵀ: no cancellation when the means are
    large against the spread (massive activation channels)."""
    states = split.states[layer]
    p = (window + 1) * embeddings.shape[1]
    sx = torch.zeros(p, dtype=torch.float64, device=states.device)
    sy = torch.zeros(states.shape[1], dtype=torch.float64, device=states.device)
    for r in _chunks(rows):
        sx += window_features(split, embeddings, window, r).to(states.device).double().sum(0)
        sy += _target(split, r, layer, base).double().sum(0)
    mx, my = sx / len(rows), sy / len(rows)
    xtx = torch.zeros(p, p, dtype=torch.float64, device=states.device)
    xty = torch.zeros(p, states.shape[1], dtype=torch.float64, device=states.device)
    for r in _chunks(rows):
        x = window_features(split, embeddings, window, r).to(states.device).double() - mx
        xtx += x.T @ x
        xty += x.T @ (_target(split, r, layer, base).double() - my)
    return mx, my, xtx, xty


def _predict(split, rows, embeddings, window, mx, my, weight, base=None) -> torch.Tensor:
    """(X - mu_x) W + mu_y (+ the base prediction) at `rows`, a chunk of features at a time; float32."""
    out = []
    for r in _chunks(rows):
        x = window_features(split, embeddings, window, r).to(weight.device).double() - mx
        fitted = x @ weight + my
        out.append((fitted if base is None else fitted + base(split.ids[r]).to(fitted.device).double()).float())
    return torch.cat(out) if out else torch.zeros(0, len(my), device=weight.device)


def ridge_control(train, stop, query, *, layer: int, embeddings: torch.Tensor, window: int = 4,
                  lambdas=(1e-3, 1e-2, 1e-1, 1.0, 10.0), max_rows: int = 65536, seed: int = 0,
                  rows: torch.Tensor | None = None, stop_rows: torch.Tensor | None = None, base=None):
    """Ridge regression of h_l (less `base(ids)` where given: a ridge on what a per-token
    prediction leaves) on window_features (intercept unpenalised), penalty
    lambda * tr(XcᵀXc) / p * I for each relative lambda (scale-free: the same grid suits any layer
    and embedding scale), lambda chosen by nmse_dim on `stop`'s positions >= 1. Fitted on at most
    `max_rows` train positions >= 1 (a seeded random subset beyond), or of the flat indices `rows`
    (and `stop_rows` for the choice). Returns (predictions at every query position (Nq, d)
    float32, info)."""
    rows = generated_rows(train) if rows is None else rows
    available = len(rows)
    if available == 0:
        raise ValueError("ridge_control: the train split has no position >= 1")
    if available > max_rows:  # bounded cost; seeded, so a rerun fits the same rows
        pick = torch.randperm(available, generator=torch.Generator().manual_seed(seed))[:max_rows]
        rows = rows[pick.sort().values]
    mx, my, xtx, xty = _normal_equations(train, rows, layer, embeddings, window, base)
    p = xtx.shape[0]
    scale = float(torch.trace(xtx)) / p
    # One eigendecomposition serves every lambda: W = Q diag(1 / (e + alpha)) Qᵀ XᵀY.
    evals, evecs = torch.linalg.eigh(xtx)
    rotated = evecs.T @ xty

    def weight(lam: float) -> torch.Tensor:
        denom = evals.clamp(min=0) + lam * scale
        inv = torch.where(denom > 0, 1.0 / denom.clamp(min=1e-300), torch.zeros_like(denom))
        return evecs @ (rotated * inv[:, None])

    by_lambda = {}
    if stop is None and len(lambdas) > 1:
        raise ValueError("ridge_control: choosing among several lambdas needs a stop split")
    if stop is not None:
        stop_rows = generated_rows(stop) if stop_rows is None else stop_rows
        target = stop.states[layer][stop_rows.to(stop.states[layer].device)]
        for lam in lambdas:
            pred = _predict(stop, stop_rows, embeddings, window, mx, my, weight(float(lam)), base)
            error = (pred.double() - target.to(pred.device).double()).square()
            by_lambda[float(lam)] = state_losses(target.to(pred.device).double(), error)["nmse_dim"]
    # never the query: the penalty is chosen on positions the reported score does not see
    chosen = min(by_lambda, key=by_lambda.get) if by_lambda else float(lambdas[0])
    query_rows = torch.arange(len(query.ids))
    predictions = _predict(query, query_rows, embeddings, window, mx, my, weight(chosen), base)
    info = {"window": window, "lambda": chosen, "train_rows": len(rows), "stop_nmse_dim_by_lambda": by_lambda,
            "train_rows_available": available, "subsampled": available > max_rows, "seed": seed}
    return predictions, info


MAX_RIDGE_FEATURES = 8192  # (window + 1) x d: the normal equations' side (8,192^2 float64 = 0.5 GB, one eigh)


def ridge_window(hidden_size: int) -> int:
    """The ridge control's window: 4 tokens before the current one, fewer where (window + 1) x d
    would pass MAX_RIDGE_FEATURES (d = 4,096: 1), so that its one eigendecomposition stays small."""
    return min(4, max(0, MAX_RIDGE_FEATURES // hidden_size - 1))


def layer_controls(states, layer: int, embeddings: torch.Tensor, massive_factor: float | None,
                   window: int | None = None) -> dict:
    """The controls of one layer from a run's cached teacher states (geoprobe.bridges.states): each
    fitted on the training pool (the ridge's penalty chosen on the stopping split) and scored on
    the validation split exactly as a bridge is (positions >= 1, massive rows left out):
    control_{mean,lookup,ridge,lookup_ridge}_{nmse,nmse_dim}, and the ridges' settings."""
    window = ridge_window(embeddings.shape[1]) if window is None else window
    rows = generated_rows(states.val)
    target = states.val.states[layer][rows].double()
    scored = scored_rows(target, massive_factor)
    # fitted on the rows the bridge trains on: positions >= 1 whose state is not massive
    fit = {name: fitted_rows(split, layer, massive_factor) for name, split in (("train", states.train),
                                                                            ("stop", states.stop))}
    stop = states.stop if len(fit["stop"]) else None
    lookup = lookup_table(states.train, layer, fit["train"])
    ridges = {name: ridge_control(states.train, stop, states.val, layer=layer, embeddings=embeddings, window=window,
                                  lambdas=(1e-3, 1e-2, 1e-1, 1.0, 10.0) if stop is not None else (1e-2,),
                                  rows=fit["train"], stop_rows=fit["stop"] if stop is not None else None, base=base)
              for name, base in (("ridge", None), ("lookup_ridge", lookup))}
    predictions = {"mean": mean_control(states.train, layer, states.val, fit["train"]),
                   "lookup": lookup(states.val.ids), **{name: pred for name, (pred, _) in ridges.items()}}
    out = {}
    for name, prediction in predictions.items():
        error = (prediction[rows].double() - target) ** 2
        for key, value in state_losses(target[scored], error[scored]).items():
            out[f"control_{name}_{key}"] = value
    for name, (_, info) in ridges.items():
        out[f"control_{name}"] = {"window": info["window"], "lambda": info["lambda"], "train_rows": info["train_rows"]}
    return out
