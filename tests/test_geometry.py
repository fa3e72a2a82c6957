"""Geometry proxies: closed forms, an independent slow oracle, bootstrap coverage, ranking."""

import numpy as np
import pytest
import torch
from sklearn.neighbors import NearestNeighbors

from geoprobe.errors import BadInput
from geoprobe.geometry import GeometrySettings, bootstrap_counts, layer_geometry
from geoprobe.proxies import distinct_rows, knn, weighted_median
from geoprobe.ranking import rank_layers, selection_score, zscore
from bench.naive_geometry import gaussian, slow_reference


def docs_of(n, per_doc=20):
    return torch.arange(n) // per_doc


def run(x, bootstrap=0, per_doc=20, **kw):
    settings = GeometrySettings(bootstrap=bootstrap, **{"anchors": 256, "pairs": 2000, "k": 16, **kw})
    docs = docs_of(len(x), per_doc)
    counts = torch.from_numpy(bootstrap_counts(int(docs.max()) + 1, bootstrap, settings.seed)) if bootstrap else None
    return layer_geometry(x, docs, settings, counts, rng_key=7)


def test_effective_rank_closed_form_on_a_diagonal_gaussian():
    lam = np.array([6.0, 2.0, 1.5, 1.0, 1.0, 0.5, 0.25, 0.1])
    n = 20000
    result = run(gaussian(n, lam))
    truth = lam.sum() / lam.max()
    # lambda_max's sampling sd is about lam_max * sqrt(2/n) (1%); allow 4 sd
    assert result["none"]["erank"]["value"] == pytest.approx(truth, rel=4 * np.sqrt(2 / n))
    assert result["participation_ratio"] == pytest.approx(lam.sum() ** 2 / (lam ** 2).sum(), rel=0.05)
    p = lam / lam.sum()
    assert result["entropy_rank"] == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=0.02)


def test_monotonicity_closed_form_on_an_isotropic_gaussian():
    sigma2, alpha, d = 2.5, 1e-3, 8
    result = run(gaussian(20000, np.full(d, sigma2)), alpha=alpha)
    ridge = alpha * sigma2  # lambda = alpha tr(Sigma)/d
    assert result["none"]["mono"]["value"] == pytest.approx(1 / (sigma2 + ridge), rel=0.03)
    assert result["trace"]["mono"]["value"] == pytest.approx(1 / (1 + alpha), rel=0.03)


def test_trace_normalisation_makes_a_scaled_copy_identical():
    x = gaussian(3000, np.linspace(4, 0.2, 12), seed=2)
    a, b = run(x), run(37.0 * x)
    for proxy in ("curv", "mono", "erank"):
        assert b["trace"][proxy]["value"] == pytest.approx(a["trace"][proxy]["value"], rel=1e-9)
    assert b["none"]["curv"]["value"] == pytest.approx(a["none"]["curv"]["value"] / 37.0 ** 2, rel=1e-9)
    assert b["none"]["curv"]["value"] != pytest.approx(a["none"]["curv"]["value"], rel=0.5)


def test_fast_path_agrees_with_the_slow_oracle():
    x = gaussian(1500, np.linspace(3, 0.05, 24), seed=4)
    # half the states are exact duplicates of others, as repeated tokens are at layer 0
    x[700:1400] = x[:700]
    settings = GeometrySettings(k=10, anchors=151, pairs=800, bootstrap=0)
    fast = layer_geometry(x, docs_of(1500), settings, None, rng_key=3)
    slow = slow_reference(x.numpy(), settings, 3)
    for proxy in ("curv", "mono", "erank"):
        assert fast["none"][proxy]["value"] == pytest.approx(slow[proxy], rel=1e-6), proxy
    assert fast["duplicate_fraction"] == pytest.approx(700 / 1500)


