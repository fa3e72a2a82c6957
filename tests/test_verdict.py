"""The sweep's verdict (geoprobe/verdict.py) on tables whose answer is known: the test, the
bridges' convergence, the fixed Holm family, the registered score, the seed-mean reliability,
and its layer table and ties. The statistics it is built from are tested in test_metrics.py."""

import itertools
import json

import numpy as np
import pytest
from scipy import stats

from geoprobe.metrics.correlation import reliability
from geoprobe.verdict import (PRIMARY, REGISTERED_LOG, REGISTERED_WEIGHTS, SECONDARY, layer_table, sweep_verdict,
                              tied_with)


def rows_for(losses_by_layer: dict, seeds=(0, 1, 2), stop="plateau", lookup=10.0):
    """Sweep rows: losses_by_layer {layer: [primary value per seed]}; the other losses follow it.
    Every bridge stopped by its plateau and beats a token lookup of nmse_dim `lookup` unless told."""
    rows = []
    for layer, values in losses_by_layer.items():
        for seed, v in zip(seeds, values):
            rows.append({"layer": layer, "seed": seed, "stop": stop, "control_lookup_nmse_dim": lookup,
                         **{k: v for k in ("nmse_dim", "nmse", "delta_ce", "nmse_noisy", "objective")}})
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
    assert v["statement"][1].startswith("Convergence: 18 of 18 tested bridges")  # layer 0's 3 are not tested
    # depth explains everything here: the score is depth, so nothing is left beyond it
    assert v["controls"][PRIMARY]["depth"]["rho"] == pytest.approx(-1.0)
    assert v["outcome"].startswith("supported, but") and "beyond depth" in v["outcome"]
    assert v["controls"][PRIMARY]["partial_given_depth"]["rho"] is None  # the score is depth: undefined
    assert any("undefined" in line for line in v["statement"])


def test_the_verdict_does_not_rank_layers_within_the_seed_noise():
    # pure noise; ICC(1,k) < 0.5 is F(5, 12) < 2, true of 85 % of such draws (seed 0's F is 2.4: not this one)
    rng = np.random.default_rng(1)
    table = {l: list(0.5 + 0.2 * rng.standard_normal(3)) for l in range(1, 7)}
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
    assert few["convergence"]["tested"] == 6 and few["convergence"]["converged"]  # reported even without a test
    assert few["statement"][1].startswith("Convergence: 6 of 6")
    # the layers the generation samples through are known without a test (the source layer 0 is not one)
    assert (few["chosen_layer"], few["oracle_layer"], few["worst_layer"]) == (2, 1, 2)
    # three layers: a permutation p of at least 1/3! = 0.17 can never be significant, so no test either
    three = sweep_verdict(rows_for({1: [0, 0, 0], 2: [1, 1, 1], 3: [2, 2, 2]}), {"score": {1: 0.0, 2: 1.0, 3: 2.0}}, {})
    assert "tests" not in three and "cannot go below 1/3! = 0.17" in three["statement"][0]


def test_a_ceiling_that_did_not_stop_by_its_plateau_says_so_in_the_page_table():
    from geoprobe.workflows.sweep_page import layer_rows

    rows = rows_for({1: [0.2, 0.21, 0.19], 2: [0.3, 0.31, 0.29], 3: [0.4, 0.41, 0.39], 4: [0.5, 0.5, 0.5]})
    for row in rows:  # the sweep copies each layer's ceiling onto every seed's row
        row.update(ceiling_nmse_dim=0.1 * row["layer"], ceiling_stop="cap" if row["layer"] == 2 else "plateau")
    verdict = sweep_verdict(rows, {"score": {1: 3.0, 2: 2.0, 3: 1.0, 4: 0.0}}, {})
    assert [r["ceiling_stop"] for r in verdict["layers"]] == ["plateau", "cap", "plateau", "plateau"]
    verdict["scores"] = {"score": {str(layer): 4.0 - layer for layer in range(1, 5)}}  # as summarise records them
    page = layer_rows(verdict)
    assert [r["ceiling"] for r in page] == ["0.1", "0.2 (cap)", "0.3", "0.4"]


def test_the_ceiling_control_says_whether_the_bridges_order_the_layers_as_the_regression_does():
    from scipy.stats import spearmanr

    from geoprobe.workflows.sweep_page import control_rows

    means = {1: 0.2, 2: 0.3, 3: 0.25, 4: 0.5, 5: 0.45}
    rows = rows_for({l: [m, m + 0.01, m - 0.01] for l, m in means.items()})
    ceilings = {1: 0.1, 2: 0.12, 3: 0.2, 4: 0.3, 5: 0.25}  # not quite the bridges' order
    for row in rows:
        row["ceiling_nmse_dim"] = ceilings[row["layer"]]
    v = sweep_verdict(rows, {"score": {l: -float(l) for l in means}}, {})
    c = v["controls"][PRIMARY]["ceiling"]
    want = spearmanr(list(ceilings.values()), list(means.values()))
    assert c["rho"] == pytest.approx(want.statistic)  # 0.9: two pairs of layers swap
    controls = next(line for line in v["statement"] if line.startswith("Controls:"))
    assert f"rho(ceiling's nmse_dim, nmse_dim) = {want.statistic:.2f}" in controls
    assert control_rows(v)[0]["ρ(ceiling's nmse_dim)"] == pytest.approx(want.statistic)
    # without a ceiling at every compared layer there is nothing to rank
    rows[0].pop("ceiling_nmse_dim")
    rows[1].pop("ceiling_nmse_dim")
    rows[2].pop("ceiling_nmse_dim")
    assert "ceiling" not in sweep_verdict(rows, {"score": {l: -float(l) for l in means}}, {})["controls"][PRIMARY]


def test_the_ceilings_gap_to_the_bridges_is_stated_and_a_regression_above_them_is_no_ceiling():
    from geoprobe.report.verdict_text import ceiling_gap_line

    means = {1: 0.2, 2: 0.3, 3: 0.25, 4: 0.5, 5: 0.4}
    rows = rows_for({l: [m, m + 0.01, m - 0.01] for l, m in means.items()})
    ceilings = {1: 0.18, 2: 0.24, 3: 0.2, 4: 0.45, 5: 0.3}  # 10, 20, 20, 10 and 25 % below the seed means
    for row in rows:
        row["ceiling_nmse_dim"] = ceilings[row["layer"]]
    v = sweep_verdict(rows, {"score": {l: -float(l) for l in means}}, {})
    line = ceiling_gap_line(v)
    assert "is 10–25 % below the bridges' seed-mean nmse_dim at every tested layer" in line
    assert line.count("plain clean regression") == 1
    assert line in v["statement"]
    for row in rows:
        if row["layer"] in (2, 5):
            row["ceiling_nmse_dim"] = 0.6  # the regression trained worse than the bridges there
    v = sweep_verdict(rows, {"score": {l: -float(l) for l in means}}, {})
    assert "is above the bridges' seed-mean nmse_dim at layers 2, 5" in ceiling_gap_line(v)
    for row in rows[:3]:  # layer 1 without its ceiling: nothing to say
        row.pop("ceiling_nmse_dim")
    assert ceiling_gap_line(sweep_verdict(rows, {"score": {l: -float(l) for l in means}}, {})) is None


