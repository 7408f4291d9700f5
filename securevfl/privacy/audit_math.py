"""Empirical privacy auditing as pure functions: counts of a distinguishing test turned into a
lower bound on epsilon (docs/privacy.md, "The audit").

If a mechanism ``M`` is ``(eps, delta)``-DP, every test that tells ``M(D)`` from ``M(D')`` for
neighbours ``D, D'`` satisfies ``TPR <= e^eps FPR + delta`` and ``TNR <= e^eps FNR + delta``
(Kairouz, Oh, Viswanath 2015). An audit runs the mechanism on a canary pair many times, counts
the test's errors and turns exact binomial bounds on the error rates into a lower bound on eps:

* :func:`epsilon_lower_from_counts`: the inequality itself with Clopper-Pearson bounds
  (Jagielski, Ullman, Oprea 2020; Nasr et al. 2021). Valid for any mechanism.
* :func:`epsilon_lower_gdp`: a Gaussian-DP fit of the bounded error rates (Nasr et al. 2023,
  "Tight auditing of DP-SGD"; GDP of Dong, Roth, Su 2019). Close to tight for a Gaussian
  release, where Clopper-Pearson alone is loose at practical trial counts; it assumes the
  mechanism's trade-off curve is Gaussian, so it is used for Gaussian releases only.
* :func:`choose_threshold`: the test's threshold, chosen on trials that are not counted
  afterwards (a threshold chosen with hindsight on the counted trials inflates the bound).

Convention: the test says "first neighbour" when a trial's score exceeds the threshold;
``tp``/``fn`` count the trials run on the first neighbour, ``fp``/``tn`` those on the second.
numpy and scipy only.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from scipy.optimize import brentq
from scipy.stats import beta, norm

Method = Literal["gdp", "clopper-pearson"]


def _check(confidence: float, delta: float | None = None) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if delta is not None and not 0 <= delta < 1:
        raise ValueError(f"delta must lie in [0, 1), got {delta}")


def clopper_pearson(k: int, n: int, confidence: float) -> tuple[float, float]:
    """Two-sided exact binomial interval for ``k`` successes in ``n`` trials (each side at
    ``(1 - confidence) / 2``): the ``alpha/2`` quantile of ``Beta(k, n-k+1)`` and the
    ``1 - alpha/2`` quantile of ``Beta(k+1, n-k)``; 0 and 1 at the ends."""
    _check(confidence)
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    a = (1.0 - confidence) / 2.0
    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1.0 - a, k + 1, n - k))
    return lo, hi


def _ratio_bound(hit_lb: float, miss_ub: float, delta: float) -> float:
    """``ln((hit_lb - delta) / miss_ub)``, 0 when not informative."""
    num = hit_lb - delta
    if num <= 0 or miss_ub <= 0:
        return 0.0 if num <= 0 else math.inf
    return max(0.0, math.log(num / miss_ub))


def epsilon_lower_from_counts(
    tp: int, fn: int, fp: int, tn: int, *, delta: float, confidence: float
) -> float:
    """Lower bound on epsilon at ``confidence`` that a test with these counts implies for an
    ``(eps, delta)``-DP mechanism: ``eps >= ln((TPR_lb - delta) / FPR_ub)``, and symmetrically
    ``ln((TNR_lb - delta) / FNR_ub)`` with the complementary test; the max of the two, 0 when
    neither is informative. TPR/FPR are for the test "output says canary is the first
    neighbour"; the bounds are :func:`clopper_pearson`'s."""
    _check(confidence, delta)
    tpr_lb, _ = clopper_pearson(tp, tp + fn, confidence)
    _, fpr_ub = clopper_pearson(fp, fp + tn, confidence)
    tnr_lb, _ = clopper_pearson(tn, fp + tn, confidence)
    _, fnr_ub = clopper_pearson(fn, tp + fn, confidence)
    return max(_ratio_bound(tpr_lb, fpr_ub, delta), _ratio_bound(tnr_lb, fnr_ub, delta))


def gdp_delta(epsilon: float, mu: float) -> float:
    """The delta at ``epsilon`` of ``mu``-GDP (Dong, Roth, Su 2019, Cor. 2.13):
    ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``."""
    if mu <= 0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    return float(norm.cdf(-epsilon / mu + mu / 2.0) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2.0))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest epsilon at which ``mu``-GDP is ``(eps, delta)``-DP (0 when ``mu <= 0`` or
    already at eps 0, inf for ``mu = inf`` or ``delta = 0``)."""
    if mu <= 0 or gdp_delta(0.0, mu) <= delta:
        return 0.0
    if math.isinf(mu) or delta <= 0:
        return math.inf
    hi = 1.0
    while gdp_delta(hi, mu) > delta:
        hi *= 2.0
        if hi > 1e6:
            return math.inf
    return float(brentq(lambda e: gdp_delta(e, mu) - delta, 0.0, hi, xtol=1e-12))


def epsilon_lower_gdp(tp: int, fn: int, fp: int, tn: int, *, delta: float, confidence: float) -> float:
    """Gaussian-DP fit (Nasr et al. 2023): ``mu_lb = Phi^-1(1 - FPR_ub) - Phi^-1(FNR_ub)`` from the
    Clopper-Pearson upper bounds on both error rates, then the eps at ``delta`` of
    ``mu_lb``-GDP (Dong, Roth, Su 2019); 0 when ``mu_lb <= 0``."""
    _check(confidence, delta)
    _, fpr_ub = clopper_pearson(fp, fp + tn, confidence)
    _, fnr_ub = clopper_pearson(fn, tp + fn, confidence)
    mu = float(norm.ppf(1.0 - fpr_ub) - norm.ppf(fnr_ub))
    return gdp_epsilon(mu, delta) if mu > 0 else 0.0


def epsilon_lower(
    method: Method, tp: int, fn: int, fp: int, tn: int, *, delta: float, confidence: float
) -> float:
    """The lower bound of ``method`` ("gdp" or "clopper-pearson") from the counts."""
    if method == "gdp":
        return epsilon_lower_gdp(tp, fn, fp, tn, delta=delta, confidence=confidence)
    if method == "clopper-pearson":
        return epsilon_lower_from_counts(tp, fn, fp, tn, delta=delta, confidence=confidence)
    raise ValueError(f"unknown audit method {method!r} (known: gdp, clopper-pearson)")


def counts(first: np.ndarray, second: np.ndarray, threshold: float) -> tuple[int, int, int, int]:
    """``(tp, fn, fp, tn)`` of the test "score > threshold says first neighbour" on the scores of
    trials run on the first and on the second neighbour."""
    tp = int(np.count_nonzero(first > threshold))
    fp = int(np.count_nonzero(second > threshold))
    return tp, int(first.size) - tp, fp, int(second.size) - fp


def _upper(k: np.ndarray, n: int, confidence: float) -> np.ndarray:
    """:func:`clopper_pearson`'s upper bounds of many counts ``k`` out of ``n`` at once."""
    a = (1.0 - confidence) / 2.0
    with np.errstate(all="ignore"):
        hi = beta.ppf(1.0 - a, k + 1, n - k)
    return np.where(k >= n, 1.0, hi)


