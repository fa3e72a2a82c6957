"""The sweep's verdict: does the geometry score predict how hard a layer's bridge is to train?

The test is fixed before any number (docs/method.md, "The sweep verdict"):

* compared layers: every swept layer but the source (layer 0, whose clean source *is* its
  state, so its loss is ~0 by construction); the score is z-scored over the compared layers;
* primary: one-sided Spearman rho(score, seed mean of nmse_dim) < 0, permutation p, alpha 0.05.
  nmse_dim standardises each channel by its own variance, so the few massive channels that carry
  most of a layer's variance (and also drive the score) do not decide it; delta_ce is not the
  primary loss because a bidirectional bridge sees the token each position must predict;
* the score is the registered one, weights (1, 1, 1) without logs, whatever weights `geoprobe
  rank` was given: a score tuned after the fact is not the score the test was registered for;
* secondary: the same test for nmse, delta_ce, nmse_noisy and the bridge's own objective,
  Holm-corrected over exactly those four (a row without one is an error, not a smaller family);
* convergence: the test speaks about the layers only if their bridges were trained to the end:
  at least CONVERGED_SHARE of the tested bridges stopped by their plateau, and every tested bridge
  beats the closed-form token-identity lookup at its layer by LOOKUP_MARGIN, or by less where the
  lookup + ridge control is closer to the lookup (`learned_below`, amendment 9) (a bridge that does
  not has learned little more than a table of per-token means, so its loss says how training
  went, not how hard the layer is; the default bridge starts *at* the lookup, so "below" alone
  would be met by any gain); otherwise the outcome is "inconclusive", whatever the test says;
* reliability of every loss over the seed replicates (ICC(1,k): of the seed mean the test uses);
  layers whose seed means lie within the noise of the best (or worst) are named as tied, not ranked;
* controls: rho(depth, loss), rho(massive-channel share, loss), the partial rho of score and loss
  given depth (Freedman-Lane permutation p), and the score computed three other ways (z-scored
  over every scanned layer, --normalize none, massive channels excluded) against the same losses;
  for the primary loss also the token lookup's: rho(lookup, loss), the test on the lookup itself
  and on loss / lookup (amendment 12);
* the outcome: "inconclusive: ..." (the bridges did not converge), "robustly supported" (primary
  passes, reliability >= 0.5, partial rho given depth < 0 with p < 0.05), "supported, but ..."
  (primary passes, a robustness condition fails), "not supported"; with one seed of a tested
  layer the outcome is provisional.
"""

from __future__ import annotations

import math

import numpy as np

from scipy import stats

from geoprobe.metrics.correlation import holm, partial_spearman_test, reliability, spearman_with_uncertainty

PRIMARY = "nmse_dim"
SECONDARY = ("nmse", "delta_ce", "nmse_noisy", "objective")
LOSSES = (PRIMARY, *SECONDARY)
# each kind of bridge's registered test (docs/method.md): the primary loss, the Holm family of four,
# and the loss that must beat the token lookup. The regression sweep's is the one above; the
# diffusion bridge's (amendment 13) ranks its own validation objective, and its posterior mean
# (the tau = 0 prediction) must beat the lookup, since a sample's error includes the posterior's spread
PROTOCOLS = {
    "regression": {"primary": PRIMARY, "secondary": SECONDARY, "learned": "nmse_dim"},
    "diffusion": {"primary": "objective", "secondary": ("nmse_dim_1step", "nmse_dim", "delta_ce", "nmse_noisy"),
                  "learned": "nmse_dim_1step"},
}
# every loss a sweep's rows may carry, for the per-layer table
ALL_LOSSES = (*LOSSES, "nmse_dim_1step", "crps_dim")
ALPHA = 0.05
# the fewest compared layers whose one-sided permutation test can reach ALPHA: its smallest
# possible p is 1/n! (the one ordering of n distinct values that agrees perfectly)
MIN_LAYERS = next(n for n in range(1, 10) if 1 / math.factorial(n) < ALPHA)
# per-layer controls a sweep's rows carry (geoprobe.bridges.controls.layer_controls, sweep --ceiling), shown beside the losses
LAYER_CONTROLS = ("control_mean_nmse_dim", "control_lookup_nmse_dim", "control_ridge_nmse_dim",
                  "control_lookup_ridge_nmse_dim", "ceiling_nmse_dim")