def test_a_passing_secondary_is_shown_beside_its_own_controls_and_cannot_rescue_the_primary():
    from geoprobe.metrics.correlation import partial_spearman_test
    from geoprobe.verdict import current_statement

    layers = list(range(1, 9))
    rng = np.random.default_rng(0)
    score = {l: float(s) for l, s in zip(layers, rng.permutation(8))}
    rows = rows_for({l: [0.1 + 0.01 * rng.random() + 0.001 * e for e in (0, 1, 2)] for l in layers})  # primary: noise
    for row in rows:  # nmse_noisy falls exactly as the score rises
        row["nmse_noisy"] = 1 - 0.05 * score[row["layer"]] + 0.0001 * row["seed"]
    share = {l: 0.1 * s for l, s in score.items()}  # the massive-channel share follows the score exactly
    v = sweep_verdict(rows, {"score": score}, share)
    assert not v["tests"][PRIMARY]["supports"] and v["tests"]["nmse_noisy"]["supports"]
    line = next(l for l in v["statement"] if l.startswith("The secondary nmse_noisy passes"))
    assert "which cannot rescue the primary (method.md)" in line
    assert "massive-channel share rho -1.00" in line  # ranks opposite to the share, as to the score
    y = [1 - 0.05 * score[l] + 0.0001 for l in layers]
    want = partial_spearman_test(np.array([score[l] for l in layers]), y, np.array(layers, float), seed=0)
    assert f"partial rho(score, nmse_noisy | depth) {want['rho']:.2f}" in line
    assert "score massive channels excluded: rho" not in line  # no such score given: not made up
    assert [l for l in v["statement"] if l.startswith("The secondary")] == [line]  # only the passing one
    # a verdict stored before these lines existed gets them when read back
    stored = json.loads(json.dumps({**v, "statement": v["statement"][:2]}))
    assert current_statement(stored) == v["statement"]
    older = {k: val for k, val in stored.items() if k != "convergence"}  # before 2026-12-01: its own lines
    assert current_statement(older) == v["statement"][:2]
    few = sweep_verdict(rows_for({1: [0.2, 0.21], 2: [0.3, 0.31], 3: [0.4, 0.41]}, seeds=(0, 1)),
                        {"score": {1: 1.0, 2: 2.0, 3: 3.0}}, {})
    assert "tests" not in few and current_statement(json.loads(json.dumps(few))) == few["statement"]
    # unconverged bridges: a passing secondary is no evidence either
    for row in rows:
        row["stop"] = "cap"
    v = sweep_verdict(rows, {"score": score}, share)
    line = next(l for l in v["statement"] if l.startswith("The secondary nmse_noisy passes"))
    assert "on unconverged losses, which is no evidence and cannot rescue the primary" in line


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


# --- convergence: the test speaks only about bridges trained to their plateau that beat a token lookup

def converging_rows(stops=None, primary=None, lookup=5.0):
    """Layers 1-5 x seeds 0, 1 (10 tested bridges) whose loss falls with the score, plus the source
    layer 0 with 2 seeds that stopped at the cap and lose to its lookup (not tested: never counted).
    `stops`/`primary`: {(layer, seed): value} overrides."""
    rows = rows_for({0: [9.0, 9.0], **{l: [1 - 0.1 * l + e for e in (0.0, 0.01)] for l in range(1, 6)}},
                    seeds=(0, 1), lookup=lookup)
    for r in rows:
        if r["layer"] == 0:
            r.update(stop="cap", control_lookup_nmse_dim=1.0)
        r["stop"] = (stops or {}).get((r["layer"], r["seed"]), r["stop"])
        r[PRIMARY] = (primary or {}).get((r["layer"], r["seed"]), r[PRIMARY])
    return rows


SCORE = {"score": {l: float(l) for l in range(1, 6)}}


def test_converged_bridges_leave_the_outcome_to_the_test():
    v = sweep_verdict(converging_rows(), SCORE, {})
    c = v["convergence"]
    assert c == {"plateau": 10, "tested": 10, "share": 1.0, "needed": 0.8, "worse_than_lookup": [],
                 "converged": True, "reasons": [], "learned": "nmse_dim"}
    assert not v["outcome"].startswith("inconclusive") and v["outcome"].startswith("supported")
    assert v["statement"][0].startswith("Primary test")


def test_capped_bridges_make_the_verdict_inconclusive_whatever_the_test_says():
    capped = {(1, 0): "cap", (2, 1): "cap", (4, 0): "budget"}  # 7 of 10 stopped by their plateau
    v = sweep_verdict(converging_rows(stops=capped), SCORE, {})
    assert v["tests"][PRIMARY]["supports"]  # the test still runs and is reported, and would pass
    assert v["convergence"]["plateau"] == 7 and v["convergence"]["share"] == pytest.approx(0.7)
    assert not v["convergence"]["converged"]
    assert v["outcome"] == ("inconclusive: the bridges did not converge (7 of 10 tested bridges stopped by their "
                            "plateau, 80 % needed)")
    assert v["statement"][0].startswith("Inconclusive: the bridges did not converge — 7 of 10 tested bridges")
    assert v["statement"][0].endswith("the test below says nothing about the claim.")
    assert v["statement"][1].startswith("Primary test") and "inconclusive" in v["statement"][1]
    # the test that would pass is worded as what it would say, and nothing reads it further
    assert "this run passes the test on unconverged losses, which is no evidence for the claim" in v["statement"][1]
    assert "this run supports" not in " ".join(v["statement"])
    assert not any(line.startswith("Beyond the token lookup") for line in v["statement"])
    from geoprobe.workflows.sweep_page import test_rows
    assert {row["supports"] for row in test_rows(v)} == {"not judged (unconverged)"}
    assert {row["supports"] for row in test_rows(sweep_verdict(converging_rows(), SCORE, {}))} <= {"yes", "no"}


def test_a_failed_test_gives_its_reason_whether_or_not_the_bridges_converged():
    reversed_score = {"score": {l: -float(l) for l in range(1, 6)}}  # ranks the layers backwards
    converged = sweep_verdict(converging_rows(), reversed_score, {})
    assert not converged["tests"][PRIMARY]["supports"] and converged["tests"][PRIMARY]["rho"] > 0
    assert "this run does not support the claim (rho has the wrong sign). Outcome" in converged["statement"][0]
    capped = sweep_verdict(converging_rows(stops={(1, 0): "cap", (2, 1): "cap", (4, 0): "cap"}), reversed_score, {})
    assert ("this run fails the test (rho has the wrong sign) on unconverged losses, which is no evidence against "
            "the claim. Outcome: inconclusive") in capped["statement"][1]


