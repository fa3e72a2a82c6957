"""The closed-form controls (bridges/controls.py) against independent computations: numpy for
the token lookup and nmse_dim, a Python loop for the window features, scikit-learn for ridge."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from sklearn.linear_model import Ridge

from geoprobe.bridges.controls import mean_control, ridge_control, token_lookup, window_features
from geoprobe.bridges.scoring import state_losses

V, D_E, D, LAYER = 50, 8, 16, 3


@dataclass
class Split:
    ids: torch.Tensor
    starts: torch.Tensor
    states: dict = field(default_factory=dict)


def make_split(rng: np.random.Generator, n_blocks: int, lo: int = 10, hi: int = 30, vocab: int = V - 1) -> Split:
    """Blocks of random length in [lo, hi], BOS id 0 first, other ids in 1..vocab-1 (id V-1 is left
    out of every split by default, so a query can hold an id training never saw)."""
    lengths = rng.integers(lo, hi + 1, size=n_blocks)
    blocks = [np.concatenate([[0], rng.integers(1, vocab, size=n - 1)]) for n in lengths]
    starts = np.concatenate([[0], np.cumsum(lengths)])
    return Split(torch.from_numpy(np.concatenate(blocks)).long(), torch.from_numpy(starts).long())


def planted(split: Split, emb: torch.Tensor, weight: torch.Tensor, window: int, noise: float, seed: int) -> Split:
    """states = window features @ weight + noise: an exactly linear function of a short left context."""
    g = torch.Generator().manual_seed(seed)
    x = window_features(split, emb, window)
    split.states[LAYER] = x @ weight + noise * torch.randn(len(x), weight.shape[1], generator=g)
    return split


def non_bos(split: Split) -> np.ndarray:
    firsts = set(split.starts[:-1].tolist())
    return np.array([i for i in range(len(split.ids)) if i not in firsts])


def np_nmse_dim(pred: np.ndarray, target: np.ndarray) -> float:
    err = ((pred - target) ** 2).sum(0)
    var = ((target - target.mean(0)) ** 2).sum(0)
    return float(np.mean([e / v for e, v in zip(err, var) if v > 0]))


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def emb():
    return torch.randn(V, D_E, generator=torch.Generator().manual_seed(1))


def nmse_dim(pred: torch.Tensor, target: torch.Tensor) -> float:
    """The one nmse_dim (geoprobe.bridges.fit.state_losses) the bridges and the controls are scored with."""
    return state_losses(target.double(), (pred.double() - target.double()).square())["nmse_dim"]


def test_nmse_dim_matches_numpy_and_skips_constant_channels(rng):
    target = rng.normal(size=(40, 5))
    target[:, 2] = 3.0  # no variance: excluded, else it would be inf
    pred = target + rng.normal(scale=0.3, size=target.shape)
    got = nmse_dim(torch.from_numpy(pred).float(), torch.from_numpy(target).float())
    assert np.isfinite(got)
    assert got == pytest.approx(np_nmse_dim(pred, target), rel=1e-5)
    assert nmse_dim(torch.from_numpy(target), torch.from_numpy(target)) == pytest.approx(0.0, abs=1e-12)


def test_token_lookup_matches_numpy_with_unseen_id(rng):
    train = make_split(rng, 6)
    train.states[LAYER] = torch.randn(len(train.ids), D, generator=torch.Generator().manual_seed(2))
    query_ids = torch.tensor([0, 5, V - 1, 7, V - 1, 1])  # V-1 never occurs in train
    assert (train.ids != V - 1).all()
    got = token_lookup(train, LAYER, query_ids).numpy()

    by_id: dict[int, list] = {}
    for tok, row in zip(train.ids.tolist(), train.states[LAYER].numpy()):
        by_id.setdefault(tok, []).append(row)
    overall = train.states[LAYER].numpy().astype(np.float64).mean(0)
    want = np.stack([np.mean(by_id[t], axis=0) if t in by_id else overall for t in query_ids.tolist()])
    assert got.shape == (len(query_ids), D) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[2], overall, rtol=1e-5, atol=1e-6)
    # a split works as the query too
    query = make_split(rng, 2)
    assert token_lookup(train, LAYER, query).shape == (len(query.ids), D)


def test_mean_control_is_train_mean(rng):
    train = make_split(rng, 4)
    train.states[LAYER] = torch.randn(len(train.ids), D) + 5
    query = make_split(rng, 2)
    got = mean_control(train, LAYER, query)
    assert got.shape == (len(query.ids), D)
    np.testing.assert_allclose(got.numpy(), np.broadcast_to(train.states[LAYER].numpy().mean(0), got.shape), rtol=1e-5)


def test_window_features_match_loop(rng, emb):
    split = make_split(rng, 5, lo=2, hi=12)
    window = 3
    e = emb.numpy()
    starts = split.starts.tolist()
    want = []
    for b in range(len(starts) - 1):
        for i in range(starts[b], starts[b + 1]):
            want.append(np.concatenate([e[split.ids[i - k]] if i - k >= starts[b] else np.zeros(D_E)
                                        for k in range(window + 1)]))
    want = np.stack(want)
    got = window_features(split, emb, window)
    assert got.shape == (len(split.ids), (window + 1) * D_E) and got.dtype == torch.float32
    np.testing.assert_array_equal(got.numpy(), want.astype(np.float32))
    # a block's BOS row is its own embedding then zeros: nothing leaks from the previous block
    assert (got[starts[1], D_E:] == 0).all()
    rows = torch.tensor([starts[2], starts[2] + 1, len(split.ids) - 1, 0])
    np.testing.assert_array_equal(window_features(split, emb, window, rows).numpy(), want[rows.numpy()].astype(np.float32))


def sklearn_ridge(train: Split, emb, window: int, lam: float, rows=None) -> Ridge:
    rows = non_bos(train) if rows is None else rows
    x = window_features(train, emb, window, torch.from_numpy(rows)).double().numpy()
    y = train.states[LAYER].double().numpy()[rows]
    xc = x - x.mean(0)
    alpha = lam * np.trace(xc.T @ xc) / x.shape[1]
    return Ridge(alpha=alpha, fit_intercept=True).fit(x, y)


def noisy_problem(rng, emb, n_train: int = 12):
    """A planted map with heavy noise and few training blocks: the penalty matters."""
    weight = torch.randn(3 * D_E, D, generator=torch.Generator().manual_seed(3)) / np.sqrt(3 * D_E)
    train = planted(make_split(rng, n_train), emb, weight, 2, noise=0.8, seed=4)
    stop = planted(make_split(rng, 6), emb, weight, 2, noise=0.8, seed=5)
    query = planted(make_split(rng, 6), emb, weight, 2, noise=0.8, seed=6)
    return train, stop, query


def test_ridge_matches_sklearn_single_lambda(rng, emb):
    train, _, query = noisy_problem(rng, emb)
    window = 3
    for lam in (1e-2, 1.0):
        pred, info = ridge_control(train, None, query, layer=LAYER, embeddings=emb, window=window, lambdas=(lam,))
        model = sklearn_ridge(train, emb, window, lam)
        want = model.predict(window_features(query, emb, window).double().numpy())
        assert pred.shape == (len(query.ids), D) and pred.dtype == torch.float32
        assert np.abs(pred.numpy() - want).max() <= 1e-5 * np.abs(want).max()
        assert info["lambda"] == lam and info["window"] == window
        assert info["train_rows"] == len(non_bos(train)) and not info["subsampled"]


def test_ridge_lambda_selection_matches_sklearn(rng, emb):
    train, stop, query = noisy_problem(rng, emb)
    window, lambdas = 4, (1e-3, 1e-2, 1e-1, 1.0, 10.0)
    _, info = ridge_control(train, stop, query, layer=LAYER, embeddings=emb, window=window, lambdas=lambdas)
    rows = non_bos(stop)
    x_stop = window_features(stop, emb, window, torch.from_numpy(rows)).double().numpy()
    y_stop = stop.states[LAYER].double().numpy()[rows]
    want = {lam: np_nmse_dim(sklearn_ridge(train, emb, window, lam).predict(x_stop), y_stop) for lam in lambdas}
    got = info["stop_nmse_dim_by_lambda"]
    assert set(got) == set(lambdas)
    for lam in lambdas:
        assert got[lam] == pytest.approx(want[lam], rel=1e-5)
    assert max(want.values()) - min(want.values()) > 0.01  # the choice is not a tie
    assert info["lambda"] == min(want, key=want.get)


def test_ridge_recovers_planted_map_where_lookup_cannot(rng, emb):
    # the state depends on the current and the previous token equally
    weight = torch.randn(2 * D_E, D, generator=torch.Generator().manual_seed(7)) / np.sqrt(2 * D_E)
    train = planted(make_split(rng, 60), emb, weight, 1, noise=0.01, seed=8)
    stop = planted(make_split(rng, 10), emb, weight, 1, noise=0.01, seed=9)
    query = planted(make_split(rng, 10), emb, weight, 1, noise=0.01, seed=10)
    rows = torch.from_numpy(non_bos(query))
    target = query.states[LAYER][rows]
    pred, info = ridge_control(train, stop, query, layer=LAYER, embeddings=emb)
    assert nmse_dim(pred[rows], target) < 0.01
    lookup = token_lookup(train, LAYER, query)
    assert nmse_dim(lookup[rows], target) > 0.3
    mean = mean_control(train, LAYER, query)
    assert nmse_dim(mean[rows], target) > 0.9


def test_ridge_subsample_is_seeded(rng, emb):
    train, stop, query = noisy_problem(rng, emb, n_train=20)
    available = len(non_bos(train))
    max_rows = available // 3
    a, info_a = ridge_control(train, stop, query, layer=LAYER, embeddings=emb, max_rows=max_rows, seed=11)
    b, info_b = ridge_control(train, stop, query, layer=LAYER, embeddings=emb, max_rows=max_rows, seed=11)
    c, _ = ridge_control(train, stop, query, layer=LAYER, embeddings=emb, max_rows=max_rows, seed=12)
    assert info_a["train_rows"] == max_rows and info_a["subsampled"]
    assert info_a["train_rows_available"] == available
    assert torch.equal(a, b) and info_a == info_b
    assert not torch.allclose(c, a, atol=1e-4)  # another seed fits other rows


def test_lookup_ridge_is_the_lookup_plus_sklearns_ridge_on_its_residual(rng, emb):
    """An independent computation: numpy's per-token means, sklearn's Ridge fitted to what they
    leave (same features, same penalty), the two added at the query."""
    from geoprobe.bridges.controls import lookup_table

    train, _, query = noisy_problem(rng, emb)
    window, lam = 2, 0.1
    pred, info = ridge_control(train, None, query, layer=LAYER, embeddings=emb, window=window, lambdas=(lam,),
                               base=lookup_table(train, LAYER))
    ids, y = train.ids.numpy(), train.states[LAYER].double().numpy()
    table = {i: y[ids == i].mean(0) for i in np.unique(ids)}
    overall = y.mean(0)
    lookup = lambda split: np.stack([table.get(i, overall) for i in split.ids.numpy()])
    rows = non_bos(train)
    x = window_features(train, emb, window, torch.from_numpy(rows)).double().numpy()
    residual = y[rows] - lookup(train)[rows]
    xc = x - x.mean(0)
    model = Ridge(alpha=lam * np.trace(xc.T @ xc) / x.shape[1]).fit(x, residual)
    want = lookup(query) + model.predict(window_features(query, emb, window).double().numpy())
    assert np.abs(pred.numpy() - want).max() <= 1e-5 * np.abs(want).max()
    assert info["lambda"] == lam


def test_lookup_ridge_recovers_a_table_plus_context_that_neither_part_does(rng, emb):
    """States = an arbitrary per-token table (not linear in the embedding) + a linear map of the
    previous token's embedding: only the lookup plus the ridge on its residual recovers them."""
    from geoprobe.bridges.controls import lookup_table

    table = torch.randn(V, D, generator=torch.Generator().manual_seed(12))
    weight = torch.randn(D_E, D, generator=torch.Generator().manual_seed(13)) / np.sqrt(D_E)

    def make(n_blocks):
        split = make_split(rng, n_blocks)
        previous = window_features(split, emb, 1)[:, D_E:]
        split.states[LAYER] = table[split.ids] + previous @ weight
        return split

    train, stop, query = make(200), make(20), make(20)
    rows = torch.from_numpy(non_bos(query))
    target = query.states[LAYER][rows]
    both, _ = ridge_control(train, stop, query, layer=LAYER, embeddings=emb, window=1, base=lookup_table(train, LAYER))
    ridge, _ = ridge_control(train, stop, query, layer=LAYER, embeddings=emb, window=1)
    assert nmse_dim(both[rows], target) < 0.02
    assert nmse_dim(token_lookup(train, LAYER, query)[rows], target) > 0.1
    assert nmse_dim(ridge[rows], target) > 0.3