RELIABLE = 0.5  # below this reliability of the seed means the layers' order is mostly seed noise
# converged: this share of the tested bridges stopped by their plateau (not the step cap or budget)
CONVERGED_SHARE = 0.8
# learned: nmse_dim below this fraction of the token lookup's (docs/method.md, amendment 8): the
# bridge's context removes at least 5 % of what a table of per-token means leaves
LOOKUP_MARGIN = 0.95
# ... or, where the lookup + ridge control is closer to the lookup than that, the control, but never
# less than 1 % below the lookup (amendment 9)
LOOKUP_FLOOR = 0.99
# the registered score: s = z(curv) + z(mono) - z(erank), no logs (docs/method.md)
REGISTERED_WEIGHTS = (1.0, 1.0, 1.0)
REGISTERED_LOG = False
SOURCE_LAYERS = (0,)
# the other ways of computing the score, each z-scored over the compared layers unless it says so
SCORE_VARIANTS = {"score_all_layers": "z-scored over every scanned layer (as the ranking does)",
                  "score_normalize_none": "--normalize none", "score_channels_excluded": "massive channels excluded"}
# the primary loss's controls against the token lookup (amendment 12), as the sweep page labels them
LOOKUP_CONTROLS = {"lookup": "ρ(lookup's loss)", "score_vs_lookup": "ρ, score vs the lookup's loss",
                   "relative_to_lookup": "ρ, score vs loss / lookup's"}
# ... and against the ceiling control (sweep --ceiling): whether the bridges order the layers as the
# plain clean regression of the same network does
CEILING_CONTROL = {"ceiling": "ρ(ceiling's loss)"}


def protocol_of(rows: list[dict]) -> str:
    """Which protocol a sweep's rows are tested under: "diffusion" when its bridges are stochastic
    (metrics.json's `bridge_kind`), "regression" otherwise (records from before the field are
    regressions). A sweep that mixes the two is refused: the test would rank different objectives."""
    kinds = {r.get("bridge_kind", "regression") for r in rows}
    if len(kinds) > 1:
        raise ValueError(f"the sweep's rows mix bridge kinds ({', '.join(sorted(kinds))}): one sweep tests one kind")
    return kinds.pop() if kinds else "regression"


def layer_table(rows: list[dict], losses=ALL_LOSSES) -> list[dict]:
    """One row per layer: the seed count, each loss's seed mean and standard deviation (ddof=1),
    the layer's controls (the same on every seed) and how many of its bridges stopped by their
    plateau, with their mean steps."""
    table = []
    for layer in sorted({r["layer"] for r in rows}):
        mine = [r for r in rows if r["layer"] == layer]
        row = {"layer": layer, "seeds": len(mine)}
        for loss in losses:
            values = np.array([r[loss] for r in mine if r.get(loss) is not None], dtype=float)
            row[loss] = float(values.mean()) if len(values) else None
            row[f"{loss}_sd"] = float(values.std(ddof=1)) if len(values) > 1 else None
        for key in (*LAYER_CONTROLS, "ceiling_stop"):
            row[key] = next((r[key] for r in mine if r.get(key) is not None), None)
        row["plateau"] = sum(r.get("stop") == "plateau" for r in mine)
        steps = [r["steps_run"] for r in mine if r.get("steps_run") is not None]
        row["steps_mean"] = float(np.mean(steps)) if steps else None
        table.append(row)
    return table


def tied_with(table: list[dict], loss: str, best: int) -> list[int]:
    """The layers whose seed mean of `loss` cannot be told apart from layer `best`'s: within the
    95% t-interval of a difference of two seed means, with the seed variance pooled over the
    layers (degrees of freedom: layers x (seeds - 1)). With one seed nothing can be told apart."""
    seeds = min(r["seeds"] for r in table)
    sds = [r[f"{loss}_sd"] for r in table]
    if seeds < 2 or any(sd is None for sd in sds):
        return [r["layer"] for r in table if r["layer"] != best]
    pooled = float(np.mean(np.square(sds)))
    half_width = stats.t.ppf(0.975, len(table) * (seeds - 1)) * np.sqrt(2 * pooled / seeds)
    ref = next(r for r in table if r["layer"] == best)[loss]
    return [r["layer"] for r in table if r["layer"] != best and abs(r[loss] - ref) <= half_width]