def test_a_bridge_no_better_than_the_token_lookup_makes_it_inconclusive_and_is_named():
    # every bridge at its plateau; layer 3 seed 1 is below its lookup (5.0) but by less than the
    # 5 % margin (a bridge that starts at the lookup gets below it by any gain)
    v = sweep_verdict(converging_rows(primary={(3, 1): 4.8}), SCORE, {})
    assert v["convergence"]["plateau"] == 10 and v["convergence"]["worse_than_lookup"] == [[3, 1]]
    assert v["outcome"].startswith("inconclusive") and "layer 3 (seed 1) does not beat the token lookup by 5 %" in v["outcome"]
    assert "layer 3 (seed 1)" in v["statement"][0] and v["statement"][0].startswith("Inconclusive")
    two = sweep_verdict(converging_rows(primary={(3, 1): 6.0, (3, 0): 7.0, (5, 0): 5.5}), SCORE, {})
    assert two["convergence"]["worse_than_lookup"] == [[3, 0], [3, 1], [5, 0]]
    assert "layers 3 (seeds 0, 1), 5 (seed 0) do not beat the token lookup by 5 %" in two["outcome"]
    just = sweep_verdict(converging_rows(primary={(3, 1): 4.7}), SCORE, {})  # 6 % below: learned
    assert just["convergence"]["converged"] and just["convergence"]["worse_than_lookup"] == []


def test_where_linear_context_cannot_remove_5_percent_the_lookup_ridge_control_is_the_bar():
    """Amendment 9: the bar is the higher of 0.95 x lookup and the lookup + ridge control. Lookup
    5.0 at every layer; at layer 3 the linear control is 4.9 (only 2 % below), so 4.85 learned more
    context than it and passes, and 4.95 (below the lookup, above the control) does not; where the
    control is 4.0 the 5 % margin (4.75) stays the bar."""
    def rows(value, control):
        out = converging_rows(primary={(3, 1): value})
        for r in out:
            r["control_lookup_ridge_nmse_dim"] = control if r["layer"] == 3 else 4.0
        return out

    assert sweep_verdict(rows(4.85, 4.9), SCORE, {})["convergence"]["converged"]
    above = sweep_verdict(rows(4.95, 4.9), SCORE, {})["convergence"]
    assert above["worse_than_lookup"] == [[3, 1]] and "or the lookup + ridge control" in above["reasons"][0]
    assert sweep_verdict(rows(4.8, 4.0), SCORE, {})["convergence"]["worse_than_lookup"] == [[3, 1]]
    assert sweep_verdict(rows(4.7, 4.0), SCORE, {})["convergence"]["converged"]
    # a control no better than the lookup (5.2) caps the bar at 0.99 x lookup = 4.95: the untrained
    # bridge (the lookup, 5.0) and 4.96 do not pass, 4.94 does
    for value, learned in ((5.0, False), (4.96, False), (4.94, True)):
        assert sweep_verdict(rows(value, 5.2), SCORE, {})["convergence"]["converged"] == learned, value


def test_exactly_the_needed_share_at_the_plateau_converges():
    v = sweep_verdict(converging_rows(stops={(1, 0): "cap", (5, 1): "budget"}), SCORE, {})  # 8 of 10: 80 %
    assert v["convergence"]["plateau"] == 8 and v["convergence"]["converged"]
    assert not v["outcome"].startswith("inconclusive")
    assert "Convergence: 8 of 10 tested bridges stopped by their plateau (80 % needed)" in v["statement"][1]


def test_rows_without_a_lookup_control_cannot_establish_convergence():
    rows = converging_rows()
    for r in rows:
        del r["control_lookup_nmse_dim"]  # a sweep from before the control was recorded
    v = sweep_verdict(rows, SCORE, {})
    assert not v["convergence"]["converged"] and v["convergence"]["reasons"] == ["no lookup control recorded"]
    assert v["outcome"] == "inconclusive: the bridges did not converge (no lookup control recorded)"
    rows = converging_rows()
    rows[4]["control_lookup_nmse_dim"] = None  # one tested row lacks it (layer 2): named
    assert sweep_verdict(rows, SCORE, {})["convergence"]["reasons"] == ["no lookup control recorded for layer 2"]


def test_provisional_counts_the_seeds_of_the_tested_layers_only():
    rows = converging_rows()
    one = [r for r in rows if r["layer"] == 0 or r["seed"] == 0]  # the source keeps two seeds, the rest one
    v = sweep_verdict(one, SCORE, {})
    assert v["seeds"] == [0, 1] and v["tested_seeds"] == 1 and "provisional" in v["outcome"]
    assert "within the seed noise" not in v["outcome"]  # one seed: the noise is not measured, not small
    capped = sweep_verdict([dict(r, stop="cap") for r in one], SCORE, {})
    assert capped["outcome"].startswith("inconclusive") and "provisional" in capped["outcome"]
    assert "1 seed each" in " ".join(v["statement"])
    assert "provisional" not in sweep_verdict(rows, SCORE, {})["outcome"]


# --- the Holm family is the four registered secondaries: a missing one is an error

@pytest.mark.parametrize("loss", [PRIMARY, *SECONDARY])
def test_a_missing_registered_loss_is_an_error_not_a_smaller_family(loss):
    rows = converging_rows()
    for missing in (None, float("nan")):  # a diverged bridge's NaN would make every Holm p 1
        rows[3][loss] = missing  # layer 1, seed 1
        with pytest.raises(ValueError, match=f"rows of layer 1 have no finite {loss}"):
            sweep_verdict(rows, SCORE, {})
    del rows[3][loss]
    with pytest.raises(ValueError, match=loss):
        sweep_verdict(rows, SCORE, {})
    rows = converging_rows()
    rows[0][loss] = None  # the source (not tested) may lack it
    assert set(sweep_verdict(rows, SCORE, {})["tests"]) == {PRIMARY, *SECONDARY}


def test_the_holm_family_has_four_members():
    v = sweep_verdict(converging_rows(), SCORE, {})
    raw = {k: v["tests"][k]["p"] for k in SECONDARY}
    smallest = min(raw, key=raw.get)
    assert v["tests"][smallest]["p_holm"] == pytest.approx(min(1.0, 4 * raw[smallest]))


# --- the reliability of the seed mean, ICC(1,k)

def old_reliability(m):  # the formula it replaces: 1 - MSW / var(layer means), without the factor k
    return 1 - m.var(axis=1, ddof=1).mean() / m.mean(axis=1).var(ddof=1)


def test_seed_mean_reliability_is_near_zero_without_a_layer_effect():
    rng = np.random.default_rng(0)
    layers, k = 12, 3
    draws = rng.standard_normal((2000, layers, k))
    new = np.array([reliability(m) for m in draws])
    old = np.array([old_reliability(m) for m in draws])
    # MSB and MSW have equal expectations, but the mean of 1 - MSW/MSB = 1 - 1/F is 1 - E[F(L(k-1), L-1)]
    # = 1 - (L-1)/(L-3) = -2/(L-3): -0.22 at 12 layers (the ratio's bias), not 1 - k as the old one
    assert new.mean() == pytest.approx(-2 / (layers - 3), abs=0.05)
    assert old.mean() == pytest.approx(1 - k * (layers - 1) / (layers - 3), abs=0.15)  # -2.67
    assert abs(new.mean() - old.mean()) > 2
    assert abs(np.median(new)) < 0.1  # the typical value without a layer effect is 0
    many = np.array([reliability(m) for m in rng.standard_normal((500, 100, k))])
    assert many.mean() == pytest.approx(0, abs=0.05)  # the bias vanishes with the layer count


