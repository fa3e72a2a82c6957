"""PNG plots that a person can read without the text: titles, labelled axes, legends."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

PANELS = [("curv", "local curvature m_curv", "1/λmax of kNN covariance"),
          ("mono", "global monotonicity m_mono", "median Rayleigh quotient of P"),
          ("erank", "effective rank k", "tr(Σ)/λmax(Σ)"),
          ("score", "selection score s", "z(curv)+z(mono)−z(erank)")]


# the comparison's bar groups: the pretrained AR ceiling, a kind set apart (its legend name), the other trained ones
CEILING_GROUP = "pretrained AR (a ceiling only where it was trained on the corpus)"


def save_figure(fig, path: Path) -> Path:
    """Lay out, write as a 110-dpi PNG (creating the folder) and free the figure."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def geometry_plot(ranking: dict, geometry: dict, path: Path, other: dict | None = None) -> Path:
    """The three proxies and the score against layer; `other` (the ranking under the opposite
    choice about massive channels) adds its score and chosen layer to the score panel."""
    rows = ranking["rows"]
    layers = np.array([r["layer"] for r in rows])
    chosen = ranking["chosen_layer"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    for ax, (key, title, unit) in zip(axes.flat, PANELS):
        value = np.array([r[key] for r in rows])
        lo, hi = np.array([r[f"{key}_lo"] for r in rows]), np.array([r[f"{key}_hi"] for r in rows])
        ax.plot(layers, value, "o-", color="tab:blue", ms=3.5, label="estimate")
        if np.isfinite(lo).all():
            ax.fill_between(layers, lo, hi, color="tab:blue", alpha=0.2, label="95% bootstrap interval")
        ax.axvline(chosen, color="tab:red", ls="--", lw=1.2, label=f"chosen layer ℓ* = {chosen}")
        if key == "score" and other is not None:
            how = "excluded" if other["drop_massive_channels"] else "kept"
            ax.plot(layers, [r["score"] for r in other["rows"]], "s--", color="tab:purple", ms=3.5,
                    label=f"score, massive channels {how}")
            ax.axvline(other["chosen_layer"], color="tab:purple", ls=":", lw=1.2,
                       label=f"ℓ* with massive channels {how} = {other['chosen_layer']}")
            ax.legend(loc="best", fontsize=7)
        if key in ("curv", "mono") and (value > 0).all() and value.max() / value.min() > 30:
            ax.set_yscale("log")
        ax.set_title(title)
        ax.set_ylabel(unit + (" (trace-normalised)" if ranking["normalize"] == "trace" and key in ("curv", "mono") else ""))
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("layer (0 = embeddings, ℓ = after block ℓ)")
    axes[0, 0].legend(loc="best", fontsize=8)
    p_first = ranking["chosen_p_first"]
    fig.suptitle(f"Layer geometry of {geometry.get('model')} — {geometry['rows']} states/layer, "
                 f"ℓ* = {chosen} (first in {p_first:.0%} of bootstrap replicates)" if np.isfinite(p_first) else
                 f"Layer geometry of {geometry.get('model')} — ℓ* = {chosen}", fontsize=11)
    return save_figure(fig, path)


def curve_plot(curve: list, path: Path, title: str, val_curve: list | None = None) -> Path:
    steps = np.array([s for s, _ in curve])
    losses = np.array([l for _, l in curve])
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, losses, color="tab:blue", alpha=0.35, lw=1, label="per step")
    window = max(1, len(losses) // 20)
    if len(losses) >= window > 1:
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1:], smooth, color="tab:blue", lw=2, label=f"moving average ({window} steps)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    handles = ax.get_legend_handles_labels()
    if val_curve:
        twin = ax.twinx()
        twin.plot([s for s, _ in val_curve], [v for _, v in val_curve], "o-", color="tab:red", ms=3,
                  label="validation score (plateau rule)")
        twin.set_ylabel("validation score", color="tab:red")
        handles = [a + b for a, b in zip(handles, twin.get_legend_handles_labels())]
    ax.legend(*handles, fontsize=8)
    return save_figure(fig, path)


def curves_plot(curves: dict, path: Path, title: str, ylabel: str = "stopping-split nmse_dim") -> Path:
    """Every layer's stopping-split curve (what its plateau rule watched) in one figure:
    {label: [[step, value], ...]}."""
    fig, ax = plt.subplots(figsize=(8, 4.8))
    colours = plt.cm.viridis(np.linspace(0, 0.9, max(len(curves), 1)))
    for colour, (label, points) in zip(colours, curves.items()):
        if points:
            ax.plot([s for s, _ in points], [v for _, v in points], "o-", ms=2.5, color=colour, label=label)
            ax.plot(points[-1][0], points[-1][1], "x", color=colour, ms=8)
    ax.set_xlabel("optimizer step (× marks where training stopped)")
    ax.set_ylabel(ylabel)
    ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    return save_figure(fig, path)


