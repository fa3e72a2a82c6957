"""Rank statistics of the layer sweep, all on scipy.stats: Spearman rho with a permutation
p-value (one- or two-sided) and a bootstrap interval, Holm's correction, the partial Spearman
correlation given a covariate, and the reliability of a loss's seed mean over seed replicates
(ICC(1,k))."""

from __future__ import annotations

import numpy as np
from scipy import stats


def _rank_rho(a, y_ranks, axis=-1):
    """Spearman rho of each row of `a` against fixed ranks: Pearson on ranks (vectorised)."""
    ra = stats.rankdata(a, axis=axis)
    ra = ra - ra.mean(axis=axis, keepdims=True)
    ry = y_ranks - y_ranks.mean()
    denominator = np.sqrt((ra ** 2).sum(axis=axis) * (ry ** 2).sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        return (ra * ry).sum(axis=axis) / denominator


def _rows_rho(a, b):
    """Spearman rho of each row of `a` with the same row of `b` (average ranks for ties, as
    stats.spearmanr), all rows at once: a per-row spearmanr loop made the bootstrap the sweep
    verdict's slowest step. A row whose ranks are constant gives nan."""
    ra, rb = (stats.rankdata(v, axis=-1) for v in (a, b))
    ra, rb = ra - ra.mean(axis=-1, keepdims=True), rb - rb.mean(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (ra * rb).sum(axis=-1) / np.sqrt((ra ** 2).sum(axis=-1) * (rb ** 2).sum(axis=-1))


def spearman_rho(x, y) -> float | None:
    """Spearman's rho of x and y; None where either is constant: a constant has no ranks, so rho
    is undefined and gives no evidence either way."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    return None if np.ptp(x) == 0 or np.ptp(y) == 0 else float(stats.spearmanr(x, y).statistic)


def spearman_with_uncertainty(x, y, seed: int = 0, resamples: int = 9999, alternative: str = "two-sided",
                              interval: bool = True) -> dict:
    """rho, a permutation-test p-value (exact when n! <= resamples, Monte Carlo otherwise, which
    for ~30 layers with 9,999 resamples resolves p down to 1e-4) and a 95% percentile bootstrap
    interval over (x, y) pairs. `alternative`: "two-sided", "less" (the claim is rho < 0) or
    "greater".

    With few layers many bootstrap resamples repeat one pair so often that a rank is constant
    and rho is undefined; the interval is taken over the valid resamples, whose count is
    reported (`ci_valid`), and is None when fewer than half are valid: no interval is given
    rather than a NaN or one that rests on a handful of resamples. A constant x or y gives rho NaN
    and p 1 (`constant`: True): no ranks, so no evidence for any alternative."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    rho = spearman_rho(x, y)
    if rho is None:
        return {"rho": float("nan"), "p": 1.0, "alternative": alternative, "n": len(x), "constant": True,
                **({"ci": None, "ci_valid": 0, "ci_resamples": 0} if interval else {})}
    y_ranks = stats.rankdata(y)
    # permuting x alone gives the n! pairings: exact whenever n! <= resamples (n <= 7 at the default)
    permutation = stats.permutation_test((x,), lambda a, axis=-1: _rank_rho(a, y_ranks, axis),
                                         permutation_type="pairings", vectorized=True, n_resamples=resamples,
                                         alternative=alternative, rng=np.random.default_rng(seed))
    result = {"rho": rho, "p": float(permutation.pvalue), "alternative": alternative, "n": len(x)}
    if not interval:
        return result
    draws = np.random.default_rng(seed).integers(0, len(x), size=(min(resamples, 2000), len(x)))
    values = _rows_rho(x[draws], y[draws])  # a resample whose ranks are constant: nan, not noise
    valid = values[np.isfinite(values)]
    ci = [float(v) for v in np.percentile(valid, [2.5, 97.5])] if len(valid) >= len(values) / 2 else None
    return {**result, "ci": ci, "ci_valid": int(len(valid)), "ci_resamples": len(values)}


def holm(pvalues: dict) -> dict:
    """Holm's step-down adjusted p-values (family-wise error over the given tests)."""
    names = sorted(pvalues, key=lambda k: pvalues[k])
    adjusted, running = {}, 0.0
    for i, name in enumerate(names):
        running = max(running, min(1.0, (len(names) - i) * pvalues[name]))
        adjusted[name] = running
    return adjusted


def partial_spearman(x, y, z) -> float:
    """Spearman rho of x and y with z partialled out: the first-order partial correlation of the
    three Spearman coefficients, (r_xy - r_xz r_yz) / sqrt((1 - r_xz^2)(1 - r_yz^2))."""
    r_xy, r_xz, r_yz = (float(stats.spearmanr(a, b).statistic) for a, b in ((x, y), (x, z), (y, z)))
    denominator = np.sqrt((1 - r_xz ** 2) * (1 - r_yz ** 2))
    return float((r_xy - r_xz * r_yz) / denominator) if denominator > 0 else float("nan")


def partial_spearman_test(x, y, z, alternative: str = "less", resamples: int = 9999, seed: int = 0) -> dict:
    """The partial Spearman rho of x and y given z with a Freedman-Lane permutation p-value: the
    ranks of y are split into their fit on the ranks of z and the residuals, the residuals are
    permuted, and the partial correlation is recomputed. Unlike permuting y itself, this keeps
    y's dependence on z (depth) under the null, so a score that only tracks depth does not pass."""
    rx, ry, rz = (stats.rankdata(np.asarray(v, dtype=float)) for v in (x, y, z))
    zc = rz - rz.mean()

    def residual(a):  # a's residual after its least-squares line on rz (rows of a: samples)
        a = a - a.mean(axis=-1, keepdims=True)
        return a - np.outer(a @ zc / (zc @ zc), zc).reshape(a.shape) if zc @ zc > 0 else a

    ex, ey = residual(rx), residual(ry)

    def partial(e):  # e: (..., n) y's fit on rz plus permuted residuals; only its residual on rz matters
        e = residual(e)
        denominator = np.sqrt((e ** 2).sum(-1) * (ex ** 2).sum())
        with np.errstate(invalid="ignore", divide="ignore"):
            return (e * ex).sum(-1) / denominator

    observed = float(partial(ey[None])[0])
    if not np.isfinite(observed):  # x or y is a function of z alone: nothing is left to correlate
        return {"rho": None, "p": None, "alternative": alternative, "n": len(ey), "method": "Freedman-Lane"}
    rng = np.random.default_rng(seed)
    permuted = np.array([rng.permutation(len(ey)) for _ in range(resamples)])
    null = partial(ey[permuted])
    tail = {"less": null <= observed + 1e-12, "greater": null >= observed - 1e-12,
            "two-sided": np.abs(null) >= abs(observed) - 1e-12}[alternative]
    return {"rho": observed, "p": float((tail.sum() + 1) / (resamples + 1)), "alternative": alternative,
            "n": len(ey), "method": "Freedman-Lane"}


def reliability(values) -> float | None:
    """Reliability of a loss's seed mean, the quantity the sweep tests, from seed replicates
    `values` (layers, seeds): ICC(1,k) = (MSB - MSW) / MSB = 1 - MSW / (k var(layer means)), the
    one-way ANOVA mean squares between layers, MSB = k var(layer means), and within them, MSW =
    mean seed variance (both ddof=1); equivalently 1 - 1/F. With no layer effect MSB and MSW
    have the same expectation, so it sits near 0 (its mean is exactly -2/(L - 3) over L layers,
    the small-sample bias of a ratio: -0.22 at 12 layers; the median is near 0). The earlier form
    1 - MSW / var(layer means) left out the factor k and sat near 1 - k without layer effect.
    1: the seeds agree and the layers differ; <= 0: the seed means' differences between layers
    are no larger than seed noise would make them; 0 where every value is equal (no layer effect,
    no noise). None with fewer than two seeds or two layers."""
    values = np.asarray(values, dtype=float)
    if values.ndim != 2 or values.shape[0] < 2 or values.shape[1] < 2:
        return None
    between = values.shape[1] * values.mean(axis=1).var(ddof=1)  # MSB
    within = values.var(axis=1, ddof=1).mean()  # MSW
    if between > 0:
        return float(1 - within / between)
    # equal layer means: no layer effect to find, whether or not the seeds differ (not "one seed")
    return float("-inf") if within > 0 else 0.0


def describe(name: str, c: dict) -> str:
    """One line for people: rho, p and the interval (or why there is none)."""
    interval = (f", 95% CI [{c['ci'][0]:.3f}, {c['ci'][1]:.3f}]" if c.get("ci") else
                ", no interval" if "ci" in c else "")
    side = {"less": "one-sided (rho < 0)", "greater": "one-sided (rho > 0)"}.get(c.get("alternative"), "two-sided")
    holm_p = f", Holm p = {c['p_holm']:.3g}" if "p_holm" in c else ""
    return f"Spearman(score, {name}) = {c['rho']:.3f}, {side} permutation p = {c['p']:.3g}{holm_p}{interval}, n = {c['n']}"