def sweep_verdict(rows: list[dict], scores: dict[str, dict[int, float]], channel_share: dict[int, float],
                  include_source: bool = False, seed: int = 0, ranking_weights: dict | None = None) -> dict:
    """The verdict of a sweep. `rows`: one per (layer, seed) with every loss, `stop` and
    `control_lookup_nmse_dim`; `scores`: "score" (the registered score, z-scored over the compared
    layers) and the SCORE_VARIANTS, each {layer: value}; `channel_share`: each layer's
    massive-channel variance share; `ranking_weights`: {"weights", "log"} that `geoprobe rank`
    used, if known (reported when they are not the registered ones; the test ignores them)."""
    table = layer_table(rows)
    sources = [] if include_source else [r["layer"] for r in table if r["layer"] in SOURCE_LAYERS]
    compared = [r for r in table if r["layer"] not in sources]
    layers = [r["layer"] for r in compared]
    protocol = protocol_of(rows)
    primary, secondary, learned = (PROTOCOLS[protocol][k] for k in ("primary", "secondary", "learned"))
    _check_losses(rows, layers, (primary, *secondary))
    registered = {"weights": list(REGISTERED_WEIGHTS), "log": REGISTERED_LOG}
    result = {"protocol": protocol, "primary_loss": primary, "secondary_losses": list(secondary),
              "learned_loss": learned, "alpha": ALPHA, "compared_layers": layers, "source_layers": sources,
              "seeds": sorted({r.get("seed", 0) for r in rows}), "layers": table,
              # the seeds behind each tested seed mean (layer 0 may have more): "provisional" counts these
              "tested_seeds": min((r["seeds"] for r in compared), default=0),
              "registered_score": registered,
              "convergence": convergence(rows, layers, learned)}
    if ranking_weights is not None and (list(ranking_weights["weights"]) != registered["weights"]
                                        or bool(ranking_weights["log"]) != REGISTERED_LOG):
        result["ranking_weights"] = {"weights": list(ranking_weights["weights"]), "log": bool(ranking_weights["log"])}
    # the layers the generation compares (the geometry's choice, the easiest and the hardest by
    # the primary loss): known with or without a test
    score = np.array([scores["score"][l] for l in layers])
    if compared:
        best = min(compared, key=lambda r: r[primary])["layer"]
        worst = max(compared, key=lambda r: r[primary])["layer"]
        result.update(chosen_layer=int(layers[int(np.argmax(score))]), oracle_layer=best, worst_layer=worst,
                      oracle_tied=tied_with(compared, primary, best), worst_tied=tied_with(compared, primary, worst))
    if len(compared) < MIN_LAYERS:
        smallest = 1 / math.factorial(len(compared))
        result["statement"] = [f"only {len(compared)} layers compared: no test (over {len(compared)} layers the "
                               f"one-sided permutation p cannot go below 1/{len(compared)}! = {smallest:.2g}, so it "
                               f"cannot reach {ALPHA}; at least {MIN_LAYERS} layers are needed)",
                               convergence_line(result["convergence"])]
        return result
    tests = _tests(score, compared, primary, secondary, seed)
    result["tests"] = tests
    result["reliability"] = {loss: reliability(_by_seed(rows, layers, loss)) for loss in tests}
    result["controls"] = _controls(compared, layers, score, scores, channel_share, list(tests), seed, primary)
    result["after_onset"] = after_onset(compared, layers, score, channel_share, primary, seed)
    shares = [channel_share.get(l, 0.0) for l in layers]
    if np.ptp(shares) > 0:  # how closely the score itself follows the massive channels (no loss involved)
        result["score_vs_share"] = spearman_with_uncertainty(score, shares, seed=seed, interval=False)
    result["capped"] = sorted({(r["layer"], r.get("seed", 0)) for r in rows
                               if r.get("stop") == "cap" and r["layer"] in layers})
    result["outcome"] = outcome(result)
    result["statement"] = statement(result)
    return result


def _tests(score, compared: list[dict], primary: str, secondary: tuple, seed: int) -> dict:
    """The one-sided test of every registered loss, the secondaries Holm-corrected over exactly
    their four, and whether each supports the claim."""
    tests = {loss: spearman_with_uncertainty(score, [r[loss] for r in compared], seed=seed, alternative="less")
             for loss in (primary, *secondary)}
    for loss, p in holm({loss: tests[loss]["p"] for loss in secondary}).items():  # always the four
        tests[loss]["p_holm"] = p
    for loss, test in tests.items():
        test["supports"] = bool(test["rho"] < 0 and test.get("p_holm", test["p"]) < ALPHA)
    return tests


def _check_losses(rows: list[dict], layers: list[int], losses: tuple = LOSSES) -> None:
    """Every tested row has every registered loss: the primary, and the four secondaries that make
    up the Holm family. Dropping one would shrink the family after the fact, so it is an error."""
    for loss in losses:
        lacking = sorted({r["layer"] for r in rows if r["layer"] in layers
                          and (r.get(loss) is None or not math.isfinite(r[loss]))})
        if lacking:
            raise ValueError(f"the sweep's rows of layer{'s' if len(lacking) > 1 else ''} "
                             f"{', '.join(map(str, lacking))} have no finite {loss}: the test "
                             f"needs the primary loss and all four secondaries ({', '.join(losses[1:])})")


def learned_below(lookup: float, lookup_ridge: float | None = None) -> float:
    """The nmse_dim a bridge must get below to count as learned: LOOKUP_MARGIN times its layer's
    token lookup, or, where a linear map of the short context cannot itself remove that 5 % (the
    lookup + ridge control is above the margin: layer 1 of SmolLM2, 0.0359 against a lookup of
    0.0368), that control's, capped at LOOKUP_FLOOR x lookup (method.md, amendment 9). Either way
    an untrained bridge, which is the lookup, does not pass: it must learn some context."""
    margin = LOOKUP_MARGIN * lookup
    # never above LOOKUP_FLOOR x lookup: a linear control no better than the lookup itself (it can
    # be, on held-out rows) would otherwise let an untrained bridge, which is the lookup, pass
    return margin if lookup_ridge is None else max(margin, min(lookup_ridge, LOOKUP_FLOOR * lookup))