def test_seed_mean_reliability_is_near_one_with_a_strong_layer_effect():
    rng = np.random.default_rng(1)
    m = 10 * rng.standard_normal((12, 1)) + rng.standard_normal((12, 3))
    assert reliability(m) > 0.95


def test_seed_mean_reliability_is_one_minus_one_over_the_anova_f():
    rng = np.random.default_rng(2)
    for effect in (0.0, 0.5, 2.0):
        m = effect * rng.standard_normal((8, 1)) + rng.standard_normal((8, 4))
        f = stats.f_oneway(*m).statistic  # one group per layer, its seeds the observations
        assert reliability(m) == pytest.approx(1 - 1 / f)
    # hand-made: MSW = mean(0.02, 0.02, 0.08) = 0.04, MSB = 2 var(1.1, 2.1, 3.2) = 2.2067
    assert reliability([[1.0, 1.2], [2.0, 2.2], [3.0, 3.4]]) == pytest.approx(1 - 0.04 / (2 * np.var([1.1, 2.1, 3.2],
                                                                                                       ddof=1)))


def test_the_verdict_measures_reliability_over_the_seeds_every_tested_layer_has():
    rows = converging_rows()
    extra = dict(rows[-1], seed=7, **{k: 50.0 for k in (PRIMARY, *SECONDARY)})  # a third seed of layer 5 only
    v = sweep_verdict(rows + [extra], SCORE, {})
    common = np.array([[r[PRIMARY] for r in rows if r["layer"] == l] for l in range(1, 6)])
    assert v["reliability"][PRIMARY] == pytest.approx(reliability(common))


# --- the registered score, whatever weights the ranking used

def scanned_run(tmp_path, weights, log=False):
    """A run folder with what `summarise` reads: geometry.json (7 layers of made-up proxies),
    ranking.csv ranked with `weights` and ranking.json recording them."""
    from geoprobe.pipeline import GEOMETRY
    from geoprobe.ranking import rank_layers
    from geoprobe.report.tables import write_csv

    rng = np.random.default_rng(4)
    layers = [{"layer": l, **{norm: {p: {"value": float(v), "ci": [float(v), float(v)]}
                                     for p, v in zip(("curv", "mono", "erank"), rng.uniform(0.5, 5, 3))}
                              for norm in ("trace", "none")},
               "participation_ratio": 1.0, "entropy_rank": 1.0, "duplicate_fraction": 0.0, "massive": 0}
              for l in range(7)]
    geometry = {"settings": {"normalize": "trace"}, "layers": layers}
    (tmp_path / GEOMETRY).write_text(json.dumps(geometry))
    write_csv(rank_layers(geometry, weights, log), tmp_path / "ranking.csv")
    (tmp_path / "ranking.json").write_text(json.dumps({"weights": list(weights), "log": log}))
    return geometry


def test_the_tested_score_is_the_registered_one_whatever_weights_the_ranking_used(tmp_path):
    from geoprobe.ranking import layer_scores
    from geoprobe.workflows.sweep import ranking_rows, summarise

    other = (0.0, 0.0, 1.0)
    geometry = scanned_run(tmp_path, other, log=True)
    tested = list(range(1, 7))
    registered = layer_scores(geometry, tested, REGISTERED_WEIGHTS, REGISTERED_LOG)
    tuned = layer_scores(geometry, tested, other, True)
    assert stats.spearmanr(list(registered.values()), list(tuned.values())).statistic < 0.9  # they differ
    # losses that fall exactly with the registered score
    order = sorted(tested, key=registered.get)
    rows = rows_for({0: [0.0, 0.0], **{l: [1 - 0.1 * order.index(l) + e for e in (0.0, 0.01)] for l in tested}},
                    seeds=(0, 1))
    v = summarise(tmp_path, rows)
    assert v["scores"]["score"] == {str(l): pytest.approx(s) for l, s in registered.items()}
    assert v["tests"][PRIMARY]["rho"] == pytest.approx(-1.0)
    assert v["chosen_layer"] == max(tested, key=registered.get)
    # the every-layer control is z-scored over all 7 scanned layers with the registered weights, not ranking.csv's
    everywhere = layer_scores(geometry, list(range(7)), REGISTERED_WEIGHTS, REGISTERED_LOG)
    assert v["scores"]["score_all_layers"] == {str(l): pytest.approx(everywhere[l]) for l in tested}
    assert [r["score"] for r in ranking_rows(tmp_path) if r["layer"] in tested] != \
        pytest.approx([everywhere[l] for l in tested])
    assert v["registered_score"] == {"weights": [1.0, 1.0, 1.0], "log": False}
    assert v["ranking_weights"] == {"weights": [0.0, 0.0, 1.0], "log": True}
    assert any(line.startswith("The ranking used other weights (0, 0, 1, logs); the test ignores them")
               for line in v["statement"])
    scanned_run(tmp_path, REGISTERED_WEIGHTS)  # ranked with the registered weights: nothing to say
    same = summarise(tmp_path, rows)
    assert "ranking_weights" not in same and not any("other weights" in line for line in same["statement"])
    assert same["scores"] == v["scores"]


def test_the_vectorised_bootstrap_rho_is_scipys_spearmanr_row_by_row():
    # the verdict's bootstrap intervals rank every resample at once; ties and constant rows included
    import warnings

    from geoprobe.metrics.correlation import _rows_rho

    rng = np.random.default_rng(5)
    x, y = np.round(rng.standard_normal(7), 1), np.round(rng.standard_normal(7), 1)
    draws = rng.integers(0, 7, size=(500, 7))
    draws[0] = 3  # one pair repeated: constant ranks
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = np.array([stats.spearmanr(x[d], y[d]).statistic for d in draws])
    got = _rows_rho(x[draws], y[draws])
    assert np.isnan(got[0]) and np.array_equal(np.isnan(got), np.isnan(expected))
    assert np.allclose(got[~np.isnan(got)], expected[~np.isnan(expected)], atol=1e-12)


def test_an_included_source_is_left_out_of_the_lookup_condition():
    """With --include-source layer 0 is tested, but its lookup is exact (its state is its token's
    embedding), so no bridge can be strictly below it: the condition is for the learned layers."""
    rows = converging_rows()
    for r in rows:
        if r["layer"] == 0:
            r.update(stop="plateau", control_lookup_nmse_dim=0.0, **{PRIMARY: 0.0})
    scores = {"score": {l: float(l) for l in range(0, 6)}}
    v = sweep_verdict(rows, scores, {}, include_source=True)
    assert 0 in v["compared_layers"] and v["convergence"]["converged"], v["convergence"]
    rows[-1][PRIMARY] = 99.0  # a learned layer's bridge worse than its lookup still counts
    assert not sweep_verdict(rows, scores, {}, include_source=True)["convergence"]["converged"]


