"""The sweep's statistics and verdict: rho and its one-sided permutation p against an
exhaustive enumeration and scipy, Holm and the reliability on hand-made tables, the partial
Spearman correlation against its regression form, and the verdict on tables whose answer is known."""

import itertools

import numpy as np
import pytest
from scipy import stats

from geoprobe.metrics.correlation import holm, partial_spearman, reliability, spearman_with_uncertainty
from geoprobe.verdict import PRIMARY, sweep_verdict, tied_with, layer_table


def test_one_sided_permutation_p_is_the_exhaustive_count():
    x = np.array([0.3, -1.2, 2.0, 0.8, -0.4, 1.5])
    y = np.array([1.0, 2.5, 0.2, 0.9, 1.9, 0.1])
    result = spearman_with_uncertainty(x, y, alternative="less")
    rho = stats.spearmanr(x, y).statistic
    assert result["rho"] == pytest.approx(rho)
    every = [stats.spearmanr(x[list(p)], y).statistic for p in itertools.permutations(range(6))]
    assert result["p"] == pytest.approx(np.mean(np.array(every) <= rho + 1e-12))  # exact: 6! <= 9999
    greater = spearman_with_uncertainty(x, y, alternative="greater", interval=False)
    assert greater["p"] == pytest.approx(np.mean(np.array(every) >= rho - 1e-12))
    assert "ci" not in greater


def test_two_sided_spearman_against_scipy():
    x = np.arange(6.0)
    y = np.array([0.1, 0.5, 0.3, 0.9, 1.2, 1.1])
    result = spearman_with_uncertainty(x, y, seed=0)
    assert result["rho"] == pytest.approx(stats.spearmanr(x, y).statistic)
    # perfectly monotone, n = 5: the exact two-sided permutation p-value is 2/5! = 1/60
    perfect = spearman_with_uncertainty(np.arange(5.0), -np.arange(5.0) ** 2)
    assert perfect["rho"] == pytest.approx(-1.0) and perfect["p"] == pytest.approx(2 / 120)
    one = spearman_with_uncertainty(np.arange(5.0), -np.arange(5.0) ** 2, alternative="less")
    assert one["p"] == pytest.approx(1 / 120)
    rng = np.random.default_rng(0)
    a = rng.standard_normal(40)
    noisy = spearman_with_uncertainty(a, a + 0.5 * rng.standard_normal(40))
    low, high = noisy["ci"]
    assert low < noisy["rho"] < high and 0 < noisy["p"] < 0.01


def test_holm_on_a_hand_made_table():
    # sorted: a 0.01 x 4 = 0.04; c 0.03 x 3 = 0.09; b 0.04 x 2 = 0.08 -> 0.09 (monotone); d 0.5 x 1
    adjusted = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.5})
    assert adjusted == pytest.approx({"a": 0.04, "b": 0.09, "c": 0.09, "d": 0.5})
    assert holm({"x": 0.4, "y": 0.6}) == pytest.approx({"x": 0.8, "y": 0.8})  # capped, then monotone


def test_reliability_on_a_hand_made_table():
    values = [[1.0, 1.2], [2.0, 2.2], [3.0, 3.4]]
    # seed variances (ddof 1): 0.02, 0.02, 0.08 -> mean 0.04; layer means 1.1, 2.1, 3.2 -> variance 1.1033...
    means = np.array([1.1, 2.1, 3.2])
    expected = 1 - 0.04 / means.var(ddof=1)
    assert reliability(values) == pytest.approx(expected)
    assert reliability([[1.0], [2.0]]) is None  # one seed: not measured
    assert reliability([[1.0, 3.0], [3.0, 1.0]]) == float("-inf")  # layers identical, seeds differ
    noise = np.random.default_rng(0).standard_normal((8, 3))
    assert reliability(noise) < 0.5  # pure seed noise cannot separate the layers


def test_partial_spearman_is_the_correlation_of_rank_residuals():
    rng = np.random.default_rng(1)
    z = rng.standard_normal(30)
    x = z + rng.standard_normal(30)
    y = -z + rng.standard_normal(30)
    rx, ry, rz = (stats.rankdata(v) for v in (x, y, z))

    def residual(a):
        slope, intercept = np.polyfit(rz, a, 1)
        return a - (slope * rz + intercept)
    expected = stats.pearsonr(residual(rx), residual(ry)).statistic
    assert partial_spearman(x, y, z) == pytest.approx(expected)


def rows_for(losses_by_layer: dict, seeds=(0, 1, 2)):
    """Sweep rows: losses_by_layer {layer: [primary value per seed]}; the other losses follow it."""
    rows = []
    for layer, values in losses_by_layer.items():
        for seed, v in zip(seeds, values):
            rows.append({"layer": layer, "seed": seed, **{k: v for k in ("nmse_dim", "nmse", "delta_ce", "nmse_noisy",
                                                                         "objective")}})
    return rows