def beats_lookup(nmse_dim: float, lookup: float | None, lookup_ridge: float | None = None) -> bool | None:
    """Whether a bridge learned more than its layer's token lookup (`learned_below`; None: no
    control recorded)."""
    return None if lookup is None else bool(nmse_dim < learned_below(lookup, lookup_ridge))


def bridge_lines(m: dict) -> list[str]:
    """What one bridge's metrics.json says of its training, in plain words: how it stopped, whether
    it ever improved on its start, and whether it learned more than its token lookup."""
    stop, steps, best = m.get("stop"), m.get("steps_run"), m.get("best_step")
    if stop is None or steps is None:  # a record from before these fields: nothing to say
        return []
    rule = m.get("plateau_rule") or {}  # the rule's last reading (records since issue 62)
    if stop == "plateau":
        lines = [f"Stopped by its plateau at step {steps:,}"
                 + (f", with its best weights (step {best:,})" if best is not None else "")
                 + (f": its stopping-split nmse_dim improved {rule['gain']:.1%} from step {rule['window'][0]:,} to "
                    f"{rule['window'][1]:,}, under the {rule['needs']:.0%} the rule asks." if "gain" in rule else ".")]
    elif stop == "cap":
        lines = [f"Reached its step cap ({steps:,}) before its plateau: unconverged, so its scores say how far "
                 "training got, not how hard the layer is."]
        if rule:
            lines.append(cap_advice(rule, steps))
    elif stop == "budget":
        lines = [f"Trained exactly {steps:,} steps (--until steps)."]
    else:
        lines = [f"Stopped: {stop}."]
    if stop == "plateau" and best == 0:
        lines.append("It never improved on its start (best step 0): these are its initial weights"
                     + (". At the source layer the clean score the plateau rule watches is the token lookup's "
                        "before any training, so the rule cannot see it learn the noisy conditions sampling needs: "
                        "train it with --until steps." if m.get("layer") in SOURCE_LAYERS else "."))
    learned, lookup = m.get("beats_lookup"), m.get("control_lookup_nmse_dim")
    if learned is not None and lookup is not None:
        bar = learned_below(lookup, m.get("control_lookup_ridge_nmse_dim"))
        lines.append(f"nmse_dim {m['nmse_dim']:.4f} against its token lookup's {lookup:.4f}: "
                     + ("it learned more than a table of per-token means." if learned else
                        f"not below {bar:.4f}, the bar for having learned ({100 * (1 - LOOKUP_MARGIN):.0f} % under "
                        "the lookup, or the lookup + ridge control where that is closer): it learned little beyond "
                        "a table of per-token means."))
    return lines


def cap_advice(rule: dict, steps: int) -> str:
    """Why a bridge under the plateau rule ran to its cap, and what to run: the curve was still
    falling, or the run was too short for the rule to judge it; a larger --steps resumes it."""
    if "gain" in rule:
        why = (f"It was still improving: {rule['gain']:.1%} from step {rule['window'][0]:,} to {rule['window'][1]:,}, "
               f"and the rule stops it only under {rule['needs']:.0%}.")
        more = 4 * steps
    else:
        why = (f"The run was too short for the plateau rule to judge it: the rule judges a bridge from step "
               f"{rule['from_step']:,} on (its kept weights are an average over about {rule.get('ema_steps', 100):,} "
               "steps, which a shorter curve mostly shows catching up).")
        more = max(4 * steps, 2 * rule["from_step"])
    return f"{why} Rerun with a larger --steps (e.g. --steps {more}) to resume it from step {steps:,}."