def _lower(k: np.ndarray, n: int, confidence: float) -> np.ndarray:
    a = (1.0 - confidence) / 2.0
    with np.errstate(all="ignore"):
        lo = beta.ppf(a, k, n - k + 1)
    return np.where(k <= 0, 0.0, lo)


def _strength(
    tp: np.ndarray, fp: np.ndarray, n1: int, n2: int, *, method: Method, delta: float, confidence: float
) -> np.ndarray:
    """A quantity that orders thresholds as ``method``'s bound does, for many at once: ``mu_lb``
    for the GDP fit (its eps is increasing in mu), the Clopper-Pearson bound itself otherwise."""
    fn, tn = n1 - tp, n2 - fp
    fpr_ub, fnr_ub = _upper(fp, n2, confidence), _upper(fn, n1, confidence)
    if method == "gdp":
        return np.asarray(norm.ppf(1.0 - fpr_ub) - norm.ppf(fnr_ub))
    tpr_lb, tnr_lb = _lower(tp, n1, confidence), _lower(tn, n2, confidence)
    with np.errstate(all="ignore"):
        one = np.log(np.maximum(tpr_lb - delta, 0.0) / fpr_ub)
        two = np.log(np.maximum(tnr_lb - delta, 0.0) / fnr_ub)
    return np.nan_to_num(np.maximum(one, two), nan=-np.inf)


def choose_threshold(
    first: np.ndarray,
    second: np.ndarray,
    *,
    method: Method,
    delta: float,
    confidence: float,
    candidates: int = 256,
) -> float:
    """The threshold (among ``candidates`` quantiles of the pooled scores) whose counts on these
    trials give the largest ``method`` bound. Call it on trials that are not counted afterwards:
    the bound is then valid without a correction for the thresholds tried."""
    first = np.sort(np.asarray(first, dtype=np.float64).ravel())
    second = np.sort(np.asarray(second, dtype=np.float64).ravel())
    if first.size == 0 or second.size == 0:
        raise ValueError("choose_threshold needs trials on both neighbours")
    pooled = np.concatenate([first, second])
    # the GDP fit reads the same mu off every threshold of a Gaussian: the central ones, whose
    # error rates are bounded most tightly, are the candidates (tails only add noise)
    lo, hi = (0.1, 0.9) if method == "gdp" else (0.0, 1.0)
    qs = np.unique(np.quantile(pooled, np.linspace(lo, hi, candidates + 2)[1:-1]))
    tp = first.size - np.searchsorted(first, qs, side="right")
    fp = second.size - np.searchsorted(second, qs, side="right")
    score = _strength(tp, fp, first.size, second.size, method=method, delta=delta, confidence=confidence)
    return float(qs[int(np.argmax(score))])


def audit_scores(
    first: np.ndarray, second: np.ndarray, *, method: Method, delta: float, confidence: float
) -> tuple[float, tuple[int, int, int, int]]:
    """The audit's lower bound from scores of trials on the two neighbours: the first half of each
    chooses the threshold (:func:`choose_threshold`), the second half is counted. Scores of at
    most two values (e.g. "the output is the first label") leave no threshold to choose: every
    trial is counted at the one informative threshold. Returns the bound and the counted
    ``(tp, fn, fp, tn)``."""
    first = np.asarray(first, dtype=np.float64).ravel()
    second = np.asarray(second, dtype=np.float64).ravel()
    values = np.unique(np.concatenate([first, second]))
    if values.size <= 2 and first.size and second.size:
        c = counts(first, second, float(values[0]))
        return epsilon_lower(method, *c, delta=delta, confidence=confidence), c
    h1, h2 = first.size // 2, second.size // 2
    if min(h1, h2) < 1:
        raise ValueError("the audit needs at least 2 trials on each neighbour")
    t = choose_threshold(first[:h1], second[:h2], method=method, delta=delta, confidence=confidence)
    c = counts(first[h1:], second[h2:], t)
    return epsilon_lower(method, *c, delta=delta, confidence=confidence), c