def test_the_terminal_table_folds_a_long_number_instead_of_cutting_it():
    import io

    from geoprobe.report.terminal import print_table

    out = io.StringIO()  # 14 columns in 140 characters: too narrow for every number on one line
    print_table("sweep", [f"loss {i}" for i in range(14)], [[1.4772534972812105e-15] * 14], out=out)
    text = out.getvalue()
    assert "…" not in text and "1.477e-" in text  # "1.477e-…" reads as another number


def test_the_lookup_controls_say_how_much_of_the_order_a_per_token_table_gives():
    # the lookup rises with depth; each bridge leaves a share of it that does not; the score ranks the
    # lookups exactly: the registered test on the lookup alone then passes with no bridge trained
    lookup = {l: 0.1 * l for l in range(1, 7)}
    ratio = {1: 0.90, 2: 0.70, 3: 0.85, 4: 0.60, 5: 0.80, 6: 0.75}
    rows = rows_for({l: [lookup[l] * ratio[l] + e for e in (0.0, 0.001, -0.001)] for l in range(1, 7)})
    for r in rows:
        r["control_lookup_nmse_dim"] = lookup[r["layer"]]
    score = {l: -lookup[l] for l in range(1, 7)}
    v = sweep_verdict(rows, {"score": score}, {l: 0.0 for l in range(1, 7)})
    c = v["controls"][PRIMARY]
    layers = range(1, 7)
    mean = [lookup[l] * ratio[l] for l in layers]
    assert c["lookup"]["rho"] == pytest.approx(stats.spearmanr([lookup[l] for l in layers], mean).statistic)
    assert c["score_vs_lookup"]["rho"] == pytest.approx(-1.0) and c["score_vs_lookup"]["p"] == pytest.approx(1 / 720)
    want = stats.spearmanr([score[l] for l in layers], [ratio[l] for l in layers]).statistic
    assert c["relative_to_lookup"]["rho"] == pytest.approx(want)
    assert c["relative_to_lookup"]["p"] > 0.05  # the context's share does not follow the score here
    # rho(lookup, loss) is two-sided, as depth's: its p is the exact permutation p of |rho| over the 6! pairings
    assert c["lookup"]["alternative"] == "two-sided"
    pairings = [stats.spearmanr([lookup[l] for l in layers], perm).statistic
                for perm in itertools.permutations(mean)]
    exact = np.mean(np.abs(pairings) >= abs(c["lookup"]["rho"]) - 1e-12)
    assert c["lookup"]["p"] == pytest.approx(exact)
    controls = next(line for line in v["statement"] if line.startswith("Controls:"))
    assert "no bridge trained: rho -1.00" in controls and "what context adds" in controls
    # the primary test passes here (the loss follows the lookup), and the statement says what that means
    assert v["tests"][PRIMARY]["supports"]
    assert any("ranks how much of each layer is a per-token table" in line for line in v["statement"])
    # a constant lookup has no ranks: no control rather than a nan rho with p 0
    for r in rows:
        r["control_lookup_nmse_dim"] = 0.5
    assert "lookup" not in sweep_verdict(rows, {"score": score}, {l: 0.0 for l in layers})["controls"][PRIMARY]
    # the secondaries get no lookup control (the table is per-channel nmse), and a layer without one drops them
    assert "lookup" not in v["controls"]["nmse"]
    for r in rows:
        if r["layer"] == 1:
            r["control_lookup_nmse_dim"] = None
    assert "lookup" not in sweep_verdict(rows, {"score": score}, {l: 0.0 for l in layers})["controls"][PRIMARY]


def test_the_lookup_line_names_what_the_score_ranks():
    from geoprobe.verdict import lookup_line

    def c(table_p, share_p, rho=-0.9):
        return {"score_vs_lookup": {"rho": rho, "p": table_p}, "relative_to_lookup": {"rho": rho, "p": share_p}}

    assert "ranks what context adds" in lookup_line(c(0.001, 0.01))
    assert "per-token table, which needs no bridge" in lookup_line(c(0.001, 0.3))
    assert "predicts neither" in lookup_line(c(0.2, 0.3))
    assert "predicts neither" in lookup_line(c(0.001, 0.001, rho=0.9))  # the wrong sign is no prediction


def test_a_bridges_own_lines_say_how_it_stopped_and_whether_it_learned():
    from geoprobe.verdict import bridge_lines

    base = {"layer": 3, "stop": "plateau", "steps_run": 2900, "best_step": 2850, "nmse_dim": 0.137,
            "control_lookup_nmse_dim": 0.280, "beats_lookup": True}
    lines = bridge_lines(base)
    assert lines == ["Stopped by its plateau at step 2,900, with its best weights (step 2,850).",
                     "nmse_dim 0.1370 against its token lookup's 0.2800: it learned more than a table of per-token means."]
    capped = bridge_lines({**base, "stop": "cap", "steps_run": 4000})
    assert capped[0].startswith("Reached its step cap (4,000) before its plateau: unconverged")
    # SmolLM2's first layer-0 bridge (2026-12-05): stopped at once with its initial weights
    source = bridge_lines({**base, "layer": 0, "steps_run": 250, "best_step": 0, "nmse_dim": 0.0152,
                           "control_lookup_nmse_dim": 0.0152, "beats_lookup": False})
    assert source[1].startswith("It never improved on its start (best step 0)") and "--until steps" in source[1]
    assert "learned little beyond a table of per-token means" in source[2]
    assert "--until steps" not in bridge_lines({**base, "best_step": 0})[1]  # not the source: no such advice
    assert len(bridge_lines({"layer": 3, "stop": "budget", "steps_run": 6})) == 1  # no lookup recorded: no claim
    assert bridge_lines({"layer": 3, "nmse_dim": 0.2}) == []  # an old record without its stop


def diffusion_rows(objective_by_layer: dict, seeds=(0, 1), lookup=10.0, posterior=None):
    """A diffusion sweep's rows: the objective per layer and seed, the other losses following it,
    the posterior mean's nmse_dim `posterior` (default: half the objective)."""
    rows = []
    for layer, values in objective_by_layer.items():
        for seed, v in zip(seeds, values):
            rows.append({"layer": layer, "seed": seed, "stop": "plateau", "control_lookup_nmse_dim": lookup,
                         "bridge_kind": "diffusion", "objective": v, "nmse_dim": 1.5 * v, "nmse": v, "delta_ce": v,
                         "nmse_noisy": v, "nmse_dim_1step": v / 2 if posterior is None else posterior})
    return rows


