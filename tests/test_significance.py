"""The comparison statistics against numbers worked out by hand (and one simulation for power)."""

import math

import numpy as np
import pytest

from experiments import significance


def test_paired_test_by_hand():
    # d = (1, 2, 3): mean 2, std 1, t = 2 / (1 / sqrt 3) = 3.4641 on 2 degrees of freedom.
    # Two-sided p = 1 - t/sqrt(t^2 + 2) for 2 df = 1 - 3.4641/3.7417 = 0.074180.
    # Interval: 2 +- t_{0.975,2} (4.302653) / sqrt 3 = 2 +- 2.484138.
    test = significance.paired_test([1.0, 2.0, 3.0])
    assert test["n"] == 3 and test["mean"] == pytest.approx(2.0) and test["std"] == pytest.approx(1.0)
    assert test["p_value"] == pytest.approx(1 - 3.4641016 / math.sqrt(12 + 2), abs=1e-6)
    assert test["ci95"] == pytest.approx([2 - 2.484138, 2 + 2.484138], abs=1e-5)


def test_one_pair_has_no_spread_and_none_has_no_test():
    test = significance.paired_test([0.5])
    assert test["mean"] == 0.5 and test["std"] is None and test["ci95"] is None
    assert test["p_value"] is None and test["mde"] is None
    assert significance.paired_test([]) is None


def test_holm_by_hand():
    # Sorted 0.01, 0.02, 0.03, 0.04 with k = 4: 4 x 0.01 = 0.04, 3 x 0.02 = 0.06,
    # 2 x 0.03 = 0.06, 1 x 0.04 = 0.04 -> kept monotone: 0.06. None stays out of the family.
    adjusted = significance.holm([0.03, None, 0.01, 0.04, 0.02])
    assert adjusted[1] is None
    assert adjusted[0] == pytest.approx(0.06)
    assert adjusted[2] == pytest.approx(0.04)
    assert adjusted[3] == pytest.approx(0.06)
    assert adjusted[4] == pytest.approx(0.06)
    assert significance.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1, monotone


def test_verdicts():
    assert significance.verdict({"mean": 0.02}, 0.01) == "above 0"
    assert significance.verdict({"mean": -0.02}, 0.049) == "below 0"
    assert significance.verdict({"mean": 0.02}, 0.06) == "not separated"
    assert significance.verdict(None, 0.01) is None


def test_minimum_detectable_difference_approaches_the_normal_formula():
    # For many pairs the t-test is a z-test: delta = (z_{0.975} + z_{0.8}) std / sqrt(n)
    # = (1.959964 + 0.841621) x 0.01 / sqrt(400) = 0.00140079.
    assert significance.minimum_detectable_difference(0.01, 400) == pytest.approx(0.00140079, rel=5e-3)
    # Few pairs need far more: with n = 3 the t quantile is 4.30, not 1.96, and the
    # difference must be twice the normal formula's 2.80 std / sqrt(3).
    assert significance.minimum_detectable_difference(0.01, 3) > 2 * 0.01 * 2.80 / math.sqrt(3)
    assert significance.minimum_detectable_difference(0.0, 5) == 0.0
    assert significance.minimum_detectable_difference(0.01, 1) is None


@pytest.mark.parametrize("n", [2, 3, 5])
def test_power_at_the_minimum_detectable_difference_is_80_percent(n):
    delta = significance.minimum_detectable_difference(1.0, n)
    rng = np.random.default_rng(0)
    from scipy import stats

    samples = rng.normal(delta, 1.0, size=(40_000, n))
    p = stats.ttest_1samp(samples, 0.0, axis=1).pvalue
    assert np.mean(p < 0.05) == pytest.approx(0.8, abs=0.01)


def test_binomial_standard_error_by_hand():
    # sqrt(0.985 x 0.015 / 10,000) = 0.0012155
    assert significance.binomial_standard_error(0.985, 10_000) == pytest.approx(0.0012155, abs=1e-7)
    assert significance.binomial_standard_error(None, 10_000) is None