def sweep_plot(verdict: dict, path: Path, model: str) -> Path:
    """Left: the score (z-scored over the compared layers) against the seed mean of the primary
    loss, with the seed spread as error bars; the source layer is not drawn. Right: both against
    depth."""
    loss = verdict["primary_loss"]
    table = {r["layer"]: r for r in verdict["layers"]}
    layers = np.array(verdict["compared_layers"])
    score = np.array([verdict["scores"]["score"][str(l)] for l in layers])
    value = np.array([table[l][loss] for l in layers])
    spread = np.array([table[l][f"{loss}_sd"] or 0.0 for l in layers])
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    left.errorbar(score, value, yerr=spread, fmt="o", color="tab:blue", capsize=3)
    for x, y, layer in zip(score, value, layers):
        left.annotate(str(layer), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    left.set_xlabel("geometry score s, z-scored over these layers (higher = predicted easier)")
    left.set_ylabel(f"bridge {loss}: seed mean ± sd")
    test = verdict.get("tests", {}).get(loss)
    left.set_title(f"one-sided Spearman ρ = {test['rho']:.2f}, permutation p = {test['p']:.3g}" if test
                   else "no test (too few tested layers; see the verdict)", fontsize=10)
    left.grid(alpha=0.3)
    right.errorbar(layers, value, yerr=spread, fmt="o-", color="tab:red", capsize=3, label=f"{loss}")
    right.set_xlabel("layer")
    right.set_ylabel(f"{loss} (seed mean ± sd)", color="tab:red")
    twin = right.twinx()
    twin.plot(layers, score, "s--", color="tab:blue", label="geometry score")
    twin.set_ylabel("geometry score s", color="tab:blue")
    right.set_title("both against layer (the depth control)")
    right.grid(alpha=0.3)
    fig.suptitle(f"Layer sweep of {model}: does the geometry score predict the bridge's loss?", fontsize=11)
    return save_figure(fig, path)


def _positive(values) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v) and v > 0]


def _wide(values) -> bool:
    """Whether Gen.PPL values span a range wide enough for a log axis (max/min > 3)."""
    finite = _positive(values)
    return bool(finite) and max(finite) / min(finite) > 3


def steps_plot(rows: list[dict], path: Path) -> Path:
    """Gen.PPL and MAUVE against sampling steps, one line per generator and sampler (`rows`:
    comparison rows, sorted by generator, sampler and steps)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    lines: dict[str, list[dict]] = {}
    for r in rows:
        lines.setdefault(f"{r['generator']} · {r['sampler']}", []).append(r)
    for label, group in lines.items():
        steps = [r["steps"] for r in group]
        left.plot(steps, [r["gen_ppl"] for r in group], marker="o", label=label)
        right.plot(steps, [r.get("mauve") if r.get("mauve") is not None else math.nan for r in group],
                   marker="o", label=label)
    left.set_ylabel("Gen.PPL under the evaluator (lower is better)")
    right.set_ylabel("MAUVE vs. references (higher is better)")
    if _wide([r["gen_ppl"] for r in rows]):
        left.set_yscale("log")
    from matplotlib.ticker import ScalarFormatter

    for ax, title in ((left, "Gen.PPL against sampling steps"), (right, "MAUVE against sampling steps")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["steps"] for r in rows}))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel("sampling steps (log scale)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    right.legend(fontsize=7, loc="best")
    return save_figure(fig, path)


def compare_plot(rows: list[dict], groups: list[str | None], path: Path) -> Path:
    """Two bar panels, one bar per generator: Gen.PPL and MAUVE (± std over k-means seeds).

    Args:
        rows: comparison rows (generator, sampler, gen_ppl, mauve, mauve_std, budget, samples).
        groups: each row's group: CEILING_GROUP (gray), a kind's legend name (orange) or None (blue).
    """
    labels = [f"{r['generator']} · {r['sampler']}" for r in rows]
    colors = ["tab:gray" if g == CEILING_GROUP else "tab:orange" if g is not None else "tab:blue" for g in groups]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 0.45 * len(rows) + 1.8), sharey=True)
    y = list(range(len(rows)))
    ppl = [r["gen_ppl"] if r["gen_ppl"] is not None and math.isfinite(r["gen_ppl"]) else math.nan for r in rows]
    left.barh(y, ppl, color=colors)
    finite = _positive(ppl)
    if _wide(ppl):
        left.set_xscale("log")
    left.set_xlim(left=min(finite) * 0.9 if finite else 0)
    mauve = [r["mauve"] if r.get("mauve") is not None else math.nan for r in rows]
    right.barh(y, mauve, xerr=[r.get("mauve_std") or 0 for r in rows], color=colors, capsize=3)
    right.set_xlim(0, 1.05)
    left.set_yticks(y, labels, fontsize=8)
    left.invert_yaxis()
    budget = rows[0]["budget"] if rows else ""
    left.set_xlabel("Gen.PPL under the evaluator (lower is better)")
    right.set_xlabel("MAUVE vs. references, mean ± std over seeds (higher is better)")
    apart = list(dict.fromkeys(g for g in groups if g not in (None, CEILING_GROUP)))
    legend = [f"gray: {CEILING_GROUP}"] * (CEILING_GROUP in groups) + [f"orange: {g}" for g in apart]
    left.set_title(f"Gen.PPL ({budget} budget{'; ' if legend else ''}{', '.join(legend)})", fontsize=10)
    right.set_title(f"MAUVE ({rows[0].get('samples') if rows else '?'} samples per generator)", fontsize=10)
    for ax in (left, right):
        ax.grid(axis="x", alpha=0.3)
    return save_figure(fig, path)
