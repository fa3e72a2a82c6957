"""The sweep's section of report.md: the verdict in plain words, the per-layer table (seed mean ±
sd of every loss), the tests and the controls."""

from __future__ import annotations

from geoprobe.report.verdict_text import CEILING_CONTROL, LOOKUP_CONTROLS, POSTERIOR_CONTROLS, SCORE_VARIANTS
from geoprobe.verdict import LAYER_CONTROLS, LOSSES, current_statement
from geoprobe.workflows.compare import markdown_table

# the per-layer table's columns beside the losses: the controls' nmse_dim and how the bridges stopped
CONTROL_HEADERS = {"control_mean_nmse_dim": "mean", "control_lookup_nmse_dim": "lookup",
                   "control_ridge_nmse_dim": "ridge",
                   "control_lookup_ridge_nmse_dim": "lookup+ridge", "ceiling_nmse_dim": "ceiling"}


def _pm(row: dict, loss: str) -> str:
    mean, sd = row.get(loss), row.get(f"{loss}_sd")
    if mean is None:
        return "—"
    return f"{mean:.4g} ± {sd:.2g}" if sd is not None else f"{mean:.4g}"


def _control(row: dict, key: str) -> str:
    """A control's nmse_dim; a ceiling that did not stop by its plateau says how it stopped (an
    unconverged regression is no ceiling)."""
    if row.get(key) is None:
        return "—"
    stop = row.get("ceiling_stop") if key == "ceiling_nmse_dim" else None
    return f"{row[key]:.4g}" + (f" ({stop})" if stop not in (None, "plateau") else "")


def layer_rows(verdict: dict) -> list[dict]:
    """The per-layer table for people: the source layers marked, losses as mean ± sd."""
    scores = verdict.get("scores", {}).get("score", {})
    rows = []
    for r in verdict["layers"]:
        source = r["layer"] in verdict["source_layers"]
        rows.append({"layer": r["layer"], "role": "source (not tested)" if source else "tested",
                     "score": "not tested" if source else f"{scores[str(r['layer'])]:.3g}", "seeds": r["seeds"],
                     **{loss: _pm(r, loss) for loss in (*LOSSES, "crps_dim")},
                     "nmse_dim 1 step": _pm(r, "nmse_dim_1step"),
                     # a diffusion bridge's objective at tau = 0 alone, and the untrained bridge's (the lookup's own)
                     "objective τ = 0": _pm(r, "objective_tau0"), "lookup objective": _pm(r, "control_lookup_objective"),
                     **{CONTROL_HEADERS[k]: _control(r, k) for k in LAYER_CONTROLS},
                     "plateau": "—" if r.get("plateau") is None else f"{r['plateau']}/{r['seeds']}",
                     "steps": "—" if r.get("steps_mean") is None else f"{r['steps_mean']:.0f}"})
    return rows


def layer_columns(rows: list[dict]) -> list[str]:
    """The per-layer table's columns: every loss, then the controls a sweep recorded (nmse_dim).
    A diffusion sweep's rows (they have crps_dim) lead with its objective, its tau = 0 part and the
    lookup's own objective where recorded, and its posterior mean."""
    controls = [h for h in CONTROL_HEADERS.values() if any(r[h] != "—" for r in rows)]
    if any(r.get("crps_dim", "—") != "—" for r in rows):
        beside = [h for h in ("objective τ = 0", "lookup objective") if any(r[h] != "—" for r in rows)]
        return ["layer", "role", "score", "seeds", "objective", *beside, "nmse_dim 1 step", "nmse_dim", "crps_dim",
                *controls, "plateau", "steps", "nmse", "delta_ce", "nmse_noisy"]
    return ["layer", "role", "score", "seeds", "nmse_dim", "nmse_dim 1 step", *controls, "plateau", "steps",
            *LOSSES[1:]]


def test_rows(verdict: dict) -> list[dict]:
    rows = []
    for loss, t in verdict.get("tests", {}).items():
        rows.append({"loss": loss + (" (primary)" if loss == verdict["primary_loss"] else ""), "rho": t["rho"],
                     "one-sided p": t["p"], "Holm p": t.get("p_holm"),
                     "95% CI": f"[{t['ci'][0]:.2f}, {t['ci'][1]:.2f}]" if t.get("ci") else None,
                     "reliability": verdict["reliability"].get(loss),
                     # an unconverged sweep's tests speak about its training, not the claim (a verdict from before
                     # the convergence criterion has no such key, and reads as it did)
                     "supports": ("yes" if t["supports"] else "no") if verdict.get("convergence", {}).get("converged", True)
                     else "not judged (unconverged)"})
    return rows


