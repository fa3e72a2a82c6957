"""Spearman correlation between the geometry score and a bridge loss, with a permutation
p-value and a bootstrap interval (all from scipy.stats)."""

from __future__ import annotations

import warnings

import numpy as np
from scipy import stats


def spearman_with_uncertainty(x, y, seed: int = 0, resamples: int = 9999) -> dict:
    """rho, a two-sided permutation-test p-value (exact when n! <= resamples, Monte Carlo
    otherwise, which for ~30 layers with 9,999 resamples resolves p down to 1e-4) and a 95%
    percentile bootstrap interval over (x, y) pairs.

    With few layers many bootstrap resamples repeat one pair so often that a rank is constant
    and rho is undefined; the interval is taken over the valid resamples, whose count is
    reported (`ci_valid`), and is None when fewer than half are valid: no interval is given
    rather than a NaN or one that rests on a handful of resamples."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    rho = float(stats.spearmanr(x, y).statistic)

    def statistic(a, b):
        return stats.spearmanr(a, b).statistic

    with warnings.catch_warnings():  # resamples with tied or constant ranks: nan, not noise
        warnings.simplefilter("ignore")
        return _with_uncertainty(x, y, rho, statistic, seed, resamples)


def _with_uncertainty(x, y, rho, statistic, seed, resamples):
    # permuting x alone gives the n! pairings: exact whenever n! <= resamples (n <= 7 at the default)
    permutation = stats.permutation_test((x,), lambda a: statistic(a, y), permutation_type="pairings",
                                         n_resamples=resamples, alternative="two-sided",
                                         rng=np.random.default_rng(seed))
    draws = np.random.default_rng(seed).integers(0, len(x), size=(min(resamples, 2000), len(x)))
    values = np.array([statistic(x[rows], y[rows]) for rows in draws], dtype=float)
    valid = values[np.isfinite(values)]
    ci = [float(v) for v in np.percentile(valid, [2.5, 97.5])] if len(valid) >= len(values) / 2 else None
    return {"rho": rho, "p": float(permutation.pvalue), "ci": ci, "ci_valid": int(len(valid)),
            "ci_resamples": len(values), "n": len(x)}


def describe(name: str, c: dict) -> str:
    """One line for people: rho, p and the interval (or why there is none)."""
    interval = (f"95% CI [{c['ci'][0]:.3f}, {c['ci'][1]:.3f}] ({c['ci_valid']} of {c['ci_resamples']} resamples "
                f"defined)" if c.get("ci") else f"no interval: only {c.get('ci_valid', 0)} of "
                f"{c.get('ci_resamples', 0)} bootstrap resamples define rho")
    return (f"Spearman(score, {name}) = {c['rho']:.3f}, permutation p = {c['p']:.3g}, {interval}, n = {c['n']}: "
            f"{verdict(c)}")


def verdict(c: dict, alpha: float = 0.05) -> str:
    """What rho says about the claim that the geometry score predicts the bridge's loss. The
    score is higher for layers predicted easier and a loss is higher for harder ones, so the
    claim predicts rho < 0."""
    if c["p"] >= alpha:
        return f"inconclusive (p = {c['p']:.3g} >= {alpha})"
    if c["rho"] < 0:
        return "supports the claim (higher score, lower loss)"
    return "contradicts the claim: the score ranks layers opposite to how hard their bridges are"
