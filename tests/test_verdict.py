"""The sweep's verdict (geoprobe/verdict.py) on tables whose answer is known, and its layer table
and ties. The statistics it is built from are tested in test_metrics.py."""

import numpy as np
import pytest
from scipy import stats

from geoprobe.verdict import PRIMARY, sweep_verdict, tied_with, layer_table


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
    # three layers: a permutation p of at least 1/3! = 0.17 can never be significant, so no test either
    three = sweep_verdict(rows_for({1: [0, 0, 0], 2: [1, 1, 1], 3: [2, 2, 2]}), {"score": {1: 0.0, 2: 1.0, 3: 2.0}}, {})
    assert "tests" not in three and "cannot go below 1/3! = 0.17" in three["statement"][0]


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
