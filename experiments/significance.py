"""The statistics of a comparison over seeds: paired t, Holm, power, test-set sampling error.

Pure numpy and scipy, so a reviewer can check every number by hand:

* `paired_test(d)`: for paired differences d_1..d_n (seed s of two variants
  shares its data order and initial seed, so pairing removes that luck),
  mean, sample std (ddof 1), the Student-t interval mean +- t_{0.975, n-1}
  std / sqrt(n), the two-sided p-value of H0: mean = 0 (scipy's
  `ttest_1samp`, the same as `ttest_rel` on the pairs), and the minimum
  detectable difference below.
* `minimum_detectable_difference(std, n)`: the smallest true mean difference
  that a two-sided paired t-test at level alpha finds with the given power,
  from the noncentral t distribution: power(delta) = P(|T'| > t_crit) with
  T' ~ t(n - 1, nc = delta sqrt(n) / std). An interval that contains 0 says
  "no difference" only about differences well above this.
* `holm(p)`: Holm's step-down adjustment for a family of k tests: sort p
  ascending, p_adj_(i) = max_{j <= i} min(1, (k - j + 1) p_(j)). It controls
  the family-wise error rate like Bonferroni, never less powerfully.
* `binomial_standard_error(accuracy, n)`: sqrt(a (1 - a) / n), the sampling
  error of an accuracy measured on n test images. Every seed is scored on the
  same test images, so averaging over seeds does not shrink it.
"""

import math

import numpy as np
from scipy import optimize, stats

CONFIDENCE = 0.95
ALPHA = 0.05
POWER = 0.8


def t_interval(values, confidence=CONFIDENCE):
    """[low, high] of the Student-t interval of the mean of `values` (None for fewer than 2)."""
    n = len(values)
    if n < 2:
        return None
    mean, std = float(np.mean(values)), float(np.std(values, ddof=1))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * std / math.sqrt(n)
    return [mean - half, mean + half]


def minimum_detectable_difference(std, n, alpha=ALPHA, power=POWER):
    """Smallest |mean difference| a two-sided one-sample t-test of n pairs detects with `power`.

    None when n < 2 or the spread is unknown; 0 when the differences do not vary.
    """
    if n < 2 or std is None:
        return None
    if std == 0:
        return 0.0
    df = n - 1
    critical = stats.t.ppf(1 - alpha / 2, df)

    def shortfall(noncentrality):
        # The far tail (T' < -t_crit) is below 1e-3 once power nears 0.8; scipy returns NaN for it at df = 1.
        lower = float(np.nan_to_num(stats.nct.cdf(-critical, df, noncentrality), nan=0.0))
        reached = stats.nct.sf(critical, df, noncentrality) + lower
        return reached - power

    # Widen the bracket step by step: scipy's noncentral t turns NaN far out in the tail.
    high = 4.0
    while shortfall(high) < 0:
        high *= 2
    noncentrality = optimize.brentq(shortfall, 0.0, high, xtol=1e-10)
    return float(noncentrality * std / math.sqrt(n))


def paired_test(differences, alpha=ALPHA, power=POWER):
    """Summary of paired differences: n, mean, std, ci95, p_value, mde (see the module docstring).

    None for no differences; with one difference only n and mean are known.
    """
    d = [float(x) for x in differences]
    if not d:
        return None
    n, mean = len(d), float(np.mean(d))
    std = float(np.std(d, ddof=1)) if n > 1 else None
    if n < 2:
        p_value = None
    elif std == 0:
        p_value = 1.0 if mean == 0 else 0.0
    else:
        p_value = float(stats.ttest_1samp(d, 0.0).pvalue)
    return {
        "n": n, "mean": mean, "std": std, "min": min(d), "max": max(d),
        "ci95": t_interval(d, 1 - alpha), "p_value": p_value,
        "mde": minimum_detectable_difference(std, n, alpha, power),
    }


def holm(p_values):
    """Holm-adjusted p-values of a family, in the input order; None entries stay None and do not count."""
    indexed = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    k = len(indexed)
    adjusted = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(indexed):
        running = max(running, min(1.0, (k - rank) * p))
        adjusted[i] = running
    return adjusted


def verdict(test, adjusted_p, alpha=ALPHA):
    """"above 0" / "below 0" when the adjusted p-value is below alpha, else "not separated"; None without a test."""
    if not test or adjusted_p is None:
        return None
    if adjusted_p < alpha:
        return "above 0" if test["mean"] > 0 else "below 0"
    return "not separated"


def binomial_standard_error(accuracy, n):
    """sqrt(a (1 - a) / n); None without an accuracy or a test-set size."""
    if accuracy is None or not n:
        return None
    return math.sqrt(accuracy * (1 - accuracy) / n)