def convergence(rows: list[dict], layers: list[int], judged_by: str = PRIMARY) -> dict:
    """Whether the tested bridges (the compared layers, every seed) converged: at least
    CONVERGED_SHARE of them stopped by their plateau, and each one's nmse_dim is below its layer's
    `learned_below` (LOOKUP_MARGIN times the token-identity lookup control's, or the lookup + ridge
    control's where that is closer to the lookup: `beats_lookup`). A bridge that cannot beat a table of per-token
    mean states has not learned its layer, so its loss measures training, not the layer. A row
    without the control (a sweep from before it was recorded) leaves convergence unestablished.
    `judged_by` is the loss held against the lookup: nmse_dim, or a diffusion bridge's posterior mean's."""
    tested = [r for r in rows if r["layer"] in layers]
    plateau = sum(r.get("stop") == "plateau" for r in tested)
    share = plateau / len(tested) if tested else 0.0
    # the source layer (tested with --include-source) is its tokens' embedding: its lookup is exact
    # by construction, as is its bridge, so the lookup condition says nothing there
    learned = [r for r in tested if r["layer"] not in SOURCE_LAYERS]
    unknown = sorted({r["layer"] for r in learned if r.get("control_lookup_nmse_dim") is None})
    worse = sorted([r["layer"], r.get("seed", 0)] for r in learned if r.get("control_lookup_nmse_dim") is not None
                   and not beats_lookup(r[judged_by], r["control_lookup_nmse_dim"], r.get("control_lookup_ridge_nmse_dim")))
    reasons = []
    if share < CONVERGED_SHARE - 1e-12:  # the tolerance keeps e.g. 12 of 15 on the passing side
        reasons.append(f"{plateau} of {len(tested)} tested bridges stopped by their plateau, "
                       f"{CONVERGED_SHARE * 100:.0f} % needed")
    if unknown:
        reasons.append("no lookup control recorded" + (
            "" if len(unknown) == len({r["layer"] for r in learned}) else f" for layer{'s' if len(unknown) > 1 else ''} "
                                                   f"{', '.join(map(str, unknown))}"))
    if worse:
        seeds = {l: [s for m, s in worse if m == l] for l in sorted({l for l, _ in worse})}
        named = ", ".join(f"{l} (seed{'s' if len(s) > 1 else ''} {', '.join(map(str, s))})" for l, s in seeds.items())
        reasons.append(f"layer{'s' if len(seeds) > 1 else ''} {named} do{'es' if len(seeds) == 1 else ''} not beat "
                       f"the token lookup by {(1 - LOOKUP_MARGIN) * 100:.0f} % (or the lookup + ridge control, "
                       "where that is closer to the lookup)")
    return {"plateau": plateau, "tested": len(tested), "share": share, "needed": CONVERGED_SHARE, "learned": judged_by,
            "worse_than_lookup": worse, "converged": not reasons, "reasons": reasons}


def convergence_line(c: dict) -> str:
    """The convergence facts in one plain line."""
    if c["converged"]:
        judged = " by its posterior mean" if c.get("learned") == "nmse_dim_1step" else ""
        return (f"Convergence: {c['plateau']} of {c['tested']} tested bridges stopped by their plateau "
                f"({c['needed'] * 100:.0f} % needed) and every one beats the token lookup at its layer{judged} by "
                f"{(1 - LOOKUP_MARGIN) * 100:.0f} % (or the lookup + ridge control, where that is closer to the lookup).")
    return f"Inconclusive: the bridges did not converge — {'; '.join(c['reasons'])}; the test below says nothing " \
           "about the claim."


def _by_seed(rows: list[dict], layers: list[int], loss: str):
    """(layers, seeds) matrix of a loss, over the seeds every compared layer has."""
    seeds = sorted(set.intersection(*({r.get("seed", 0) for r in rows if r["layer"] == l} for l in layers)))
    value = {(r["layer"], r.get("seed", 0)): r[loss] for r in rows}
    return [[value[l, s] for s in seeds] for l in layers]


def _controls(compared, layers, score, scores, channel_share, losses, seed, primary: str = PRIMARY) -> dict:
    depth = np.array(layers, dtype=float)
    share = np.array([channel_share.get(l, 0.0) for l in layers])
    two = dict(seed=seed, interval=False)
    one = dict(seed=seed, alternative="less", interval=False)
    controls = {}
    for loss in losses:
        y = [r[loss] for r in compared]
        c = {"depth": spearman_with_uncertainty(depth, y, **two),
             "partial_given_depth": partial_spearman_test(score, y, depth, seed=seed)}
        if np.ptp(share) > 0:
            c["channel_share"] = spearman_with_uncertainty(share, y, **two)
            c["partial_given_share"] = partial_spearman_test(score, y, share, seed=seed)
        for name in SCORE_VARIANTS:
            if name in scores:
                c[name] = spearman_with_uncertainty([scores[name][l] for l in layers], y, **one)
        controls[loss] = c
    controls[primary].update(_lookup_controls(compared, score, one, two, primary))
    ceiling = [r.get("ceiling_nmse_dim") for r in compared]
    if all(v is not None for v in ceiling) and np.ptp(ceiling) > 0:  # every layer's, and not all equal
        controls[primary]["ceiling"] = spearman_with_uncertainty(ceiling, [r[primary] for r in compared], **two)
    return controls


def after_onset(compared, layers, score, channel_share, primary: str, seed) -> dict | None:
    """The primary test over the layers from the massive channels' onset on (the first compared
    layer whose massive-channel share is at least half the largest over the compared layers): a
    sensitivity analysis, chosen after the regression sweep's page was seen (method.md, amendment
    13), never the registered test. The score keeps its z-scores over every compared layer. None
    where the onset is the first compared layer, or fewer than MIN_LAYERS layers follow it."""
    top = max((channel_share.get(l, 0.0) for l in layers), default=0.0)
    onset = next((l for l in layers if top > 0 and channel_share.get(l, 0.0) >= top / 2), None)
    kept = [i for i, l in enumerate(layers) if onset is not None and l >= onset]
    if not MIN_LAYERS <= len(kept) < len(layers):
        return None
    test = spearman_with_uncertainty(np.asarray(score)[kept], [compared[i][primary] for i in kept], seed=seed,
                                     alternative="less", interval=False)
    return {"layers": [layers[i] for i in kept], **test}


