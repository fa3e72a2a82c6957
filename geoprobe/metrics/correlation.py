"""Spearman correlation between the geometry score and a bridge loss, with a permutation
p-value and a bootstrap interval (all from scipy.stats)."""

from __future__ import annotations

import warnings

import numpy as np
from scipy import stats


def spearman_with_uncertainty(x, y, seed: int = 0, resamples: int = 9999) -> dict:
    """rho, a two-sided permutation-test p-value (exact when n! <= resamples, Monte Carlo
    otherwise, which for ~30 layers with 9,999 resamples resolves p down to 1e-4) and a 95%
    percentile bootstrap interval over (x, y) pairs."""
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
    boot = stats.bootstrap((x, y), statistic, paired=True, vectorized=False, n_resamples=min(resamples, 2000),
                           method="percentile", rng=np.random.default_rng(seed))
    low, high = boot.confidence_interval
    return {"rho": rho, "p": float(permutation.pvalue), "ci": [float(low), float(high)], "n": len(x)}
