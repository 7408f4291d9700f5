"""The audit's pure math (securevfl/privacy/audit_math.py): Clopper-Pearson against scipy's beta
quantiles, the two lower bounds against the anchor table of expected tightness
(the audit method's anchors: binary randomized response at eps 1 by Clopper-Pearson, 0.80 / 0.94
/ 0.98 at N = 1e3 / 1e4 / 1e5 trials in all; a Gaussian of noise multiplier 1 by the GDP fit,
3.6 / 4.1 / 4.3 at N trials on each neighbour), at the expected counts (no randomness)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from securevfl.privacy import audit_math as am
from securevfl.privacy.gaussian import gaussian_epsilon


@pytest.mark.parametrize(("k", "n", "conf"), [(0, 10, 0.95), (3, 10, 0.95), (10, 10, 0.9), (517, 1000, 0.99)])
def test_clopper_pearson_is_the_beta_quantiles(k: int, n: int, conf: float) -> None:
    a = (1 - conf) / 2
    lo, hi = am.clopper_pearson(k, n, conf)
    assert lo == (0.0 if k == 0 else pytest.approx(stats.beta.ppf(a, k, n - k + 1), rel=1e-12))
    assert hi == (1.0 if k == n else pytest.approx(stats.beta.ppf(1 - a, k + 1, n - k), rel=1e-12))
    assert lo <= k / n <= hi


def test_clopper_pearson_covers_at_its_confidence() -> None:
    # exact coverage of the interval for p = 0.3, n = 50, summed over the binomial law
    n, p = 50, 0.3
    cover = sum(
        stats.binom.pmf(k, n, p)
        for k in range(n + 1)
        if am.clopper_pearson(k, n, 0.95)[0] <= p <= am.clopper_pearson(k, n, 0.95)[1]
    )
    assert cover >= 0.95


def test_clopper_pearson_refuses_bad_counts() -> None:
    with pytest.raises(ValueError):
        am.clopper_pearson(5, 4, 0.95)
    with pytest.raises(ValueError):
        am.clopper_pearson(1, 4, 1.0)


def _rr_counts(eps: float, per_side: int) -> tuple[int, int, int, int]:
    keep = math.exp(eps) / (1 + math.exp(eps))
    tp = round(keep * per_side)
    fp = round((1 - keep) * per_side)
    return tp, per_side - tp, fp, per_side - fp


@pytest.mark.parametrize(("n", "anchor"), [(1_000, 0.80), (10_000, 0.94), (100_000, 0.98)])
def test_randomized_response_bound_matches_the_anchor(n: int, anchor: float) -> None:
    got = am.epsilon_lower_from_counts(*_rr_counts(1.0, n // 2), delta=1e-5, confidence=0.95)
    assert got == pytest.approx(anchor, abs=0.01)
    assert got < 1.0  # a valid lower bound at the expected counts stays below the truth


def test_randomized_response_eps4_anchor() -> None:
    got = am.epsilon_lower_from_counts(*_rr_counts(4.0, 5_000), delta=1e-5, confidence=0.95)
    assert got == pytest.approx(3.79, abs=0.02)


def _gauss_counts(z: float, per_side: int) -> tuple[int, int, int, int]:
    # threshold at the midpoint of N(+1/2, z^2) and N(-1/2, z^2): both errors Phi(-1/(2z))
    err = round(stats.norm.cdf(-1 / (2 * z)) * per_side)
    return per_side - err, err, err, per_side - err


@pytest.mark.parametrize(
    ("z", "n", "anchor"),
    [(1.0, 1_000, 3.6), (1.0, 10_000, 4.1), (1.0, 100_000, 4.3), (0.5, 10_000, 9.6), (0.5, 100_000, 9.9)],
)
def test_gdp_fit_matches_the_anchor(z: float, n: int, anchor: float) -> None:
    got = am.epsilon_lower_gdp(*_gauss_counts(z, n), delta=1e-5, confidence=0.95)
    assert got == pytest.approx(anchor, abs=0.06)
    assert got < gaussian_epsilon(z, 1e-5)


def test_gdp_is_tighter_than_clopper_pearson_on_a_gaussian() -> None:
    c = _gauss_counts(1.0, 5_000)
    cp = am.epsilon_lower_from_counts(*c, delta=1e-5, confidence=0.95)
    gdp = am.epsilon_lower_gdp(*c, delta=1e-5, confidence=0.95)
    assert cp > 0.5  # informative, but (at the midpoint threshold) far from the claim
    assert gdp > cp + 1.0


def test_gdp_epsilon_is_the_gaussian_mechanism_epsilon() -> None:
    # mu-GDP is exactly the Gaussian mechanism of multiplier 1/mu
    for mu in (0.3, 1.0, 2.0):
        assert am.gdp_epsilon(mu, 1e-5) == pytest.approx(gaussian_epsilon(1 / mu, 1e-5), rel=1e-6)
    assert am.gdp_epsilon(0.0, 1e-5) == 0.0


def test_uninformative_counts_give_zero() -> None:
    assert am.epsilon_lower_from_counts(50, 50, 50, 50, delta=1e-5, confidence=0.95) == 0.0
    assert am.epsilon_lower_gdp(50, 50, 50, 50, delta=1e-5, confidence=0.95) == 0.0


def test_complementary_test_counts_too() -> None:
    # a test that is right when it says "second" (tn high, fn low) but says "first" often
    tp, fn, fp, tn = 990, 10, 500, 500
    direct = am._ratio_bound(
        am.clopper_pearson(tp, 1000, 0.95)[0] - 0, am.clopper_pearson(fp, 1000, 0.95)[1], 0
    )
    both = am.epsilon_lower_from_counts(tp, fn, fp, tn, delta=0.0, confidence=0.95)
    assert both > direct + 1.0


def test_split_audit_of_a_gaussian_and_a_quartered_one() -> None:
    """The split audit (threshold on one half, counts on the other) on simulated scores."""
    rng = np.random.default_rng(7)  # test inputs, not secret noise
    n = 10_000
    honest = am.audit_scores(
        rng.normal(0.5, 1, n), rng.normal(-0.5, 1, n), method="gdp", delta=1e-5, confidence=0.95
    )
    claim = gaussian_epsilon(1.0, 1e-5)
    assert 0.8 * claim <= honest[0] <= claim
    assert sum(honest[1]) == n  # the counted half of both sides
    quarter = am.audit_scores(
        rng.normal(0.5, 0.25, n), rng.normal(-0.5, 0.25, n), method="gdp", delta=1e-5, confidence=0.95
    )
    assert quarter[0] > claim


def test_scores_with_discrete_values() -> None:
    # randomized response seen as scores 1 (output = first label) / 0
    rng = np.random.default_rng(3)
    keep = math.e / (1 + math.e)
    first = (rng.random(10_000) < keep).astype(float)
    second = (rng.random(10_000) < 1 - keep).astype(float)
    eps, (tp, fn, fp, tn) = am.audit_scores(
        first, second, method="clopper-pearson", delta=1e-5, confidence=0.95
    )
    assert tp + fn == 10_000 and fp + tn == 10_000  # two values: no threshold to choose, all counted
    assert 0.9 <= eps <= 1.0