def test_knn_matches_sklearn_and_excludes_self():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((400, 5))
    queries = ref[:50]
    ours = knn(torch.from_numpy(queries), torch.from_numpy(ref), 6, exclude=torch.arange(50), chunk=7)
    _, theirs = NearestNeighbors(n_neighbors=7, algorithm="brute").fit(ref).kneighbors(queries)
    assert np.array_equal(ours.numpy(), theirs[:, 1:])


def test_distinct_rows_matches_torch_unique():
    rng = np.random.default_rng(3)
    base = torch.from_numpy(rng.standard_normal((50, 7)))
    x = base[torch.from_numpy(rng.integers(0, 50, 400))]
    distinct, inverse = distinct_rows(x)
    assert len(distinct) == len(torch.unique(x, dim=0)) and torch.equal(distinct[inverse], x)
    all_distinct, identity = distinct_rows(base)
    assert all_distinct is base and torch.equal(identity, torch.arange(50))


def test_duplicates_keep_curvature_finite_and_massive_states_are_counted():
    base = gaussian(1000, np.linspace(2, 0.5, 6), seed=5)
    x = torch.cat([base, base[:500], base[:500]])  # 50% duplicates
    x[:3] *= 1000.0  # three massive activations (their earlier copies stay ordinary)
    kept = run(x, drop_massive=False)
    dropped = run(x)
    assert kept["massive"] == dropped["massive"] == 3
    assert dropped["n_used"] == len(x) - 3 and kept["n_used"] == len(x)
    # 1,997 states used, 1,000 of them distinct
    assert dropped["duplicate_fraction"] == pytest.approx(1 - 1000 / 1997, rel=1e-9)
    assert np.isfinite(dropped["none"]["curv"]["value"]) and dropped["none"]["curv"]["value"] > 0
    # massive states dominate the covariance when kept
    assert kept["none"]["erank"]["value"] < 0.5 * dropped["none"]["erank"]["value"]


