"""The sweep's verdict in numbers: does the geometry score predict how hard a layer's bridge is to train?

Its sentences are geoprobe/report/verdict_text.py's; `sweep_verdict` joins the two in sweep.json's form.

The test is fixed before any number (docs/method.md, "The sweep verdict"):

* compared layers: every swept layer but the source (layer 0, whose clean source *is* its
  state, so its loss is ~0 by construction); the score is z-scored over the compared layers;
* primary: one-sided Spearman rho(score, seed mean of the primary loss) < 0, permutation p, alpha
  0.05. The primary loss is the protocol's (`PROTOCOLS`, by the rows' bridge_kind): a regression
  bridge's nmse_dim, or a diffusion bridge's validation objective (amendment 13). nmse_dim
  standardises each channel by its own variance, so the few massive channels that carry most of a
  layer's variance (and also drive the score) do not decide it; delta_ce is not the primary loss
  because a bidirectional bridge sees the token each position must predict;
* the score is the registered one, weights (1, 1, 1) without logs, whatever weights `geoprobe
  rank` was given: a score tuned after the fact is not the score the test was registered for;
* secondary: the same test for the protocol's four other losses (a regression's nmse, delta_ce,
  nmse_noisy and objective; a diffusion bridge's posterior-mean nmse_dim_1step, its K-step
  sample's nmse_dim, delta_ce and nmse_noisy), Holm-corrected over exactly those four (a row
  without one is an error, not a smaller family);
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
  and on loss / lookup (amendment 12), the lookup's loss of the primary's own kind (a diffusion
  bridge's: the untrained bridge's objective); for a diffusion bridge's objective also
  rho(objective, nmse_dim_1step) and the test on the objective less its tau = 0 part (amendment 14);
* the sensitivity over the layers from the massive channels' onset on, with rho(score, depth) there
  (amendments 13 and 14): reported, never tested;
* the outcome: "inconclusive: ..." (the bridges did not converge; for a diffusion sweep also a
  tested layer none of whose bridges stopped by its plateau), "robustly supported" (primary
  passes, reliability >= 0.5, partial rho given depth < 0 with p < 0.05, and for a diffusion sweep
  the partial rho given the massive-channel share too: a run without a share fails it, and where
  |rho(score, share)| >= INSEPARABLE a failed one reads "cannot be separated from the massive
  channels"), "supported, but ..." (primary passes, a robustness condition fails), "not
  supported"; with one seed of a tested layer the outcome is provisional.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from scipy import stats

from geoprobe.metrics.correlation import holm, partial_spearman_test, reliability, spearman_with_uncertainty
from geoprobe.report import verdict_text
from geoprobe.report.verdict_text import SCORE_VARIANTS

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
# every loss a sweep's rows may carry, for the per-layer table: with a diffusion bridge's objective at
# tau = 0 alone (its posterior mean's part) and the untrained bridge's objective, the lookup's own
# (amendment 14; both per seed, since the untrained bridge's token table is drawn from its seed)
ALL_LOSSES = (*LOSSES, "nmse_dim_1step", "crps_dim", "objective_tau0", "control_lookup_objective")
# read beside the objective (its difference, its lookup control): a layer's mean only over all its seeds
EVERY_SEED = ("objective_tau0", "control_lookup_objective")
# each primary loss's counterpart for the token lookup, so that the lookup controls compare like with like
LOOKUP_OF = {"nmse_dim": "control_lookup_nmse_dim", "objective": "control_lookup_objective"}
ALPHA = 0.05
# the fewest compared layers whose one-sided permutation test can reach ALPHA: its smallest
# possible p is 1/n! (the one ordering of n distinct values that agrees perfectly)
MIN_LAYERS = next(n for n in range(1, 10) if 1 / math.factorial(n) < ALPHA)
# per-layer controls a sweep's rows carry (geoprobe.bridges.controls.layer_controls, sweep --ceiling), shown beside the losses
LAYER_CONTROLS = ("control_mean_nmse_dim", "control_lookup_nmse_dim", "control_ridge_nmse_dim",
                  "control_lookup_ridge_nmse_dim", "ceiling_nmse_dim")
RELIABLE = 0.5  # below this reliability of the seed means the layers' order is mostly seed noise
# amendment 14: a score whose |rho| with the massive-channel share is at least this (or with depth over the
# sensitivity's layers, above it) cannot be separated from it
INSEPARABLE = 0.9
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
# the rule's numbers that the verdict's sentences quote (geoprobe/report/verdict_text.py)
RULES = verdict_text.Rules(alpha=ALPHA, lookup_margin=LOOKUP_MARGIN, converged_share=CONVERGED_SHARE,
                           min_layers=MIN_LAYERS, secondary=SECONDARY, registered_weights=REGISTERED_WEIGHTS,
                           registered_log=REGISTERED_LOG, source_layers=SOURCE_LAYERS, inseparable=INSEPARABLE)


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
            if loss in EVERY_SEED and len(values) < len(mine):  # a difference with another loss needs the same seeds
                values = values[:0]
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

@dataclass
class Verdict:
    """A sweep's verdict in numbers: the protocol, the layers, the tests, the seed reliability and
    the controls. A field left None is absent from its JSON form (`as_dict`), except `after_onset`,
    which a tested verdict keeps as null."""

    protocol: str
    primary_loss: str
    secondary_losses: list[str]
    learned_loss: str
    alpha: float
    compared_layers: list[int]
    source_layers: list[int]
    seeds: list[int]
    layers: list[dict]
    tested_seeds: int  # the seeds behind each tested seed mean (layer 0 may have more)
    registered_score: dict
    convergence: dict
    ranking_weights: dict | None = None  # `geoprobe rank`'s, where they are not the registered ones
    chosen_layer: int | None = None  # the geometry's choice, the easiest and the hardest by the primary loss
    oracle_layer: int | None = None
    worst_layer: int | None = None
    oracle_tied: list[int] | None = None
    worst_tied: list[int] | None = None
    tests: dict | None = None  # None: too few layers for a test
    reliability: dict | None = None
    controls: dict | None = None
    after_onset: dict | None = None
    onset: int | None = None  # the first compared layer whose massive-channel share is at least half the largest
    score_vs_share: dict | None = None
    capped: list | None = None
    outcome: str | None = None

    def as_dict(self) -> dict:
        """The JSON form (sweep.json's "verdict" without its statement), keys in field order."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None or (f.name == "after_onset" and self.tests is not None)}


def sweep_verdict(rows: list[dict], scores: dict[str, dict[int, float]], channel_share: dict[int, float],
                  include_source: bool = False, seed: int = 0, ranking_weights: dict | None = None) -> dict:
    """The verdict of a sweep in its JSON form, with its statement lines (`verdict_of` has the
    arguments)."""
    v = verdict_of(rows, scores, channel_share, include_source=include_source, seed=seed,
                   ranking_weights=ranking_weights)
    result = v.as_dict()
    result["statement"] = (statement(result) if v.tests is not None else
                           verdict_text.no_test_statement(len(v.compared_layers), v.convergence, RULES))
    return result


def verdict_of(rows: list[dict], scores: dict[str, dict[int, float]], channel_share: dict[int, float],
               include_source: bool = False, seed: int = 0, ranking_weights: dict | None = None) -> Verdict:
    """The verdict of a sweep, in numbers. `rows`: one per (layer, seed) with every loss, `stop` and
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
    v = Verdict(protocol=protocol, primary_loss=primary, secondary_losses=list(secondary), learned_loss=learned,
                alpha=ALPHA, compared_layers=layers, source_layers=sources,
                seeds=sorted({r.get("seed", 0) for r in rows}), layers=table,
                tested_seeds=min((r["seeds"] for r in compared), default=0),
                registered_score=registered,
                convergence=convergence(rows, layers, learned, every_layer=protocol == "diffusion"))
    if ranking_weights is not None and (list(ranking_weights["weights"]) != registered["weights"]
                                        or bool(ranking_weights["log"]) != REGISTERED_LOG):
        v.ranking_weights = {"weights": list(ranking_weights["weights"]), "log": bool(ranking_weights["log"])}
    # the layers the generation compares (the geometry's choice, the easiest and the hardest by
    # the primary loss): known with or without a test
    score = np.array([scores["score"][l] for l in layers])
    if compared:
        best = min(compared, key=lambda r: r[primary])["layer"]
        worst = max(compared, key=lambda r: r[primary])["layer"]
        v.chosen_layer, v.oracle_layer, v.worst_layer = int(layers[int(np.argmax(score))]), best, worst
        v.oracle_tied, v.worst_tied = tied_with(compared, primary, best), tied_with(compared, primary, worst)
    if len(compared) < MIN_LAYERS:
        return v
    v.tests = _tests(score, compared, primary, secondary, seed)
    v.reliability = {loss: reliability(_by_seed(rows, layers, loss)) for loss in v.tests}
    shares = shares_of(channel_share, layers)
    v.controls = _controls(compared, layers, score, scores, shares, list(v.tests), seed, primary=primary,
                           learned=learned)
    v.after_onset = after_onset(compared, layers, score, shares, primary, seed)
    v.onset = onset_of(layers, shares)
    if shares is not None:  # how closely the score itself follows the massive channels (no loss involved)
        v.score_vs_share = spearman_with_uncertainty(score, shares, seed=seed, interval=False)
    v.capped = sorted({(r["layer"], r.get("seed", 0)) for r in rows
                       if r.get("stop") == "cap" and r["layer"] in layers})
    v.outcome = outcome(v)
    return v


def shares_of(channel_share: dict, layers: list[int]) -> np.ndarray | None:
    """The compared layers' massive-channel shares, or None where the run has none to control for:
    a layer without a finite share (the scan recorded none), or one share for every layer (a
    constant has no ranks)."""
    values = [channel_share.get(l) for l in layers]
    if not values or any(v is None or not math.isfinite(v) for v in values):
        return None
    shares = np.array(values, dtype=float)
    return shares if np.ptp(shares) > 0 else None


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

def convergence(rows: list[dict], layers: list[int], judged_by: str = PRIMARY, every_layer: bool = False) -> dict:
    """Whether the tested bridges (the compared layers, every seed) converged: at least
    CONVERGED_SHARE of them stopped by their plateau, and each one's nmse_dim is below its layer's
    `learned_below` (LOOKUP_MARGIN times the token-identity lookup control's, or the lookup + ridge
    control's where that is closer to the lookup: `beats_lookup`). A bridge that cannot beat a table of per-token
    mean states has not learned its layer, so its loss measures training, not the layer. A row
    without the control (a sweep from before it was recorded) leaves convergence unestablished.
    `judged_by` is the loss held against the lookup: nmse_dim, or a diffusion bridge's posterior mean's.
    `every_layer` (a diffusion sweep, amendment 14) also needs a bridge stopped by its plateau at every
    tested layer: a layer none of whose bridges reached its plateau is ranked by how far training got."""
    tested = [r for r in rows if r["layer"] in layers]
    plateau = sum(r.get("stop") == "plateau" for r in tested)
    unstopped = sorted({r["layer"] for r in tested} - {r["layer"] for r in tested if r.get("stop") == "plateau"})
    share = plateau / len(tested) if tested else 0.0
    # the source layer (tested with --include-source) is its tokens' embedding: its lookup is exact
    # by construction, as is its bridge, so the lookup condition says nothing there
    learned = [r for r in tested if r["layer"] not in SOURCE_LAYERS]
    unknown = sorted({r["layer"] for r in learned if r.get("control_lookup_nmse_dim") is None})
    worse = sorted([r["layer"], r.get("seed", 0)] for r in learned if r.get("control_lookup_nmse_dim") is not None
                   and not beats_lookup(r[judged_by], r["control_lookup_nmse_dim"], r.get("control_lookup_ridge_nmse_dim")))
    reasons = verdict_text.convergence_reasons(plateau, len(tested), share, unknown,
                                               len(unknown) == len({r["layer"] for r in learned}), worse, RULES,
                                               unstopped=unstopped if every_layer else [])
    every = {"unstopped_layers": unstopped} if every_layer else {}
    return {"plateau": plateau, "tested": len(tested), "share": share, "needed": CONVERGED_SHARE, "learned": judged_by,
            "worse_than_lookup": worse, **every, "converged": not reasons, "reasons": reasons}


def _by_seed(rows: list[dict], layers: list[int], loss: str):
    """(layers, seeds) matrix of a loss, over the seeds every compared layer has."""
    seeds = sorted(set.intersection(*({r.get("seed", 0) for r in rows if r["layer"] == l} for l in layers)))
    value = {(r["layer"], r.get("seed", 0)): r[loss] for r in rows}
    return [[value[l, s] for s in seeds] for l in layers]


def _controls(compared, layers, score, scores, share, losses, seed, *, primary: str = PRIMARY,
              learned: str = PRIMARY) -> dict:
    """Every loss's controls (the module's docstring); `share`: the compared layers' massive-channel
    shares (`shares_of`; None: no share controls); the ceiling's rho sits with the `learned` loss
    (the posterior mean's nmse_dim for a diffusion bridge, the primary for a regression)."""
    depth = np.array(layers, dtype=float)
    two = dict(seed=seed, interval=False)
    one = dict(seed=seed, alternative="less", interval=False)
    controls = {}
    for loss in losses:
        y = [r[loss] for r in compared]
        c = {"depth": spearman_with_uncertainty(depth, y, **two),
             "partial_given_depth": partial_spearman_test(score, y, depth, seed=seed)}
        if share is not None:
            c["channel_share"] = spearman_with_uncertainty(share, y, **two)
            c["partial_given_share"] = partial_spearman_test(score, y, share, seed=seed)
        for name in SCORE_VARIANTS:
            if name in scores:
                c[name] = spearman_with_uncertainty([scores[name][l] for l in layers], y, **one)
        controls[loss] = c
    controls[primary].update(_lookup_controls(compared, score, one, two, primary))
    controls[primary].update(_posterior_controls(compared, score, one, two, primary))
    ceiling = [r.get("ceiling_nmse_dim") for r in compared]
    if all(v is not None for v in ceiling) and np.ptp(ceiling) > 0 and learned in controls:  # every layer's, not all equal
        # beside the same kind of loss (amendment 13): the bridges' clean one-step nmse_dim, not a diffusion objective
        controls[learned]["ceiling"] = spearman_with_uncertainty(ceiling, [r[learned] for r in compared], **two)
    return controls


def onset_of(layers: list[int], share) -> int | None:
    """The massive channels' onset: the first of `layers` whose massive-channel share is at least
    half the largest over them (None: no share recorded, or none above zero)."""
    top = 0.0 if share is None else float(np.max(share))
    return next((l for l, x in zip(layers, share) if x >= top / 2), None) if top > 0 else None


def after_onset(compared, layers, score, share, primary: str, seed) -> dict | None:
    """The primary test over the layers from the massive channels' onset on (the first compared
    layer whose massive-channel share is at least half the largest over the compared layers): a
    sensitivity analysis, chosen after the regression sweep's page was seen (method.md, amendment
    13), never the registered test. The score keeps its z-scores over every compared layer. Beside
    it, `score_vs_depth`: rho(score, depth) over the same layers, two-sided (amendment 14: where the
    score falls with depth almost strictly, any loss that rises with depth passes this test). None
    where the onset is the first compared layer, fewer than MIN_LAYERS layers follow it, or `share`
    (`shares_of`) is None."""
    onset = onset_of(layers, share)
    kept = [i for i, l in enumerate(layers) if onset is not None and l >= onset]
    if not MIN_LAYERS <= len(kept) < len(layers):
        return None
    mine = np.asarray(score)[kept]
    test = spearman_with_uncertainty(mine, [compared[i][primary] for i in kept], seed=seed,
                                     alternative="less", interval=False)
    depth = ({"score_vs_depth": spearman_with_uncertainty(mine, [layers[i] for i in kept], seed=seed, interval=False)}
             if np.ptp(mine) > 0 else {})
    return {"layers": [layers[i] for i in kept], **test, **depth}


def _lookup_controls(compared, score, one: dict, two: dict, primary: str = PRIMARY) -> dict:
    """Against the token lookup (method.md, amendment 12): every bridge starts at its layer's
    lookup, so its nmse_dim carries the lookup's, and a score that ranks the layers' lookups ranks
    their bridges with no bridge trained. Reported, not tested: rho(lookup, loss) (how much of the
    bridges' order the closed-form table gives), the registered test on the lookup itself, and on
    the share of the lookup's loss the bridge leaves (nmse_dim / lookup: what context adds). The
    lookup's loss is the primary's own kind (`LOOKUP_OF`): for a diffusion bridge's objective, the
    untrained bridge's objective (amendment 14). Empty unless every compared layer has a positive
    lookup control and they are not all equal (a constant has no ranks)."""
    lookup = [r.get(LOOKUP_OF.get(primary, "")) for r in compared]
    if any(v is None or not v > 0 for v in lookup) or np.ptp(lookup) == 0:
        return {}
    y = np.array([r[primary] for r in compared])
    return {"lookup": spearman_with_uncertainty(lookup, y, **two),
            "score_vs_lookup": spearman_with_uncertainty(score, lookup, **one),
            "relative_to_lookup": spearman_with_uncertainty(score, y / np.array(lookup), **one)}

def _posterior_controls(compared, score, one: dict, two: dict, primary: str) -> dict:
    """What a diffusion bridge's objective holds beyond its posterior mean (amendment 14), reported,
    not tested: rho(objective, nmse_dim_1step) over the layers, two-sided, and the registered test
    on the objective less its posterior-mean part (objective_tau0: the objective with every tau at
    0), what the diffusion objective adds beyond a regression's loss. Empty for another primary;
    the second needs objective_tau0 at every compared layer."""
    if primary != "objective":
        return {}
    y = np.array([r[primary] for r in compared])
    out = {}
    mean = [r.get("nmse_dim_1step") for r in compared]
    if all(v is not None for v in mean) and np.ptp(mean) > 0 and np.ptp(y) > 0:  # a constant has no ranks
        out["posterior_mean"] = spearman_with_uncertainty(y, mean, **two)
    at_zero = [r.get("objective_tau0") for r in compared]
    if all(v is not None for v in at_zero) and np.ptp(y - np.array(at_zero)) > 0:
        out["beyond_posterior_mean"] = spearman_with_uncertainty(score, y - np.array(at_zero), **one)
    return out


def outcome(v: Verdict) -> str:
    """docs/method.md's "What would count", as one phrase (`judge`'s reading in words)."""
    kind, failed = judge(v)
    return verdict_text.outcome_phrase(kind, v.tested_seeds, v.convergence["reasons"], failed)


def judge(v: Verdict) -> tuple[str, list[str]]:
    """The outcome's kind ("inconclusive", "not supported", "supported") and the robustness
    conditions a supported one fails (keys of verdict_text.ROBUSTNESS). Unconverged bridges make
    it inconclusive whatever the test says: their losses measure the training, not the layers."""
    if not v.convergence["converged"]:
        return "inconclusive", []
    loss = v.primary_loss
    if not v.tests[loss]["supports"]:
        return "not supported", []
    rel = v.reliability.get(loss)
    partial = v.controls[loss]["partial_given_depth"]
    failed = []
    if rel is None:
        failed.append("noise_unmeasured")
    elif rel < RELIABLE:
        failed.append("within_noise")
    if partial["rho"] is None or not (partial["rho"] < 0 and partial["p"] < ALPHA):
        failed.append("depth")
    if v.protocol == "diffusion":  # amendment 13: robust support needs the partial given the share too
        failed += _share_condition(v.controls[loss].get("partial_given_share"), v.score_vs_share)
    return "supported", failed


def _share_condition(by_share: dict | None, score_vs_share: dict | None) -> list[str]:
    """The partial test given the massive-channel share, as a failed condition or none: a run
    without a share fails it (amendment 14), and where the score itself follows the share
    (|rho| >= INSEPARABLE) a failed partial means the two cannot be separated, not that the score
    does not hold beyond them."""
    if by_share is None:
        return ["share_unmeasured"]
    if by_share["rho"] is not None and by_share["rho"] < 0 and by_share["p"] < ALPHA:
        return []
    follows = score_vs_share is not None and abs(score_vs_share["rho"]) >= INSEPARABLE
    return ["share_inseparable" if follows else "share"]


def statement(v: dict) -> list[str]:
    """A tested verdict's lines in plain words (geoprobe/report/verdict_text.py), under RULES."""
    return verdict_text.statement(v, RULES)


def current_statement(v: dict) -> list[str]:
    """A stored verdict's lines in today's words, recomputed from its numbers (verdict_text)."""
    return verdict_text.current_statement(v, RULES)


def lookup_line(c: dict) -> str:
    """The primary test's line beside the token lookup (verdict_text.lookup_line at ALPHA)."""
    return verdict_text.lookup_line(c, ALPHA)


def bridge_lines(m: dict) -> list[str]:
    """One bridge's metrics.json in plain words (verdict_text.bridge_lines), with its learned bar
    (held against the loss `beats_lookup` reads: a diffusion bridge's posterior mean's nmse_dim)."""
    lookup = m.get("control_lookup_nmse_dim")
    bar = None if lookup is None else learned_below(lookup, m.get("control_lookup_ridge_nmse_dim"))
    return verdict_text.bridge_lines(m, RULES, bar)