def test_a_diffusion_sweep_ranks_its_objective_and_controls_for_depth_and_the_massive_channels():
    """Amendment 13: the primary is the objective, the Holm family the posterior mean's and the
    sample's nmse_dim, delta_ce and nmse_noisy; robust support needs both partial rhos."""
    layers = range(1, 9)
    # the loss falls with the score; the score is unrelated to depth and to the share
    score = {1: 3.0, 2: 8.0, 3: 1.0, 4: 6.0, 5: 2.0, 6: 7.0, 7: 4.0, 8: 5.0}
    share = {1: 0.5, 2: 0.1, 3: 0.3, 4: 0.8, 5: 0.2, 6: 0.4, 7: 0.7, 8: 0.6}
    table = {l: [1 - 0.1 * score[l] + e for e in (0.0, 0.005)] for l in layers}
    v = sweep_verdict(diffusion_rows(table), {"score": score}, share)
    assert v["protocol"] == "diffusion" and v["primary_loss"] == "objective"
    assert set(v["tests"]) == {"objective", "nmse_dim_1step", "nmse_dim", "delta_ce", "nmse_noisy"}
    assert all("p_holm" in v["tests"][k] for k in v["secondary_losses"]) and "p_holm" not in v["tests"]["objective"]
    c = v["controls"]["objective"]
    assert c["partial_given_depth"]["p"] < 0.05 and c["partial_given_share"]["p"] < 0.05
    assert v["outcome"] == "robustly supported"
    assert any("massive-channel share) = " in line for line in v["statement"])


def test_a_score_that_copies_the_massive_channel_share_cannot_be_separated_from_it():
    """The score is the massive-channel share itself and the loss follows the share: the primary
    test passes, the partial rho given the share is undefined (the score has nothing beyond the
    share), and the outcome says the score cannot be separated from the massive channels (amendment
    14; before it: "does not hold beyond them")."""
    layers = range(1, 9)
    share = {1: 0.5, 2: 0.1, 3: 0.3, 4: 0.8, 5: 0.2, 6: 0.4, 7: 0.7, 8: 0.6}
    table = {l: [1 - share[l] + e for e in (0.0, 0.005)] for l in layers}
    v = sweep_verdict(diffusion_rows(table), {"score": dict(share)}, share)
    assert v["tests"]["objective"]["supports"]
    assert v["controls"]["objective"]["partial_given_share"]["rho"] is None
    assert v["outcome"].startswith("supported, but it cannot be separated from the massive channels")
    assert "does not hold beyond" not in v["outcome"]
    assert "the score itself follows the share (rho 1.00), so the two cannot be separated" in " ".join(v["statement"])
    # the loss off the share by two swapped pairs of layers: the score, still the share, is what the
    # share predicts and nothing more (its residual on the share is 0: the partial stays undefined)
    swapped = {**table, 1: table[6], 6: table[1], 7: table[8], 8: table[7]}
    w = sweep_verdict(diffusion_rows(swapped), {"score": dict(share)}, share)
    assert w["controls"]["objective"]["partial_given_share"]["rho"] is None
    assert "cannot be separated from the massive channels" in w["outcome"] or w["outcome"] == "not supported"


def test_a_diffusion_bridge_is_judged_against_the_lookup_by_its_posterior_mean_and_kinds_do_not_mix():
    table = {l: [0.5 + 0.01 * l, 0.501 + 0.01 * l] for l in range(1, 6)}
    # posterior mean 0.2 beats a lookup of 0.3 (0.95 x 0.3 = 0.285) though the sample (0.75) does not
    ok = sweep_verdict(diffusion_rows(table, lookup=0.3, posterior=0.2), {"score": {l: l for l in range(1, 6)}}, {})
    assert ok["convergence"]["converged"] and "by its posterior mean" in ok["statement"][1]
    bad = sweep_verdict(diffusion_rows(table, lookup=0.3, posterior=0.29), {"score": {l: l for l in range(1, 6)}}, {})
    assert not bad["convergence"]["converged"]
    mixed = diffusion_rows(table) + rows_for({1: [0.1]}, seeds=(5,))
    with pytest.raises(ValueError, match="mix bridge kinds"):
        sweep_verdict(mixed, {"score": {l: l for l in range(1, 6)}}, {})


def test_a_loss_that_is_the_same_at_every_layer_is_not_evidence_and_says_why():
    """A constant loss has no ranks: p 1 (scipy's permutation test gives 0 there), and the lines say
    rho is undefined rather than that it has the wrong sign."""
    v = sweep_verdict(diffusion_rows({l: [0.5, 0.5] for l in range(1, 6)}), {"score": {l: l for l in range(1, 6)}}, {})
    t = v["tests"]["objective"]
    assert t["p"] == 1.0 and not t["supports"] and v["outcome"] == "not supported"
    said = " ".join(v["statement"])
    assert "rho is undefined: the loss is the same at every layer" in said and "wrong sign" not in said
    assert "the seed-mean objective is the same at every tested layer" in said


def test_a_diffusion_sweeps_ceiling_is_ranked_beside_its_posterior_mean_not_its_objective():
    """The ceiling is a clean regression: its nmse_dim is ranked against the bridges' posterior-mean
    nmse_dim (amendment 13), never against the objective, a loss it has no counterpart of."""
    layers = range(1, 7)
    table = {l: [1.0 - 0.1 * l, 1.002 - 0.1 * l] for l in layers}  # the objective falls with depth
    rows = with_values(diffusion_rows(table), ceiling_nmse_dim={l: 0.01 * l for l in layers},
                       nmse_dim_1step={l: 0.02 * l for l in layers})  # the posterior mean rises with it
    v = sweep_verdict(rows, {"score": {l: float(l) for l in layers}}, {})
    assert v["controls"]["nmse_dim_1step"]["ceiling"]["rho"] == pytest.approx(1.0)
    assert "ceiling" not in v["controls"]["objective"]  # against the objective it would read -1
    said = [line for line in v["statement"] if line.startswith("rho(ceiling's nmse_dim, nmse_dim_1step) = 1.00")]
    assert len(said) == 1
    from geoprobe.workflows.sweep_page import control_rows

    assert {r["loss"]: r.get("ρ(ceiling's nmse_dim)") for r in control_rows(v)} == {
        loss: pytest.approx(1.0) if loss == "nmse_dim_1step" else None for loss in v["controls"]}