def _lookup_controls(compared, score, one: dict, two: dict, primary: str = PRIMARY) -> dict:
    """Against the token lookup (method.md, amendment 12): every bridge starts at its layer's
    lookup, so its nmse_dim carries the lookup's, and a score that ranks the layers' lookups ranks
    their bridges with no bridge trained. Reported, not tested: rho(lookup, loss) (how much of the
    bridges' order the closed-form table gives), the registered test on the lookup itself, and on
    the share of the lookup's loss the bridge leaves (nmse_dim / lookup: what context adds).
    Empty unless every compared layer has a positive lookup control and they are not all equal
    (a constant has no ranks)."""
    lookup = [r.get("control_lookup_nmse_dim") for r in compared]
    if any(v is None or not v > 0 for v in lookup) or np.ptp(lookup) == 0:
        return {}
    y = np.array([r[primary] for r in compared])
    return {"lookup": spearman_with_uncertainty(lookup, y, **two),
            "score_vs_lookup": spearman_with_uncertainty(score, lookup, **one),
            "relative_to_lookup": spearman_with_uncertainty(score, y / np.array(lookup), **one)}


def outcome(v: dict) -> str:
    """docs/method.md's "What would count", as one phrase. Unconverged bridges make it
    inconclusive whatever the test says: their losses measure the training, not the layers."""
    # the seeds of the tested layers: the source may have more, and is not in the test
    provisional = (" (provisional: one seed per tested layer, the protocol asks for at least two)"
                   if v["tested_seeds"] < 2 else "")
    if not v["convergence"]["converged"]:
        return f"inconclusive: the bridges did not converge ({'; '.join(v['convergence']['reasons'])})" + provisional
    t, loss = v["tests"][v["primary_loss"]], v["primary_loss"]
    if not t["supports"]:
        return "not supported" + provisional
    rel = v["reliability"].get(loss)
    partial = v["controls"][loss]["partial_given_depth"]
    failed = []
    if rel is None:
        failed.append("the seed noise is not measured")
    elif rel < RELIABLE:
        failed.append("the layers' order by the primary loss is within the seed noise")
    if partial["rho"] is None or not (partial["rho"] < 0 and partial["p"] < ALPHA):
        failed.append("it does not hold beyond depth (partial rho given depth not significant)")
    by_share = v["controls"][loss].get("partial_given_share")
    if v.get("protocol") == "diffusion" and by_share is not None and not (
            by_share["rho"] is not None and by_share["rho"] < 0 and by_share["p"] < ALPHA):
        failed.append("it does not hold beyond the massive channels (partial rho given their share not significant)")
    return ("robustly supported" if not failed else "supported, but " + " and ".join(failed)) + provisional


def lookup_line(c: dict) -> str:
    """What a passing primary test means beside the token lookup (amendment 12): whether the score
    also ranks the layers' per-token tables, and whether it ranks what context adds."""
    table, share = c["score_vs_lookup"], c["relative_to_lookup"]
    on_table = table["rho"] < 0 and table["p"] < ALPHA
    on_share = share["rho"] < 0 and share["p"] < ALPHA
    if on_share:
        return (f"Beyond the token lookup: the score also predicts the share of the lookup's loss the bridges leave "
                f"(p {share['p']:.2g}), so it ranks what context adds, not only how much of a layer is a per-token table.")
    if on_table:
        return (f"Beyond the token lookup: the score predicts the lookup's own loss (p {table['p']:.2g}) but not the "
                f"share of it the bridges leave (p {share['p']:.2g}): it ranks how much of each layer is a per-token "
                "table, which needs no bridge, not how hard its context is to reconstruct.")
    return (f"Beyond the token lookup: the score predicts neither the lookup's own loss (p {table['p']:.2g}) nor the "
            f"share of it the bridges leave (p {share['p']:.2g}) on its own.")


CEILING = "the same network trained as the plain clean regression, one seed"  # sweep --ceiling


