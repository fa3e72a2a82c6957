"""PNG plots that a person can read without the text: titles, labelled axes, legends."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

PANELS = [("curv", "local curvature m_curv", "1/λmax of kNN covariance"),
          ("mono", "global monotonicity m_mono", "median Rayleigh quotient of P"),
          ("erank", "effective rank k", "tr(Σ)/λmax(Σ)"),
          ("score", "selection score s", "z(curv)+z(mono)−z(erank)")]


def geometry_plot(ranking: dict, geometry: dict, path: Path) -> Path:
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
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