def test_the_sensitivity_after_the_massive_channels_onset_is_reported_not_tested():
    share = {1: 0.1, 2: 0.14, **{l: 0.3 for l in range(3, 9)}}  # the onset: the first share >= 0.3 / 2
    score = {l: float(l) for l in range(1, 9)}
    # layers 1-2 break the order; from layer 3 on the loss falls with the score
    table = {1: [0.1, 0.1], 2: [0.2, 0.2], **{l: [1 - 0.1 * l, 1 - 0.1 * l] for l in range(3, 9)}}
    v = sweep_verdict(diffusion_rows(table), {"score": score}, share)
    assert v["after_onset"]["layers"] == [3, 4, 5, 6, 7, 8] and v["after_onset"]["rho"] == pytest.approx(-1.0)
    assert v["tests"]["objective"]["rho"] > -1.0  # the registered test over every layer is another number
    assert any(line.startswith("Sensitivity, chosen after") for line in v["statement"])
    assert v["onset"] == 3 and not any(line.startswith("No sensitivity") for line in v["statement"])
    # an onset at the first tested layer (Gemma's) or too few layers after it: said, not silently left out
    for first, said in ((1, "it is layer 1, the first tested layer, so it would repeat the primary test."),
                        (6, "it is layer 6, and 3 tested layers from it on are fewer than a test needs (4).")):
        late = {l: 0.1 if l < first else 0.3 + 0.01 * l for l in range(1, 9)}
        w = sweep_verdict(diffusion_rows(table), {"score": score}, late)
        assert w["after_onset"] is None and w["onset"] == first
        assert [line for line in w["statement"] if line.startswith("No sensitivity")] == [
            "No sensitivity after the massive channels' onset: " + said]


# --- amendment 14: the analyses added to the page

def with_values(rows: list[dict], **by_layer: dict) -> list[dict]:
    """`rows` with each named key set per layer ({layer: value}, the same on every seed)."""
    return [{**r, **{k: values[r["layer"]] for k, values in by_layer.items()}} for r in rows]


ROBUST = {"score": {1: 3.0, 2: 8.0, 3: 1.0, 4: 6.0, 5: 2.0, 6: 7.0, 7: 4.0, 8: 5.0},
          "share": {1: 0.5, 2: 0.1, 3: 0.3, 4: 0.8, 5: 0.2, 6: 0.4, 7: 0.7, 8: 0.6}}


def robust_table():
    """A diffusion sweep that passes both partial tests (as in the test above): its loss falls with a
    score unrelated to depth and to the share."""
    return {l: [1 - 0.1 * ROBUST["score"][l] + e for e in (0.0, 0.005)] for l in range(1, 9)}


def test_a_run_without_a_massive_channel_share_fails_the_robust_condition():
    table, score = robust_table(), {"score": ROBUST["score"]}
    assert sweep_verdict(diffusion_rows(table), score, ROBUST["share"])["outcome"] == "robustly supported"
    for share in ({}, {**ROBUST["share"], 4: None}, {l: 0.3 for l in range(1, 9)}):  # none, one missing, constant
        v = sweep_verdict(diffusion_rows(table), score, share)
        assert "partial_given_share" not in v["controls"]["objective"] and "score_vs_share" not in v
        assert v["outcome"].startswith("supported, but the massive-channel share is not measured"), (share, v["outcome"])
    # the regression sweep's robust condition is the one it was registered with: depth and noise only
    assert sweep_verdict(rows_for(table, seeds=(0, 1)), score, {})["outcome"] == "robustly supported"


@pytest.mark.parametrize("swaps, phrase", [([(1, 2)], "cannot be separated from the massive channels"),
                                           ([(1, 3), (6, 7)], "does not hold beyond the massive channels")])
def test_a_failed_partial_given_the_share_reads_by_how_closely_the_score_follows_the_share(swaps, phrase):
    """The loss is the share; the score falls with the share but for swapped layers: one swapped pair
    leaves |rho(score, share)| = 0.98 (>= 0.9: the two cannot be separated), two swaps leave 0.88
    (the score is apart from the share, yet adds nothing beyond it to the loss)."""
    share = ROBUST["share"]  # unrelated to depth
    by_share = sorted(share, key=share.get)  # the layers from the smallest share up
    order = list(range(1, 9))
    for a, b in swaps:
        order[a - 1], order[b - 1] = order[b - 1], order[a - 1]
    score = {layer: -float(order[k]) for k, layer in enumerate(by_share)}
    v = sweep_verdict(diffusion_rows({l: [share[l], share[l] + 0.001] for l in range(1, 9)}), {"score": score}, share)
    expected = 1 - 6 * sum((o - k) ** 2 for k, o in enumerate(order, 1)) / (8 * 63)
    assert v["score_vs_share"]["rho"] == pytest.approx(-expected)
    assert v["tests"]["objective"]["supports"] and v["controls"]["objective"]["partial_given_share"]["rho"] is None
    other = ({"cannot be separated from the massive channels", "does not hold beyond the massive channels"} - {phrase}).pop()
    assert v["outcome"].startswith("supported, but") and phrase in v["outcome"] and other not in v["outcome"]
    assert ("so the two cannot be separated" in " ".join(v["statement"])) == (phrase.startswith("cannot"))


def test_the_sensitivity_says_where_the_score_cannot_be_separated_from_depth():
    share = {1: 0.1, 2: 0.14, **{l: 0.3 for l in range(3, 9)}}  # the onset is layer 3
    table = {1: [0.1, 0.1], 2: [0.2, 0.2], **{l: [1 - 0.1 * l, 1 - 0.1 * l] for l in range(3, 9)}}
    v = sweep_verdict(diffusion_rows(table), {"score": {l: float(l) for l in range(1, 9)}}, share)
    assert v["after_onset"]["score_vs_depth"]["rho"] == pytest.approx(1.0)
    line = next(line for line in v["statement"] if line.startswith("Sensitivity"))
    assert line.endswith("; over the same layers rho(score, depth) = 1.00: not separable from depth.")
    # a score that does not follow depth over layers 3-8: the rho is said, the phrase is not
    score = {1: 1.0, 2: 2.0, 3: 5.0, 4: 3.0, 5: 8.0, 6: 4.0, 7: 7.0, 8: 6.0}
    w = sweep_verdict(diffusion_rows(table), {"score": score}, share)
    rho = stats.spearmanr([score[l] for l in range(3, 9)], range(3, 9)).statistic
    assert w["after_onset"]["score_vs_depth"]["rho"] == pytest.approx(rho) and abs(rho) < 0.9
    line = next(line for line in w["statement"] if line.startswith("Sensitivity"))
    assert f"rho(score, depth) = {rho:.2f}." in line and "not separable" not in line


def test_a_diffusion_layer_with_no_bridge_at_its_plateau_makes_the_sweep_inconclusive():
    """8 of 10 tested bridges at their plateau meets the 80 %, but both of layer 4's reached the cap:
    a diffusion sweep is inconclusive (amendment 14); the regression sweep keeps its registered rule."""
    table = {l: [1 - 0.1 * l, 1 - 0.1 * l + 0.01] for l in range(1, 6)}
    score = {"score": {l: float(l) for l in range(1, 6)}}
    rows = [{**r, "stop": "cap" if r["layer"] == 4 else "plateau"} for r in diffusion_rows(table)]
    v = sweep_verdict(rows, score, {})
    assert v["convergence"]["plateau"] == 8 and v["convergence"]["unstopped_layers"] == [4]
    assert v["outcome"] == ("inconclusive: the bridges did not converge (layer 4 has no bridge stopped by its plateau "
                            "(every tested layer needs one))")
    one = [{**r, "stop": "cap" if (r["layer"], r["seed"]) in ((4, 0), (2, 1)) else "plateau"}
           for r in diffusion_rows(table)]  # one capped bridge at each of two layers: each layer has one at its plateau
    assert sweep_verdict(one, score, {})["convergence"]["converged"]
    regression = [{**r, "stop": "cap" if r["layer"] == 4 else "plateau"} for r in rows_for(table, seeds=(0, 1))]
    r = sweep_verdict(regression, score, {})
    assert r["convergence"]["converged"] and "unstopped_layers" not in r["convergence"]