def test_the_verdict_supports_a_score_that_predicts_the_loss_and_leaves_the_source_out():
    # layer 0 (the source) is exact; layers 1-6: the loss falls as the score rises, seeds agree
    table = {0: [0.0, 0.0, 0.0], **{l: [1 - 0.1 * l + e for e in (0.0, 0.01, -0.01)] for l in range(1, 7)}}
    scores = {"score": {l: float(l) for l in range(1, 7)}}
    v = sweep_verdict(rows_for(table), scores, {l: 0.0 for l in range(7)})
    assert v["compared_layers"] == [1, 2, 3, 4, 5, 6] and v["source_layers"] == [0]
    primary = v["tests"][PRIMARY]
    assert primary["rho"] == pytest.approx(-1.0) and primary["p"] == pytest.approx(1 / 720) and primary["supports"]
    assert v["reliability"][PRIMARY] > 0.99
    assert v["oracle_layer"] == 6 and v["oracle_tied"] == [] and v["chosen_layer"] == 6
    assert v["statement"][0].startswith("Primary test") and "supports the claim" in v["statement"][0]
    # depth explains everything here: the score is depth, so nothing is left beyond it
    assert v["controls"][PRIMARY]["depth"]["rho"] == pytest.approx(-1.0)
    assert v["outcome"].startswith("supported, but") and "beyond depth" in v["outcome"]
    assert v["controls"][PRIMARY]["partial_given_depth"]["rho"] is None  # the score is depth: undefined
    assert any("undefined" in line for line in v["statement"])


def test_the_verdict_does_not_rank_layers_within_the_seed_noise():
    rng = np.random.default_rng(0)
    table = {l: list(0.5 + 0.2 * rng.standard_normal(3)) for l in range(1, 7)}  # pure noise
    scores = {"score": {l: float(l) for l in range(1, 7)}, "score_normalize_none": {l: float(-l) for l in range(1, 7)}}
    v = sweep_verdict(rows_for(table), scores, {l: 0.1 * l for l in range(1, 7)})
    assert v["reliability"][PRIMARY] < 0.5
    assert v["oracle_tied"]  # some layer cannot be told apart from the easiest
    assert "cannot be told apart" in " ".join(v["statement"])
    assert "channel_share" in v["controls"][PRIMARY] and "score_normalize_none" in v["controls"][PRIMARY]
    assert set(v["tests"]) == {"nmse_dim", "nmse", "delta_ce", "nmse_noisy", "objective"}
    assert all("p_holm" in v["tests"][k] for k in ("nmse", "delta_ce", "nmse_noisy", "objective"))


def test_tied_layers_and_the_layer_table():
    rows = rows_for({1: [1.0, 1.1, 0.9], 2: [1.05, 1.15, 0.95], 3: [3.0, 3.1, 2.9]})
    table = layer_table(rows)
    assert table[0]["nmse_dim"] == pytest.approx(1.0) and table[0]["nmse_dim_sd"] == pytest.approx(0.1)
    # pooled seed sd 0.1 over 3 layers x 2 df: half-width t(0.975, 6) x sqrt(2 x 0.01 / 3) = 0.20
    assert tied_with(table, "nmse_dim", 1) == [2]
    assert tied_with(table, "nmse_dim", 3) == []
    near = layer_table(rows_for({1: [1.0, 1.1, 0.9], 2: [1.25, 1.35, 1.15]}))
    half_width = stats.t.ppf(0.975, 4) * np.sqrt(2 * 0.01 / 3)
    assert (tied_with(near, "nmse_dim", 1) == [2]) == (0.25 <= half_width)
    single = layer_table(rows_for({1: [1.0], 2: [5.0]}, seeds=(0,)))
    assert tied_with(single, "nmse_dim", 1) == [2]  # one seed: nothing can be told apart
    few = sweep_verdict(rows_for({0: [0, 0, 0], 1: [1, 1, 1], 2: [2, 2, 2]}), {"score": {1: 0.0, 2: 1.0}}, {})
    assert "tests" not in few and "no test" in few["statement"][0]


def test_freedman_lane_partial_test():
    from geoprobe.metrics.correlation import partial_spearman_test

    rng = np.random.default_rng(2)
    z = np.arange(12.0)
    y = z + 2.0 * rng.standard_normal(12)
    tracking = z + 2.0 * rng.standard_normal(12)  # a score that only tracks depth (noise independent of y)
    result = partial_spearman_test(-tracking, y, z, resamples=2000)
    assert result["rho"] == pytest.approx(partial_spearman(-tracking, y, z))
    assert result["p"] > 0.05  # no association beyond depth: not significant
    naive = spearman_with_uncertainty(-tracking, y, alternative="less", interval=False)
    assert naive["p"] < 0.01  # whereas the plain test passes through depth
    extra = rng.standard_normal(12)
    y2 = z + 2 * extra
    strong = partial_spearman_test(-extra, y2, z, resamples=2000)
    assert strong["rho"] < -0.5 and strong["p"] < 0.05


def test_a_score_that_predicts_beyond_depth_is_robustly_supported():
    rng = np.random.default_rng(3)
    layers = list(range(1, 13))
    extra = rng.standard_normal(12)
    score = {l: float(e) for l, e in zip(layers, extra)}  # unrelated to depth
    table = {l: [1 + 0.05 * l - 0.3 * e + 0.01 * d for d in (-1, 0, 1)] for l, e in zip(layers, extra)}
    v = sweep_verdict(rows_for(table), {"score": score}, {})
    assert v["tests"][PRIMARY]["supports"] and v["outcome"] == "robustly supported", v["outcome"]
    one = sweep_verdict(rows_for({l: vals[:1] for l, vals in table.items()}, seeds=(0,)), {"score": score}, {})
    assert "provisional" in one["outcome"] and one["reliability"][PRIMARY] is None