def ceiling_gap_line(v: dict) -> str | None:
    """How far below (or above) the bridges' seed-mean primary loss the ceiling control is at each
    compared layer: what training on the noisy conditions (and sampling, where the bridges sample
    in more than one step) costs the clean score. None without a ceiling at every compared layer."""
    loss = v.get("learned_loss", v["primary_loss"])  # the ceiling's nmse_dim, beside the same kind of loss
    rows = [r for r in v["layers"] if r["layer"] in v["compared_layers"]]
    if not rows or any(r.get("ceiling_nmse_dim") is None or not r.get(loss) for r in rows):
        return None
    gap = {r["layer"]: 100 * (1 - r["ceiling_nmse_dim"] / r[loss]) for r in rows}  # % below the bridges
    above = [layer for layer, g in gap.items() if g < 0]
    if above:
        return (f"The ceiling control ({CEILING}) is above the bridges' seed-mean {loss} at "
                f"layer{'s' if len(above) > 1 else ''} {', '.join(map(str, above))}: there the regression trained "
                "worse than the bridges, so it is no ceiling.")
    low, high = f"{min(gap.values()):.0f}", f"{max(gap.values()):.0f}"
    return (f"The ceiling control ({CEILING}) is {low if low == high else f'{low}–{high}'} % below the bridges' "
            f"seed-mean {loss} at every tested layer: what the bridges' noisy conditions cost their clean score.")


def secondary_line(v: dict, loss: str) -> str:
    """A secondary loss that passes its Holm-corrected test, beside its own controls: it cannot
    rescue a failed primary (method.md), on unconverged bridges it is no evidence either, and
    whether it follows depth or the massive channels as closely as the score says what else could
    drive it."""
    t, c = v["tests"][loss], v["controls"][loss]
    partial = c["partial_given_depth"]
    parts = [f"depth rho {c['depth']['rho']:.2f}"]
    if "channel_share" in c:
        parts.append(f"massive-channel share rho {c['channel_share']['rho']:.2f}")
    parts.append(f"partial rho(score, {loss} | depth) {partial['rho']:.2f} (Freedman-Lane p {partial['p']:.2g})"
                 if partial["rho"] is not None else f"partial rho(score, {loss} | depth) undefined")
    parts += [f"score {SCORE_VARIANTS[k]}: rho {c[k]['rho']:.2f}" for k in SCORE_VARIANTS if k in c]
    caveats = []
    if not v["convergence"]["converged"]:
        caveats.append("on unconverged losses, which is no evidence")
    if not v["tests"][v["primary_loss"]]["supports"]:
        caveats.append("and cannot rescue the primary (method.md)" if caveats else "which cannot rescue the primary "
                       "(method.md)")
    return (f"The secondary {loss} passes (rho {t['rho']:.2f}, Holm p {t['p_holm']:.2g})"
            + (", " + " ".join(caveats) if caveats else "") + f"; its own controls: {'; '.join(parts)}.")


def current_statement(v: dict) -> list[str]:
    """The verdict's lines in today's words: recomputed from a stored verdict's numbers (a sweep.json
    written before a line was added gets it); the stored lines where there was no test, or where
    the verdict predates a field today's lines need."""
    if "tests" not in v:
        return v.get("statement", [])
    try:
        return statement(v)
    except KeyError:  # e.g. no "convergence" (before 2026-12-01): its own lines, as it wrote them
        return v.get("statement", [])


def controls_line(c: dict, loss: str) -> str:
    """The primary loss's controls in one line: depth, the partial rhos, the massive channels,
    the other scores, the token lookup and the ceiling."""
    partial = c["partial_given_depth"]
    parts = [f"depth rho(layer, {loss}) = {c['depth']['rho']:.2f} (two-sided p {c['depth']['p']:.2g})",
             f"partial rho(score, {loss} | depth) = {partial['rho']:.2f} (Freedman-Lane one-sided p {partial['p']:.2g})"
             if partial["rho"] is not None else
             f"partial rho(score, {loss} | depth) undefined: the ranks of one follow depth exactly"]
    if "channel_share" in c:
        parts.append(f"rho(massive-channel share, {loss}) = {c['channel_share']['rho']:.2f} "
                     f"(two-sided p {c['channel_share']['p']:.2g})")
    if (by_share := c.get("partial_given_share")) is not None:
        parts.append(f"partial rho(score, {loss} | massive-channel share) = {by_share['rho']:.2f} "
                     f"(Freedman-Lane one-sided p {by_share['p']:.2g})" if by_share["rho"] is not None else
                     f"partial rho(score, {loss} | massive-channel share) undefined")
    parts += [f"score {SCORE_VARIANTS[k]}: rho {c[k]['rho']:.2f} (p {c[k]['p']:.2g})" for k in SCORE_VARIANTS if k in c]
    if "lookup" in c:
        parts += [f"rho(token lookup's {loss}, {loss}) = {c['lookup']['rho']:.2f} (two-sided p {c['lookup']['p']:.2g})",
                  f"the same test on the token lookup's {loss}, no bridge trained: rho {c['score_vs_lookup']['rho']:.2f} "
                  f"(p {c['score_vs_lookup']['p']:.2g})",
                  f"on {loss} / lookup's (what context adds): rho {c['relative_to_lookup']['rho']:.2f} "
                  f"(p {c['relative_to_lookup']['p']:.2g})"]
    if "ceiling" in c:
        parts.append(f"rho(ceiling's {loss}, {loss}) = {c['ceiling']['rho']:.2f} (two-sided p {c['ceiling']['p']:.2g}: "
                     "whether the bridges order the layers as the same network trained as the plain clean "
                     "regression does)")
    return "Controls: " + "; ".join(parts) + "."