def control_rows(verdict: dict) -> list[dict]:
    rows = []
    for loss, c in verdict.get("controls", {}).items():
        row = {"loss": loss, "ρ(depth)": c["depth"]["rho"], "partial ρ given depth": c["partial_given_depth"]["rho"],
               "partial ρ, Freedman-Lane p": c["partial_given_depth"]["p"],
               "ρ(massive-channel share)": c.get("channel_share", {}).get("rho"),
               "partial ρ given share": c.get("partial_given_share", {}).get("rho"),
               "partial ρ given share, Freedman-Lane p": c.get("partial_given_share", {}).get("p")}
        row.update({f"ρ, score {label}": c[name]["rho"] for name, label in SCORE_VARIANTS.items() if name in c})
        row.update({label: c[name]["rho"] for name, label in {**LOOKUP_CONTROLS, **CEILING_CONTROL,
                                                               **POSTERIOR_CONTROLS}.items() if name in c})
        rows.append(row)
    return rows


def sweep_section(sweep: dict) -> list[str]:
    """Markdown lines of the sweep section."""
    v = sweep["verdict"]
    diffusion = v.get("protocol") == "diffusion"
    watched = ("objective and posterior-mean nmse_dim both" if diffusion else "nmse_dim")
    parts = ["## Bridge sweep", "",
             "Protocol (fixed before the run, docs/method.md): one bridge per layer and seed, each trained until its "
             f"stopping split's {watched} stopped improving or until its step cap (the table says which), and validated "
             "with its best weights on other held-out blocks; "
             + ("layer 0, the source, is tested too (--include-source); " if 0 in v.get("compared_layers", [])
                else "layer 0 is the source and is not tested; ")
             + "the score is z-scored over the tested layers. "
             + ("`objective` (primary) is the diffusion bridge's own loss on a fixed tau grid; `objective τ = 0` the "
                "same with every tau at 0 (its posterior mean's part) and `lookup objective` the untrained bridge's "
                "(the token lookup's own), where recorded; `nmse_dim 1 step` is "
                "its posterior mean's per-channel error and `nmse_dim` a K-step sample's; `crps_dim` the samples' "
                "CRPS per channel. " if diffusion else "")
             + "`nmse_dim` "
             + ("" if diffusion else "(primary) ")
             + "standardises each channel by its own variance, `nmse` by the total variance (massive "
             "channels dominate it), `delta_ce` is the upper stack's cross-entropy on the reconstruction minus on "
             "the true states (nats), `nmse_noisy` the nmse averaged over condition SNRs, `objective` the loss the "
             "bridge trains on. Values are seed mean ± sd; 1 = no better than predicting the mean state.", ""]
    parts += [f"- {line}" for line in current_statement(v)]
    rows = layer_rows(v)
    parts += ["", "Per layer: the bridges' losses (seed mean ± sd), beside the layer's closed-form controls' nmse_dim "
              "(mean state, token-identity lookup, ridge on a window of input embeddings, the lookup plus that "
              "ridge on what the lookup leaves; the ceiling: the same network as a plain regression), and how many "
              "bridges stopped by their plateau (mean steps run).", "",
              markdown_table(rows, layer_columns(rows)), ""]
    if v.get("tests"):
        tests = test_rows(v)
        parts += ["Tests (one-sided: the claim is ρ < 0, higher score = lower loss; Holm over the secondary losses):",
                  "", markdown_table(tests, list(tests[0])), ""]
        controls = control_rows(v)
        columns = [k for k in controls[0] if any(r.get(k) is not None for r in controls)]
        parts += ["Controls (ρ over the same layers; two-sided for depth, the channel share, the lookup's loss, the ceiling's nmse_dim (whose ceilings count whether or not they stopped by their plateau) and the posterior mean's nmse_dim; one-sided for the partial ρs and every other ρ with the score):", "",
                  markdown_table(controls, columns), ""]
    parts += ["![sweep](plots/sweep.png)", "", "![stopping-split curves](plots/sweep-curves.png)", ""]
    return parts
