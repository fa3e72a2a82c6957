"""The sweep verdict in words: its statement lines, its convergence reasons and outcome phrase,
and one bridge's own lines.

The numbers come from geoprobe/verdict.py (a verdict's JSON form, or one bridge's metrics.json);
the registered rule's constants that the sentences quote arrive as a `Rules`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# the other ways of computing the score, each z-scored over the compared layers unless it says so
SCORE_VARIANTS = {"score_all_layers": "z-scored over every scanned layer (as the ranking does)",
                  "score_normalize_none": "--normalize none", "score_channels_excluded": "massive channels excluded"}
# the primary loss's controls against the token lookup (amendment 12), as the sweep page labels them
LOOKUP_CONTROLS = {"lookup": "ρ(lookup's loss)", "score_vs_lookup": "ρ, score vs the lookup's loss",
                   "relative_to_lookup": "ρ, score vs loss / lookup's"}
# ... and against the ceiling control (sweep --ceiling): whether the bridges order the layers as the
# plain clean regression of the same network does
CEILING_CONTROL = {"ceiling": "ρ(ceiling's nmse_dim)"}  # in the row of the bridges' clean one-step loss
# a diffusion bridge's objective beside its posterior mean (amendment 14)
POSTERIOR_CONTROLS = {"posterior_mean": "ρ(nmse_dim 1 step)", "beyond_posterior_mean": "ρ, score vs objective − its τ = 0 part"}
CEILING = "the same network trained as the plain clean regression, one seed"  # sweep --ceiling
# why a supported outcome is not robust, by the failed condition's name (geoprobe.verdict.robustness)
ROBUSTNESS = {"noise_unmeasured": "the seed noise is not measured",
              "within_noise": "the layers' order by the primary loss is within the seed noise",
              "depth": "it does not hold beyond depth (partial rho given depth not significant, or undefined where "
                       "the ranks of the score or the loss follow depth exactly)",
              "share": "it does not hold beyond the massive channels (partial rho given their share not significant)",
              "share_inseparable": "it cannot be separated from the massive channels (the score follows their share, "
                                   "and the partial rho given the share does not pass)",
              "share_unmeasured": "the massive-channel share is not measured over the tested layers (none recorded, or "
                                  "the same at every layer), so the partial rho given it, which robust support needs, "
                                  "cannot be computed"}


@dataclass(frozen=True)
class Rules:
    """The registered rule's numbers that the sentences quote.

    Args:
        alpha: the tests' significance level.
        lookup_margin: the share of the token lookup's loss a learned bridge stays under.
        converged_share: the share of the tested bridges that must stop by their plateau.
        min_layers: the fewest compared layers a test can reach alpha with.
        secondary: the default Holm family (a verdict without `secondary_losses`).
        registered_weights: the registered score's weights.
        registered_log: whether the registered score takes logs.
        source_layers: the layers whose clean source is their state.
        inseparable: the |rho| of the score with depth (above it) or the massive-channel share (at
            or above it) from which the two cannot be separated.
    """

    alpha: float
    lookup_margin: float
    converged_share: float
    min_layers: int
    secondary: tuple
    registered_weights: tuple
    registered_log: bool
    source_layers: tuple
    inseparable: float


def no_test_statement(compared: int, convergence: dict, rules: Rules) -> list[str]:
    """The lines of a verdict over too few layers for a test: why, and the convergence line."""
    smallest = 1 / math.factorial(compared)
    return [f"only {compared} layers compared: no test (over {compared} layers the "
            f"one-sided permutation p cannot go below 1/{compared}! = {smallest:.2g}, so it "
            f"cannot reach {rules.alpha}; at least {rules.min_layers} layers are needed)",
            convergence_line(convergence, rules)]


def convergence_reasons(plateau: int, tested: int, share: float, unknown: list[int], all_unknown: bool,
                        worse: list, rules: Rules, *, unstopped: list[int] = ()) -> list[str]:
    """Why the tested bridges did not converge, one phrase a failed condition (none: converged).

    Args:
        plateau: how many tested bridges stopped by their plateau, of `tested`, a share `share`.
        unknown: the layers without a lookup control; `all_unknown`: whether that is every layer.
        worse: [layer, seed] of each bridge that does not beat its token lookup.
        unstopped: the tested layers none of whose bridges stopped by its plateau, where every
            layer needs one (a diffusion sweep, amendment 14).
    """
    reasons = []
    if share < rules.converged_share - 1e-12:  # the tolerance keeps e.g. 12 of 15 on the passing side
        reasons.append(f"{plateau} of {tested} tested bridges stopped by their plateau, "
                       f"{rules.converged_share * 100:.0f} % needed")
    if unstopped:
        reasons.append(f"layer{'s' if len(unstopped) > 1 else ''} {', '.join(map(str, unstopped))} "
                       f"ha{'ve' if len(unstopped) > 1 else 's'} no bridge stopped by its plateau (every tested layer "
                       "needs one)")
    if unknown:
        reasons.append("no lookup control recorded" + (
            "" if all_unknown else f" for layer{'s' if len(unknown) > 1 else ''} "
                                   f"{', '.join(map(str, unknown))}"))
    if worse:
        seeds = {l: [s for m, s in worse if m == l] for l in sorted({l for l, _ in worse})}
        named = ", ".join(f"{l} (seed{'s' if len(s) > 1 else ''} {', '.join(map(str, s))})" for l, s in seeds.items())
        reasons.append(f"layer{'s' if len(seeds) > 1 else ''} {named} do{'es' if len(seeds) == 1 else ''} not beat "
                       f"the token lookup by {(1 - rules.lookup_margin) * 100:.0f} % (or the lookup + ridge control, "
                       "where that is closer to the lookup; a diffusion bridge by its posterior mean)")
    return reasons


def outcome_phrase(kind: str, tested_seeds: int, reasons: list[str], failed: list[str]) -> str:
    """docs/method.md's "What would count", as one phrase.

    Args:
        kind: "inconclusive", "not supported" or "supported".
        tested_seeds: the seeds behind each tested seed mean (under 2: provisional).
        reasons: why the bridges did not converge (inconclusive only).
        failed: the robustness conditions a supported outcome fails (keys of ROBUSTNESS).
    """
    # the seeds of the tested layers: the source may have more, and is not in the test
    provisional = (" (provisional: one seed per tested layer, the protocol asks for at least two)"
                   if tested_seeds < 2 else "")
    if kind == "inconclusive":
        return f"inconclusive: the bridges did not converge ({'; '.join(reasons)})" + provisional
    if kind == "not supported":
        return "not supported" + provisional
    return ("robustly supported" if not failed else
            "supported, but " + " and ".join(ROBUSTNESS[f] for f in failed)) + provisional


def bridge_lines(m: dict, rules: Rules, bar: float | None) -> list[str]:
    """What one bridge's metrics.json says of its training, in plain words: how it stopped, whether
    it ever improved on its start, and whether it learned more than its token lookup.

    Args:
        bar: the nmse_dim it had to get below to count as learned (None: no lookup recorded).
    """
    stop, steps, best = m.get("stop"), m.get("steps_run"), m.get("best_step")
    if stop is None or steps is None:  # a record from before these fields: nothing to say
        return []
    rule = m.get("plateau_rule") or {}  # the rule's last reading (records since issue 62)
    mean = m.get("bridge_kind") == "diffusion"  # its rule watched the objective, guarded by the posterior mean
    curve = "objective" if mean else "nmse_dim"
    if stop == "plateau":
        lines = [f"Stopped by its plateau at step {steps:,}"
                 + (f", with its best weights (step {best:,})" if best is not None else "")
                 + (f": its stopping-split {curve} improved {rule['gain']:.1%} from step {rule['window'][0]:,} to "
                    f"{rule['window'][1]:,}" + guard_words(rule) + f", under the {rule['needs']:.0%} the rule asks."
                    if "gain" in rule else ".")]
    elif stop == "cap":
        lines = [f"Reached its step cap ({steps:,}) before its plateau: unconverged, so its scores say how far "
                 "training got, not how hard the layer is."]
        if rule:
            lines.append(cap_advice(rule, steps, curve))
    elif stop == "budget":
        lines = [f"Trained exactly {steps:,} steps (--until steps)."]
    else:
        lines = [f"Stopped: {stop}."]
    if stop == "plateau" and best == 0:
        lines.append("It never improved on its start (best step 0): these are its initial weights"
                     + (". At the source layer the clean score the plateau rule watches is the token lookup's "
                        "before any training, so the rule cannot see it learn the noisy conditions sampling needs: "
                        "train it with --until steps." if m.get("layer") in rules.source_layers else "."))
    learned, lookup = m.get("beats_lookup"), m.get("control_lookup_nmse_dim")
    # the loss beats_lookup reads: a diffusion bridge's posterior mean, since a sample's error includes the spread
    if learned is not None and lookup is not None:
        lines.append(("posterior-mean (1-step) " if mean else "")
                     + f"nmse_dim {m['nmse_dim_1step' if mean else 'nmse_dim']:.4f} against its token lookup's {lookup:.4f}: "
                     + ("it learned more than a table of per-token means." if learned else
                        f"not below {bar:.4f}, the bar for having learned ({100 * (1 - rules.lookup_margin):.0f} % "
                        "under the lookup, or the lookup + ridge control where that is closer): it learned little "
                        "beyond a table of per-token means."))
    if m.get("objective") is not None and m.get("control_lookup_objective") is not None:
        lines.append(f"Its objective {m['objective']:.4f} against the token lookup's own {m['control_lookup_objective']:.4f} "
                     "(the untrained bridge's, whose update is zero).")
    return lines


def guard_words(rule: dict) -> str:
    """The guard's reading beside the watched curve's (a diffusion bridge's posterior-mean nmse_dim,
    which must be flat too): "" where the rule had no guard."""
    gain = rule.get("guard_gain")
    return "" if gain is None else f" and its posterior-mean nmse_dim {gain:.1%}"


def cap_advice(rule: dict, steps: int, curve: str = "nmse_dim") -> str:
    """Why a bridge under the plateau rule ran to its cap, and what to run: the curve (or a
    diffusion bridge's guard, its posterior mean) was still falling, or the run was too short for
    the rule to judge it; a larger --steps resumes it."""
    if "gain" in rule:
        needs, gains = rule["needs"], [("its stopping-split " + curve, rule["gain"])]
        if rule.get("guard_gain") is not None:
            gains.append(("its posterior-mean nmse_dim", rule["guard_gain"]))
        falling = [f"{name} {gain:.1%}" for name, gain in gains if gain >= needs] or [
            f"{name} {gain:.1%}" for name, gain in gains]
        why = (f"It was still improving: {' and '.join(falling)} from step {rule['window'][0]:,} to "
               f"{rule['window'][1]:,}, and the rule stops it only when each is under {needs:.0%}.")
        more = 4 * steps
    else:
        why = (f"The run was too short for the plateau rule to judge it: the rule judges a bridge from step "
               f"{rule['from_step']:,} on (its kept weights are an average over about {rule.get('ema_steps', 100):,} "
               "steps, which a shorter curve mostly shows catching up).")
        more = max(4 * steps, 2 * rule["from_step"])
    return f"{why} Rerun with a larger --steps (e.g. --steps {more}) to resume it from step {steps:,}."


def convergence_line(c: dict, rules: Rules) -> str:
    """The convergence facts in one plain line."""
    if c["converged"]:
        judged = " by its posterior mean" if c.get("learned") == "nmse_dim_1step" else ""
        return (f"Convergence: {c['plateau']} of {c['tested']} tested bridges stopped by their plateau "
                f"({c['needed'] * 100:.0f} % needed) and every one beats the token lookup at its layer{judged} by "
                f"{(1 - rules.lookup_margin) * 100:.0f} % (or the lookup + ridge control, where that is closer to "
                "the lookup).")
    return f"Inconclusive: the bridges did not converge — {'; '.join(c['reasons'])}; the test below says nothing " \
           "about the claim."


def lookup_line(c: dict, alpha: float) -> str:
    """What a passing primary test means beside the token lookup (amendment 12): whether the score
    also ranks the layers' per-token tables, and whether it ranks what context adds."""
    table, share = c["score_vs_lookup"], c["relative_to_lookup"]
    on_table = table["rho"] < 0 and table["p"] < alpha
    on_share = share["rho"] < 0 and share["p"] < alpha
    if on_share:
        return (f"Beyond the token lookup: the score also predicts the share of the lookup's loss the bridges leave "
                f"(p {share['p']:.2g}), so it ranks what context adds, not only how much of a layer is a per-token table.")
    if on_table:
        return (f"Beyond the token lookup: the score predicts the lookup's own loss (p {table['p']:.2g}) but not the "
                f"share of it the bridges leave (p {share['p']:.2g}): it ranks how much of each layer is a per-token "
                "table, which needs no bridge, not how hard its context is to reconstruct.")
    return (f"Beyond the token lookup: the score predicts neither the lookup's own loss (p {table['p']:.2g}) nor the "
            f"share of it the bridges leave (p {share['p']:.2g}) on its own.")


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


def controls_line(c: dict, loss: str, score_share: dict | None = None, inseparable: float = 1.0) -> str:
    """The primary loss's controls in one line: depth, the partial rhos, the massive channels,
    the other scores, the token lookup and the ceiling.

    Args:
        score_share: rho(score, massive-channel share) (the verdict's `score_vs_share`): where its
            |rho| is at least `inseparable`, the partial test given the share cannot separate the two.
    """
    partial = c["partial_given_depth"]
    parts = [f"depth rho(layer, {loss}) = {c['depth']['rho']:.2f} (two-sided p {c['depth']['p']:.2g})",
             f"partial rho(score, {loss} | depth) = {partial['rho']:.2f} (Freedman-Lane one-sided p {partial['p']:.2g})"
             if partial["rho"] is not None else
             f"partial rho(score, {loss} | depth) undefined: the ranks of one follow depth exactly"]
    if "channel_share" in c:
        parts.append(f"rho(massive-channel share, {loss}) = {c['channel_share']['rho']:.2f} "
                     f"(two-sided p {c['channel_share']['p']:.2g})")
    if (by_share := c.get("partial_given_share")) is not None:
        parts.append((f"partial rho(score, {loss} | massive-channel share) = {by_share['rho']:.2f} "
                      f"(Freedman-Lane one-sided p {by_share['p']:.2g})" if by_share["rho"] is not None else
                      f"partial rho(score, {loss} | massive-channel share) undefined")
                     + (f", and the score itself follows the share (rho {score_share['rho']:.2f}), so the two "
                        "cannot be separated" if score_share is not None and abs(score_share["rho"]) >= inseparable
                        else ""))
    parts += [f"score {SCORE_VARIANTS[k]}: rho {c[k]['rho']:.2f} (p {c[k]['p']:.2g})" for k in SCORE_VARIANTS if k in c]
    if "lookup" in c:
        parts += [f"rho(token lookup's {loss}, {loss}) = {c['lookup']['rho']:.2f} (two-sided p {c['lookup']['p']:.2g})",
                  f"the same test on the token lookup's {loss}, no bridge trained: rho {c['score_vs_lookup']['rho']:.2f} "
                  f"(p {c['score_vs_lookup']['p']:.2g})",
                  f"on {loss} / lookup's (what context adds): rho {c['relative_to_lookup']['rho']:.2f} "
                  f"(p {c['relative_to_lookup']['p']:.2g})"]
    if "ceiling" in c:
        parts.append(ceiling_rho(c["ceiling"], loss))
    return "Controls:" + "".join(f"\n  - {part}" for part in parts)


def ceiling_rho(rho: dict, loss: str) -> str:
    """rho(the ceiling control's nmse_dim, the bridges' `loss`): the ceiling is a clean regression,
    so it is ranked beside the bridges' clean one-step nmse_dim (a diffusion sweep's `learned` loss)."""
    return (f"rho(ceiling's nmse_dim, {loss}) = {rho['rho']:.2f} (two-sided p {rho['p']:.2g}: whether the bridges "
            "order the layers as the same network trained as the plain clean regression does)")


def posterior_line(c: dict) -> str | None:
    """What a diffusion bridge's objective holds beyond its posterior mean (amendment 14): how closely
    it follows the posterior mean's nmse_dim over the layers, and whether the score predicts the
    objective less its tau = 0 part. None without either."""
    parts = []
    if (mean := c.get("posterior_mean")) is not None:
        parts.append(f"rho(objective, nmse_dim_1step) over the tested layers = {mean['rho']:.2f} (two-sided p "
                     f"{mean['p']:.2g}: how much of the objective's order the posterior mean's error gives)")
    if (beyond := c.get("beyond_posterior_mean")) is not None:
        parts.append(f"the same test on the objective less its posterior-mean part (objective - objective_tau0, its "
                     f"tau > 0 terms: what the diffusion objective adds beyond a regression's loss): rho "
                     f"{beyond['rho']:.2f} (one-sided p {beyond['p']:.2g})")
    return ("Beyond the posterior mean (reported, not tested): " + "; ".join(parts) + ".") if parts else None


def current_statement(v: dict, rules: Rules) -> list[str]:
    """The verdict's lines in today's words: recomputed from a stored verdict's numbers (a sweep.json
    written before a line was added gets it); the stored lines where there was no test, or where
    the verdict predates a field today's lines need."""
    if "tests" not in v:
        return v.get("statement", [])
    try:
        return statement(v, rules)
    except KeyError:  # e.g. no "convergence" (older records): its own lines, as it wrote them
        return v.get("statement", [])


def statement(v: dict, rules: Rules) -> list[str]:
    """The verdict in plain words, one line each: the bridges' convergence (first when they did
    not converge: then that is the verdict), the primary test, the secondary ones, the seed noise,
    the controls, and which layers can be told apart."""
    t, loss = v["tests"], v["primary_loss"]
    p = t[loss]
    lines = _test_lines(v, rules)
    family = v.get("secondary_losses", rules.secondary)
    secondary = [f"{k} {t[k]['rho']:.2f} (Holm p {t[k]['p_holm']:.2g})" for k in family]
    lines.append(f"Secondary losses, rho with Holm-corrected one-sided p: {'; '.join(secondary)}.")
    rel = v["reliability"].get(loss)
    if rel is None:
        lines.append("Seed noise: one seed per layer, so it is not measured and no layer is ranked against another.")
    elif p.get("constant"):
        lines.append(f"Seed noise: the seed-mean {loss} is the same at every tested layer, so there is no order to "
                     "measure the seeds' agreement on.")
    else:
        lines.append(f"Seed noise: the reliability of the seed-mean {loss} (ICC(1,k)) is {rel:.2f} (1: the seeds "
                     "agree and the layers differ; 0 or less: the seed means' differences between layers are no "
                     "larger than seed noise would make them)"
                     + ("." if rel >= 0.5 else "; below 0.5 the layers' order by this loss is mostly noise."))
    c = v["controls"].get(loss, {})
    lines.append(controls_line(c, loss, v.get("score_vs_share"), rules.inseparable))
    learned = v.get("learned_loss", loss)
    if learned != loss and "ceiling" in v["controls"].get(learned, {}):  # a diffusion sweep's: beside its posterior mean
        lines.append(ceiling_rho(v["controls"][learned]["ceiling"], learned) + ".")
    if line := posterior_line(c):
        lines.append(line)

    if line := ceiling_gap_line(v):
        lines.append(line)
    if "lookup" in c and p["supports"] and v["convergence"]["converged"]:
        lines.append(lookup_line(c, rules.alpha))
    lines += [secondary_line(v, k) for k in family if t[k]["supports"]]
    return lines + _layer_lines(v, rules)


def _test_lines(v: dict, rules: Rules) -> list[str]:
    """The primary test's line and the convergence line, in the order the convergence asks."""
    t, loss = v["tests"], v["primary_loss"]
    p = t[loss]
    layers = v["compared_layers"]
    span = f"layers {layers[0]}–{layers[-1]}" if layers == list(range(layers[0], layers[-1] + 1)) else \
        f"layers {', '.join(map(str, layers))}"
    why = "" if p["supports"] else (" (rho is undefined: the loss is the same at every layer)" if p.get("constant")
                                    else " (rho has the predicted sign but p >= 0.05)" if p["rho"] < 0
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
    convergence = convergence_line(v["convergence"], rules)
    return lines + [convergence] if v["convergence"]["converged"] else [convergence] + lines


def depth_clause(depth: dict | None, rules: Rules) -> str:
    """rho(score, depth) over the sensitivity's layers, beside its test (amendment 14): where the
    score falls (or rises) with depth almost strictly, any loss that follows depth passes the test."""
    if depth is None:
        return ""
    return (f"; over the same layers rho(score, depth) = {depth['rho']:.2f}"
            + (": not separable from depth" if abs(depth["rho"]) > rules.inseparable else ""))


def _layer_lines(v: dict, rules: Rules) -> list[str]:
    """The closing lines: the sensitivity after the massive channels' onset, the easiest and hardest
    layers and their ties, the geometry's choice, other ranking weights, and the capped bridges."""
    loss = v["primary_loss"]
    lines = []
    if onset := v.get("after_onset"):
        lines.append(f"Sensitivity, chosen after seeing the regression sweep (not the registered test): over layers "
                     f"{onset['layers'][0]}–{onset['layers'][-1]}, from the massive channels' onset on, rho(score, "
                     f"{loss}) = {onset['rho']:.2f} (one-sided p {onset['p']:.2g}, n = {onset['n']})"
                     + depth_clause(onset.get("score_vs_depth"), rules) + ".")
    elif (first := v.get("onset")) is not None and v.get("tests") is not None:
        after = [l for l in v["compared_layers"] if l >= first]
        lines.append(f"No sensitivity after the massive channels' onset: it is layer {first}, " + (
            "the first tested layer, so it would repeat the primary test." if len(after) == len(v["compared_layers"])
            else f"and {len(after)} tested layers from it on are fewer than a test needs ({rules.min_layers})."))
    # a layer with an unconverged bridge (capped, or not below its lookup's bar) is said to be one
    unconverged = {l for l, _ in (v.get("capped") or [])} | {
        l for l, _ in (v.get("convergence") or {}).get("worse_than_lookup", [])}
    for role in ("oracle", "worst"):
        layer, tied = v[f"{role}_layer"], v[f"{role}_tied"]
        word = "easiest" if role == "oracle" else "hardest"
        lines.append(f"The {word} layer by {loss} is {layer}"
                     + (" (with an unconverged bridge)" if layer in unconverged else "") + (
            f", but it cannot be told apart from layer{'s' if len(tied) > 1 else ''} {', '.join(map(str, tied))} "
            "within the seed noise." if tied else ", clear of every other layer by more than the seed noise."))
    lines.append(f"The geometry chose layer {v['chosen_layer']} among these.")
    if "ranking_weights" in v:
        used = v["ranking_weights"]
        lines.append(f"The ranking used other weights ({', '.join(f'{w:g}' for w in used['weights'])}"
                     f"{', logs' if used['log'] else ''}); the test ignores them and uses the registered score "
                     f"(weights {', '.join(f'{w:g}' for w in rules.registered_weights)}"
                     f"{', logs' if rules.registered_log else ', no logs'}).")
    if v["capped"]:
        named = ", ".join(f"layer {layer} seed {seed}" for layer, seed in v["capped"])
        lines.append(f"{len(v['capped'])} of the tested bridges reached the step cap before their plateau ({named}): "
                     f"{'its loss is' if len(v['capped']) == 1 else 'their losses are'} set by the budget as much as "
                     "by the layer.")
    return lines