def statement(v: dict) -> list[str]:
    """The verdict in plain words, one line each: the bridges' convergence (first when they did
    not converge: then that is the verdict), the primary test, the secondary ones, the seed noise,
    the controls, and which layers can be told apart."""
    t, loss = v["tests"], v["primary_loss"]
    p = t[loss]
    layers = v["compared_layers"]
    span = f"layers {layers[0]}–{layers[-1]}" if layers == list(range(layers[0], layers[-1] + 1)) else \
        f"layers {', '.join(map(str, layers))}"
    why = "" if p["supports"] else (" (rho has the predicted sign but p >= 0.05)" if p["rho"] < 0
                                    else " (rho has the wrong sign)")
    if v["convergence"]["converged"]:
        result = "supports the claim" if p["supports"] else "does not support the claim" + why
    else:  # then the test speaks about the training, not the claim
        result = ("passes the test on unconverged losses, which is no evidence for the claim" if p["supports"] else
                  f"fails the test{why} on unconverged losses, which is no evidence against the claim")
    counts = sorted({r["seeds"] for r in v["layers"] if r["layer"] in layers})
    seeds = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    lines = [f"Primary test (fixed in advance): one-sided Spearman rho(score, seed-mean {loss}) over {span} "
             f"(n = {p['n']}, {seeds} seed{'s' if seeds != '1' else ''} each) = "
             f"{p['rho']:.2f}, permutation p = {p['p']:.3g}: this run {result}. Outcome: {v['outcome']}."]
    # converged: its line follows the test; not converged: it is the verdict, so it comes first
    convergence = convergence_line(v["convergence"])
    lines = lines + [convergence] if v["convergence"]["converged"] else [convergence] + lines
    family = v.get("secondary_losses", SECONDARY)
    secondary = [f"{k} {t[k]['rho']:.2f} (Holm p {t[k]['p_holm']:.2g})" for k in family]
    lines.append(f"Secondary losses, rho with Holm-corrected one-sided p: {'; '.join(secondary)}.")
    rel = v["reliability"].get(loss)
    if rel is None:
        lines.append("Seed noise: one seed per layer, so it is not measured and no layer is ranked against another.")
    else:
        lines.append(f"Seed noise: the reliability of the seed-mean {loss} (ICC(1,k)) is {rel:.2f} (1: the seeds "
                     "agree and the layers differ; 0 or less: the seed means' differences between layers are no "
                     "larger than seed noise would make them)"
                     + ("." if rel >= 0.5 else "; below 0.5 the layers' order by this loss is mostly noise."))
    c = v["controls"].get(loss, {})
    lines.append(controls_line(c, loss))

    if line := ceiling_gap_line(v):
        lines.append(line)
    if "lookup" in c and p["supports"] and v["convergence"]["converged"]:
        lines.append(lookup_line(c))
    lines += [secondary_line(v, k) for k in family if t[k]["supports"]]
    if onset := v.get("after_onset"):
        lines.append(f"Sensitivity, chosen after seeing the regression sweep (not the registered test): over layers "
                     f"{onset['layers'][0]}–{onset['layers'][-1]}, from the massive channels' onset on, rho(score, "
                     f"{loss}) = {onset['rho']:.2f} (one-sided p {onset['p']:.2g}, n = {onset['n']}).")
    for role in ("oracle", "worst"):
        layer, tied = v[f"{role}_layer"], v[f"{role}_tied"]
        word = "easiest" if role == "oracle" else "hardest"
        lines.append(f"The {word} layer by {loss} is {layer}" + (
            f", but it cannot be told apart from layer{'s' if len(tied) > 1 else ''} {', '.join(map(str, tied))} "
            "within the seed noise." if tied else ", clear of every other layer by more than the seed noise."))
    lines.append(f"The geometry chose layer {v['chosen_layer']} among these.")
    if "ranking_weights" in v:
        used = v["ranking_weights"]
        lines.append(f"The ranking used other weights ({', '.join(f'{w:g}' for w in used['weights'])}"
                     f"{', logs' if used['log'] else ''}); the test ignores them and uses the registered score "
                     f"(weights {', '.join(f'{w:g}' for w in REGISTERED_WEIGHTS)}"
                     f"{', logs' if REGISTERED_LOG else ', no logs'}).")
    if v["capped"]:
        lines.append(f"{len(v['capped'])} of the tested bridges reached the step cap before their plateau: their "
                     "losses are set by the budget as much as by the layer.")
    return lines