def test_the_objective_is_shown_beside_its_posterior_mean_and_the_lookups_own_objective():
    """rho(objective, nmse_dim_1step), the test on the objective less its tau = 0 part, and the lookup
    controls on the untrained bridge's objective (the same kind of loss), each against scipy."""
    table, score = robust_table(), ROBUST["score"]
    layers = range(1, 9)
    posterior = {1: 0.3, 2: 0.1, 3: 0.5, 4: 0.2, 5: 0.6, 6: 0.15, 7: 0.4, 8: 0.35}
    tau0 = {l: 1.2 - 0.05 * l for l in layers}  # the objective less it: each layer's objective + 0.05 l - 1.2
    lookup = {1: 2.0, 2: 1.5, 3: 1.8, 4: 1.1, 5: 1.9, 6: 1.7, 7: 1.3, 8: 1.6}
    rows = [{**r, "nmse_dim_1step": posterior[r["layer"]]} for r in diffusion_rows(table)]
    v = sweep_verdict(with_values(rows, objective_tau0=tau0, control_lookup_objective=lookup), {"score": score},
                      ROBUST["share"])
    c = v["controls"]["objective"]
    objective = [np.mean(table[l]) for l in layers]
    assert c["posterior_mean"]["rho"] == pytest.approx(stats.spearmanr(objective, [posterior[l] for l in layers])[0])
    assert c["posterior_mean"]["alternative"] == "two-sided"
    beyond = [o - tau0[l] for o, l in zip(objective, layers)]
    assert c["beyond_posterior_mean"]["rho"] == pytest.approx(stats.spearmanr([score[l] for l in layers], beyond)[0])
    assert c["beyond_posterior_mean"]["alternative"] == "less"
    relative = [o / lookup[l] for o, l in zip(objective, layers)]
    assert c["relative_to_lookup"]["rho"] == pytest.approx(stats.spearmanr([score[l] for l in layers], relative)[0])
    assert c["lookup"]["rho"] == pytest.approx(stats.spearmanr([lookup[l] for l in layers], objective)[0])
    line = next(line for line in v["statement"] if line.startswith("Beyond the posterior mean"))
    assert f"rho(objective, nmse_dim_1step) over the tested layers = {c['posterior_mean']['rho']:.2f}" in line
    assert f"(objective - objective_tau0, its tau > 0 terms" in line
    assert "rho(token lookup's objective, objective)" in " ".join(v["statement"])
    # without the lookup's own objective the objective has no lookup controls: its nmse_dim is another kind of loss
    bare = sweep_verdict(diffusion_rows(table), {"score": score}, ROBUST["share"])["controls"]["objective"]
    assert "lookup" not in bare and "beyond_posterior_mean" not in bare and "posterior_mean" in bare
    assert "posterior_mean" not in sweep_verdict(rows_for(table), {"score": score}, ROBUST["share"])["controls"]["nmse_dim"]


def test_a_diffusion_bridges_own_lines_hold_its_posterior_mean_against_the_lookup():
    """beats_lookup reads a diffusion bridge's posterior mean (the sample's error holds the posterior's
    spread): its line says that number, and the objective beside the lookup's own."""
    from geoprobe.verdict import bridge_lines

    m = {"layer": 3, "stop": "plateau", "steps_run": 2900, "best_step": 2850, "bridge_kind": "diffusion",
         "nmse_dim": 0.2776, "nmse_dim_1step": 0.2421, "control_lookup_nmse_dim": 0.2798, "beats_lookup": True,
         "objective": 0.2989, "control_lookup_objective": 0.4123}
    lines = bridge_lines(m)
    assert lines[1] == ("posterior-mean (1-step) nmse_dim 0.2421 against its token lookup's 0.2798: it learned more "
                        "than a table of per-token means.")
    assert lines[2] == "Its objective 0.2989 against the token lookup's own 0.4123 (the untrained bridge's, whose update is zero)."
    worse = bridge_lines({**m, "nmse_dim_1step": 0.275, "beats_lookup": False})
    assert worse[1].startswith("posterior-mean (1-step) nmse_dim 0.2750") and "not below 0.2658" in worse[1]


def test_the_sweep_pages_tables_show_the_objectives_tau_zero_part_the_lookups_objective_and_their_controls():
    from geoprobe.workflows.sweep_page import control_rows, layer_columns, layer_rows

    table = robust_table()
    rows = with_values(diffusion_rows(table), crps_dim={l: 0.1 for l in range(1, 9)},
                       objective_tau0={l: 2.0 - 0.01 * l for l in range(1, 9)},
                       control_lookup_objective={l: 3.0 + 0.1 * l for l in range(1, 9)})
    v = sweep_verdict(rows, {"score": ROBUST["score"]}, ROBUST["share"])
    v["scores"] = {"score": {str(l): s for l, s in ROBUST["score"].items()}}
    people = layer_rows(v)
    columns = layer_columns(people)
    assert columns[4:7] == ["objective", "objective τ = 0", "lookup objective"]
    assert people[0]["objective τ = 0"] == "1.99 ± 0" and people[0]["lookup objective"] == "3.1 ± 0"
    control = control_rows(v)[0]
    assert control["loss"] == "objective" and control["ρ(nmse_dim 1 step)"] == pytest.approx(1.0)
    assert control["ρ, score vs objective − its τ = 0 part"] == v["controls"]["objective"]["beyond_posterior_mean"]["rho"]
    # a regression sweep's table keeps its columns
    plain = sweep_verdict(rows_for({l: [0.1 * l] * 2 for l in range(1, 6)}, seeds=(0, 1)), SCORE, {})
    plain["scores"] = {"score": {str(l): float(l) for l in range(1, 6)}}
    assert "objective τ = 0" not in layer_columns(layer_rows(plain))


def test_a_layers_objective_tau0_is_averaged_only_over_all_its_seeds():
    """objective - objective_tau0 is read per layer: a seed without objective_tau0 (a bridge
    recorded before the key existed) leaves the layer's mean out, while objective keeps both."""
    rows = [{"layer": 1, "seed": 0, "objective": 0.5, "objective_tau0": 0.6},
            {"layer": 1, "seed": 1, "objective": 0.7},
            {"layer": 2, "seed": 0, "objective": 0.4, "objective_tau0": 0.5},
            {"layer": 2, "seed": 1, "objective": 0.6, "objective_tau0": 0.7}]
    first, second = layer_table(rows)
    assert first["objective"] == pytest.approx(0.6) and first["objective_tau0"] is None
    assert second["objective_tau0"] == pytest.approx(0.6)