def test_weighted_median_against_numpy_repeat():
    rng = np.random.default_rng(1)
    values = rng.standard_normal(31)
    weights = rng.integers(0, 4, size=(5, 31)).astype(float)
    ours = weighted_median(torch.from_numpy(values), torch.from_numpy(weights)).numpy()
    for b in range(5):
        expanded = np.sort(np.repeat(values, weights[b].astype(int)))
        assert ours[b] == expanded[(len(expanded) - 1) // 2]


def test_bootstrap_interval_covers_the_truth_in_at_least_90_of_100_repetitions():
    lam = np.array([4.0, 2.0, 1.0, 1.0, 0.5, 0.5])
    truth = lam.sum() / lam.max()
    covered = 0
    for seed in range(100):
        x = gaussian(2000, lam, seed=seed + 100)
        result = run(x, bootstrap=200, per_doc=20, anchors=64, pairs=200, k=8, seed=seed)
        lo, hi = result["none"]["erank"]["ci"]
        covered += lo <= truth <= hi
    assert covered >= 90, covered


def test_bad_settings_and_degenerate_layers():
    x = gaussian(300, np.ones(4))
    for kw, fragment in [({"k": 1}, "--k must be"), ({"anchors": 0}, "--anchors"), ({"alpha": 0.0}, "--alpha"),
                         ({"alpha": -1.0}, "--alpha"), ({"normalize": "max"}, "--normalize")]:
        with pytest.raises(BadInput, match=fragment):
            GeometrySettings(**kw).validate()
    with pytest.raises(BadInput, match="fewer than --anchors 512"):
        run(x, anchors=512)
    with pytest.raises(BadInput, match="fewer than k\\+1"):
        run(torch.cat([x[:10]] * 30), k=16, anchors=20)
    with pytest.raises(BadInput, match="all states are identical"):
        run(torch.ones(300, 4), anchors=20)


def test_score_and_rank_stability():
    # layer 1 is best on every proxy: highest curvature and monotonicity, lowest effective rank
    proxies = {"curv": np.array([1.0, 5.0, 2.0]), "mono": np.array([0.1, 0.9, 0.5]), "erank": np.array([30., 5., 20.])}
    score = selection_score(proxies)
    assert score.argmax() == 1
    assert np.allclose(zscore(np.array([[1.0, 2.0, 3.0]])), [[-1.2247449, 0, 1.2247449]])
    assert np.allclose(score, zscore(proxies["curv"]) + zscore(proxies["mono"]) - zscore(proxies["erank"]))
    only_erank = selection_score(proxies, weights=(0, 0, 1))
    assert only_erank.argmax() == 1 and np.allclose(only_erank, -zscore(proxies["erank"]))
    assert np.allclose(selection_score(proxies, log=True),
                       sum(s * zscore(np.log(proxies[p])) for p, s in zip(("curv", "mono", "erank"), (1, 1, -1))))

    def layer(i, curv, mono, erank):
        rng = np.random.default_rng(i)
        reps = {"curv": curv * (1 + 0.01 * rng.standard_normal(50)), "mono": mono * np.ones(50),
                "erank": erank * np.ones(50), "scale": np.ones(50)}
        ci = lambda v: {"value": v, "ci": [v, v]}
        return {"layer": i, "trace": {"curv": ci(curv), "mono": ci(mono), "erank": ci(erank)},
                "replicates": {k: v.tolist() for k, v in reps.items()}, "participation_ratio": 1.0,
                "entropy_rank": 1.0, "duplicate_fraction": 0.0, "massive": 0}

    geometry = {"settings": {"normalize": "trace"},
                "layers": [layer(0, 1.0, 0.1, 30), layer(1, 5.0, 0.9, 5), layer(2, 2.0, 0.5, 20)]}
    ranking = rank_layers(geometry)
    assert ranking["chosen_layer"] == 1
    assert [r["rank"] for r in ranking["rows"]] == [3, 1, 2]
    assert sum(r["p_first"] for r in ranking["rows"]) == pytest.approx(1.0)
    assert ranking["rows"][1]["p_first"] == 1.0


def test_massive_channels_are_listed_and_excluding_them_equals_computing_without_them():
    lam = np.ones(8)
    x = gaussian(3000, lam, seed=2, rotate=False)
    x[:, 3] = 3.0 + 30.0 * (x[:, 3] - 3.0)  # one channel with 900x the others' variance, in every token
    kept = run(x, bootstrap=20)
    assert kept["massive_channels"] == [3] and kept["channels_used"] == 8
    assert kept["massive_channel_share"] == pytest.approx(900 / 907, abs=0.02)
    assert kept["none"]["erank"]["value"] < 1.05  # the channel is the whole spectrum
    dropped = run(x, bootstrap=20, drop_massive_channels=True)
    oracle = run(x[:, [0, 1, 2, 4, 5, 6, 7]], bootstrap=20)  # the same states without the channel
    assert dropped["channels_used"] == 7 and oracle["massive_channels"] == []
    for norm in ("none", "trace"):
        for proxy in ("curv", "mono", "erank"):
            assert dropped[norm][proxy]["value"] == pytest.approx(oracle[norm][proxy]["value"], rel=1e-9)
            assert dropped[norm][proxy]["ci"] == pytest.approx(oracle[norm][proxy]["ci"], rel=1e-9)
    assert dropped["none"]["erank"]["value"] > 4  # isotropic once the channel is gone
    # the rule is against the median channel: a spread-out spectrum has no massive channel
    assert run(gaussian(3000, np.linspace(1, 10, 8), seed=2))["massive_channels"] == []


def test_fewer_states_than_dimensions_uses_the_gram_matrix_with_the_same_numbers(monkeypatch):
    import geoprobe.proxies as proxies

    lam = np.geomspace(10.0, 0.01, 96)
    x = gaussian(80, lam, seed=4)  # N = 80 < d = 96
    settings = dict(bootstrap=20, per_doc=4, anchors=60, k=8, pairs=500)
    gram = run(x, **settings)
    values, vectors = proxies.covariance_spectrum(x - x.mean(0), len(x))
    assert values.shape == (79,) and torch.allclose(vectors.T @ vectors, torch.eye(79, dtype=x.dtype), atol=1e-8)
    monkeypatch.setattr(proxies, "GRAM_BELOW", 0.0)  # force the d x d eigendecomposition
    full = run(x, **settings)
    for norm in ("none", "trace"):
        for proxy in ("curv", "mono", "erank"):
            assert gram[norm][proxy]["value"] == pytest.approx(full[norm][proxy]["value"], rel=1e-8), (norm, proxy)
            assert gram[norm][proxy]["ci"] == pytest.approx(full[norm][proxy]["ci"], rel=1e-6), (norm, proxy)
    for key in ("participation_ratio", "entropy_rank", "lambda_max", "scale"):
        assert gram[key] == pytest.approx(full[key], rel=1e-8), key


def test_each_reseed_is_the_estimator_run_on_another_draw_of_anchors_and_pairs(monkeypatch):
    import geoprobe.geometry as geometry

    x = gaussian(600, np.linspace(1.0, 4.0, 8), seed=3)
    reseeded = run(x, reseeds=3)["reseeds"]
    assert len(reseeded["curv"]) == len(reseeded["mono"]) == 3
    assert len(set(reseeded["curv"])) == 3  # three different draws, three different medians
    real_draw = geometry.draw_samples
    for r in (1, 3):  # oracle: the plain estimator, its one draw replaced by draw r
        monkeypatch.setattr(geometry, "draw_samples", lambda n, s, key, reseed=0, r=r: real_draw(n, s, key, r))
        single = run(x, reseeds=0)
        assert single["none"]["curv"]["value"] == pytest.approx(reseeded["curv"][r - 1], rel=1e-12)
        assert single["none"]["mono"]["value"] == pytest.approx(reseeded["mono"][r - 1], rel=1e-12)
        assert "reseeds" not in single


def test_p_first_over_reseeds_counts_the_draws_each_layer_wins():
    def layer(i, curv, reseeds):
        v = lambda value: {"value": value, "ci": [value, value]}
        return {"layer": i, "scale": 2.0, "none": {"curv": v(curv), "mono": v(1.0), "erank": v(5.0)},
                "reseeds": {"curv": reseeds, "mono": [1.0] * len(reseeds)}, "participation_ratio": 1.0,
                "entropy_rank": 1.0, "duplicate_fraction": 0.0, "massive": 0}

    # only the curvature counts; layer 2 wins the point estimate and 6 of its 8 redraws, layer 1 the other 2
    geometry = {"settings": {"normalize": "none"}, "layers": [
        layer(0, 1.0, [1.0] * 8), layer(1, 2.0, [2.0] * 8), layer(2, 3.0, [3, 3, 0, 0, 3, 3, 3, 3])]}
    ranking = rank_layers(geometry, weights=(1, 0, 0))
    assert [r["p_first_reseed"] for r in ranking["rows"]] == pytest.approx([0, 2 / 9, 7 / 9])
    assert ranking["reseeds"] == 9 and ranking["chosen_p_first_reseed"] == pytest.approx(7 / 9)
    # under trace normalisation the redraws are scaled like the point estimate: with layer 2's
    # scale halved, its 3s become 1.5 < 2 and layer 1 wins every draw (unscaled redraws would not)
    geometry["layers"][2]["scale"] = 0.5
    for l in geometry["layers"]:
        l["trace"] = {p: {"value": l["none"][p]["value"] * (l["scale"] if p != "erank" else 1.0), "ci": [0, 0]}
                      for p in ("curv", "mono", "erank")}
    geometry["settings"]["normalize"] = "trace"
    ranking = rank_layers(geometry, weights=(1, 0, 0))
    assert ranking["chosen_layer"] == 1 and ranking["chosen_p_first_reseed"] == 1.0
