"""CRDP-FL's pure math (docs/methods/crdp-fl.md §7.2): record correlation, correlated
sensitivities and the MCD, the golden WDBC fixture, Laplace calibration, the DP
Pearson filter, the exponential mechanism and both accountants."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pytest
from scipy import stats
from sklearn.datasets import load_breast_cancer

from securevfl.csprng import SecretStream
from securevfl.privacy.accountant import LaplaceRelease, Mechanism, account, epsilon
from securevfl.privacy.correlated import (
    UnboundedRelease,
    communication_scale,
    correlated_sensitivity,
    correlation_matrix,
    count_global_sensitivity,
    distributed_cs,
    laplace_noise,
    match_counts,
    mean_correlated_degree,
    paper_epsilon,
    part_mean_degree,
    quantile_codes,
    raised_threshold,
    record_sensitivity,
    sound_epsilon,
    threshold_correlation,
    utility_sensitivity,
)
from securevfl.privacy.feature_selection import (
    SelectionConfig,
    em_probabilities,
    exponential_mechanism,
    generate_candidates,
    pca_leverage_selector,
    pearson_filter,
    pearson_matrix,
    pearson_noise_scale,
    row_subsets,
    select_features,
    stability_scores,
    utility,
)


@pytest.fixture(scope="module")
def wdbc() -> np.ndarray:
    return load_breast_cancer().data


@pytest.fixture(scope="module")
def wdbc_codes(wdbc) -> np.ndarray:
    return quantile_codes(wdbc, 10)


def _random_binned(seed: int, n: int = 40, d: int = 6, bins: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, bins, size=(n, d))


# -- correlation matrix -------------------------------------------------------------------


def test_w_symmetric_in_unit_interval_with_unit_diagonal(wdbc_codes):
    w = correlation_matrix(wdbc_codes[:120])
    assert np.array_equal(w, w.T)
    assert w.min() >= 0.0 and w.max() <= 1.0
    assert np.all(np.diag(w) == 1.0)
    assert (w[~np.eye(len(w), dtype=bool)] < 1.0).any()


def test_w_invariant_to_row_permutation(wdbc_codes):
    codes = wdbc_codes[:100]
    perm = np.random.default_rng(3).permutation(len(codes))
    w = correlation_matrix(codes)
    wp = correlation_matrix(codes[perm])
    assert np.array_equal(wp, w[np.ix_(perm, perm)])


def test_counts_are_additive_over_parties(wdbc_codes):
    """Per-party match counts sum to the counts of the concatenated columns: the
    basis of the secure (summed) path."""
    codes = wdbc_codes[:150]
    parts = [codes[:, :10], codes[:, 10:20], codes[:, 20:]]
    summed = sum(match_counts(p) for p in parts)
    assert np.array_equal(summed, match_counts(codes))
    assert np.allclose(summed / 30.0, correlation_matrix(codes))


def test_raw_continuous_wdbc_has_no_correlated_pair(wdbc):
    """Why discretisation is needed: on raw WDBC no off-diagonal w reaches 0.4,
    so Delta_CS is plain DP's s."""
    w = correlation_matrix(wdbc)
    off = w[~np.eye(len(w), dtype=bool)]
    assert off.max() < 0.4
    assert correlated_sensitivity(w, 0.4, s=1.0) == 1.0
    assert correlated_sensitivity(w, 0.4, s=2.5) == 2.5


def test_threshold_zeroes_below_w0():
    w = np.array([[1.0, 0.3, 0.5], [0.3, 1.0, 0.4], [0.5, 0.4, 1.0]])
    assert np.array_equal(
        threshold_correlation(w, 0.4), np.array([[1.0, 0.0, 0.5], [0.0, 1.0, 0.4], [0.5, 0.4, 1.0]])
    )


# -- sensitivity invariants (property tests over seeded random binned matrices) ----------


@pytest.mark.parametrize("seed", range(25))
def test_cs_between_s_and_gs_and_monotone_in_threshold(seed):
    rng = np.random.default_rng(seed)
    codes = _random_binned(seed, n=int(rng.integers(5, 50)), d=int(rng.integers(1, 8)))
    w = correlation_matrix(codes)
    s = float(rng.uniform(0.1, 3.0))
    w0s = sorted(rng.uniform(0.0, 1.0, size=2))
    for w0 in w0s:
        cs = correlated_sensitivity(w, w0, s)
        assert s - 1e-12 <= cs <= count_global_sensitivity(w, w0, s) + 1e-12
    assert correlated_sensitivity(w, w0s[1], s) <= correlated_sensitivity(w, w0s[0], s) + 1e-12
    # Theorem 3: raising the threshold to the guarded MCD never raises the sensitivity
    mcd = mean_correlated_degree([w], w0s[0])
    assert distributed_cs(w, raised_threshold(w0s[0], mcd), s) <= correlated_sensitivity(w, w0s[0], s) + 1e-12


def test_identity_correlation_gives_plain_dp():
    w = np.eye(7)
    assert correlated_sensitivity(w, 0.4, 2.0) == count_global_sensitivity(w, 0.4, 2.0) == 2.0


@pytest.mark.parametrize("seed", range(25))
def test_mcd_in_unit_interval_and_guard_at_least_w0(seed):
    rng = np.random.default_rng(100 + seed)
    w0 = float(rng.uniform(0.05, 0.95))
    parts = [correlation_matrix(_random_binned(seed * 7 + k, d=int(rng.integers(1, 6)))) for k in range(3)]
    mcd = mean_correlated_degree(parts, w0)
    assert 0.0 <= mcd <= 1.0
    if all(part_mean_degree(p, w0).k > 0 for p in parts):
        assert mcd >= w0 - 1e-12
    assert raised_threshold(w0, mcd) >= w0


def test_mcd_zero_without_correlated_records():
    assert mean_correlated_degree([np.eye(5)], 0.4) == 0.0
    assert raised_threshold(0.4, 0.0) == 0.4


def test_golden_fixture_wdbc(wdbc_codes):
    """docs/methods/crdp-fl.md §5: WDBC (all 569 rows), 10-quantile bins, three contiguous
    10-feature parts, w0 = 0.4, s = 1."""
    parts = [correlation_matrix(wdbc_codes[:, k : k + 10]) for k in (0, 10, 20)]
    degrees = [part_mean_degree(p, 0.4) for p in parts]
    assert [d.k for d in degrees] == [61, 57, 70]
    assert [round(d.delta, 1) for d in degrees] == [33.0, 29.3, 35.3]
    assert [round(d.mean, 3) for d in degrees] == [0.541, 0.514, 0.504]
    mcd = mean_correlated_degree(parts, 0.4)
    assert mcd == pytest.approx(0.51977, abs=1e-4)
    w = correlation_matrix(wdbc_codes)
    assert count_global_sensitivity(w, 0.4) == 40
    assert correlated_sensitivity(w, 0.4) == pytest.approx(19.533, abs=1e-3)
    assert distributed_cs(w, raised_threshold(0.4, mcd)) == pytest.approx(9.70, abs=1e-2)
    # removing features raises correlation (docs/methods/crdp-fl.md §2.6 step 5)
    prefix = [correlated_sensitivity(correlation_matrix(wdbc_codes[:, :k]), 0.4) for k in (5, 10, 15, 20, 30)]
    assert prefix == pytest.approx([41.2, 34.0, 27.667, 22.95, 19.533], abs=1e-3)


# -- noise calibration --------------------------------------------------------------------


def test_communication_noise_is_laplace_of_the_right_scale():
    scale = communication_scale(9.7, 0.5)
    assert scale == pytest.approx(19.4)
    x = laplace_noise((100_000,), scale, SecretStream.from_seed(0, "test"))
    assert stats.kstest(x, "laplace", args=(0.0, 19.4)).pvalue > 0.01
    assert abs(x.var() / (2 * 19.4**2) - 1.0) < 0.03
    assert abs(x.mean()) < 0.3  # std of the mean: sqrt(2) * 19.4 / sqrt(1e5) = 0.087


def test_noise_iid_across_elements_and_fresh_per_release():
    rng = SecretStream.from_seed(1, "test")
    a = laplace_noise((200, 50), 1.0, rng)
    b = laplace_noise((200, 50), 1.0, rng)
    assert not np.array_equal(a, b)
    assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 0.02
    assert abs(np.corrcoef(a[:, :-1].ravel(), a[:, 1:].ravel())[0, 1]) < 0.02


def test_infinite_eps3_means_no_noise():
    assert communication_scale(9.7, math.inf) == 0.0
    assert np.array_equal(laplace_noise((3, 2), 0.0, SecretStream.from_seed(0, "test")), np.zeros((3, 2)))
    with pytest.raises(ValueError):
        communication_scale(9.7, 0.0)


def test_record_sensitivity_modes():
    assert record_sensitivity("unit", d_out=16, clip=1.0) == 1.0
    assert record_sensitivity("clipped", d_out=16, clip=0.5) == 16.0
    with pytest.raises(ValueError):
        record_sensitivity("other", d_out=1, clip=1.0)


# -- Pearson DP ----------------------------------------------------------------------------


def test_pearson_scale_exact():
    assert pearson_noise_scale(1.0, 45, "paper") == 1.0
    assert pearson_noise_scale(0.5, 45, "paper") == 2.0
    assert pearson_noise_scale(1.0, 45, "strict") == 90.0  # 2 / (eps1 / C(10, 2))
    assert pearson_noise_scale(math.inf, 45, "strict") == 0.0


def test_pearson_filter_uses_the_scale_and_releases_every_pair(wdbc):
    x = (wdbc[:, :6] - wdbc[:, :6].mean(0)) / wdbc[:, :6].std(0)
    scores = np.ones(6)
    for mode, expected in (("paper", 1.0), ("strict", 2.0 * 15 / 1.0)):
        res = pearson_filter(
            x, range(6), scores, eps1=1.0, theta_per=0.9, mode=mode, rng=SecretStream.from_seed(0, "test")
        )
        assert res.scale == expected
        assert set(res.noisy) == set(combinations(range(6), 2))


def test_pearson_without_noise_is_the_deterministic_filter(wdbc):
    x = wdbc[:, :10]
    p = pearson_matrix(x)
    assert np.allclose(p, np.corrcoef(x.T))
    scores = np.linspace(1.0, 0.5, 10)
    res = pearson_filter(
        x,
        range(10),
        scores,
        eps1=math.inf,
        theta_per=0.9,
        mode="paper",
        rng=SecretStream.from_seed(0, "test"),
    )
    moved: list[int] = []
    for a, b in combinations(range(10), 2):
        if a not in moved and b not in moved and abs(p[a, b]) > 0.9:
            moved.append(b)  # b has the lower score here
    assert res.moved == moved and len(moved) > 0
    assert res.kept == [i for i in range(10) if i not in moved]


def test_duplicated_columns_exactly_one_moves():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(200, 3))
    x = np.column_stack([base, base[:, 1]])  # column 3 duplicates column 1
    res = pearson_filter(
        x,
        range(4),
        np.array([0.9, 0.8, 0.7, 0.8]),
        eps1=math.inf,
        theta_per=0.9,
        mode="paper",
        rng=SecretStream.from_seed(0, "test"),
    )
    assert res.moved == [3]  # tie on score goes to the higher index
    assert res.kept == [0, 1, 2]


# -- stability selection --------------------------------------------------------------------


def test_row_subsets_shards_partition_rows():
    shards = row_subsets(103, 5, "shards", SecretStream.from_seed(0, "test"))
    assert sorted(np.concatenate(shards).tolist()) == list(range(103))
    halves = row_subsets(100, 4, "subsamples", SecretStream.from_seed(0, "test"))
    assert all(len(h) == 50 and len(set(h.tolist())) == 50 for h in halves)


def test_stability_scores_are_vote_shares():
    x = np.zeros((10, 3))
    subsets = [np.arange(5), np.arange(5, 10), np.arange(10)]
    calls = iter([[True, False, True], [True, False, False], [True, True, False]])
    scores = stability_scores(x, subsets, lambda xs, ys: np.array(next(calls)))
    assert scores == pytest.approx([1.0, 1 / 3, 1 / 3])


def test_pca_leverage_marks_the_high_variance_block():
    rng = np.random.default_rng(0)
    big = rng.normal(size=(300, 1)) * 10
    x = np.column_stack([big + rng.normal(size=(300, 1)) * 0.1, big, rng.normal(size=(300, 3)) * 0.1])
    assert pca_leverage_selector(0.9)(x, None).tolist() == [True, True, False, False, False]


# -- exponential mechanism ---------------------------------------------------------------


def test_em_frequencies_match_softmax():
    u = np.array([-9.7, -12.0, -10.5, -15.0, -9.9])
    p = em_probabilities(u, 1.0, 1.0)
    assert p == pytest.approx(np.exp(u / 2) / np.exp(u / 2).sum())
    stream = SecretStream.from_seed(0, "test")
    draws = np.array([exponential_mechanism(u, 1.0, 1.0, stream) for _ in range(100_000)])
    counts = np.bincount(draws, minlength=len(u))
    assert stats.chisquare(counts, p * len(draws)).pvalue > 0.01


def test_em_limits():
    u = np.array([-3.0, -1.0, -2.0])
    assert em_probabilities(u, 1e-9, 1.0) == pytest.approx(np.full(3, 1 / 3), abs=1e-8)
    assert em_probabilities(u, 1e4, 1.0) == pytest.approx([0.0, 1.0, 0.0])
    assert em_probabilities(u, math.inf, 1.0).tolist() == [0.0, 1.0, 0.0]
    # the argmax of u = w0 - Delta is the min-sensitivity candidate; the ratio reading agrees
    delta = np.array([12.0, 9.0, 15.0])
    assert int(np.argmax(utility(0.4, delta))) == int(np.argmin(delta))
    assert int(np.argmax(utility(0.4, delta, "ratio"))) == int(np.argmin(delta))


def test_candidates_are_subsets_of_beta():
    beta = [1, 4, 6, 7, 9]
    cands = generate_candidates(beta, 0.5, 10, SecretStream.from_seed(0, "test"))
    assert len(cands) == 10
    assert all(set(c) <= set(beta) and len(c) == 3 for c in cands)
    assert generate_candidates([], 0.5, 10, SecretStream.from_seed(0, "test")) == [[]]


def test_pipeline_alpha_final_contains_alpha(wdbc):
    x = wdbc[:300, :10]
    x = (x - x.mean(0)) / x.std(0)
    for seed in range(5):
        sel = select_features(
            x, SelectionConfig(), SecretStream.from_seed(seed, "test"), selector=pca_leverage_selector(0.9)
        )
        assert set(sel.alpha) <= set(sel.alpha_final)
        assert set(sel.alpha_final) - set(sel.alpha) == set(sel.candidates[sel.chosen])
        assert all(set(c) <= set(sel.beta) for c in sel.candidates)
        assert sel.w0_raised >= 0.4
        assert 1.0 <= sel.delta_cs_p <= sel.delta_cs <= sel.delta_gs
        assert sel.delta_u == 1.0  # paper mode
    strict = select_features(
        x,
        SelectionConfig(delta_u="strict"),
        SecretStream.from_seed(0, "test"),
        selector=pca_leverage_selector(0.9),
    )
    assert strict.delta_u == 300.0  # n s


# -- accountants -----------------------------------------------------------------------------


@pytest.mark.parametrize(("m", "eps3", "t"), [(10, 0.2, 50), (1, 1.0, 0), (3, 0.01, 10)])
def test_paper_epsilon_formula(m, eps3, t):
    assert paper_epsilon(1.0, 1.0, m, eps3, t) == max(1.0, m + t * eps3)


def test_sound_epsilon_formula():
    assert sound_epsilon(3, 1.0, 1.0, 0.2, 50) == pytest.approx(3 + 1 + 10)
    assert sound_epsilon(1, 0.5, 2.0, 1.0, 0) == 2.5


def test_utility_sensitivity():
    assert utility_sensitivity("difference", n=100, s=2.0, w0=0.4) == 200.0
    assert utility_sensitivity("ratio", n=100, s=2.0, w0=0.4) == 0.2


def test_unbounded_release_is_infinite_and_composes():
    assert epsilon([UnboundedRelease(count=3)], 1e-5) == math.inf
    assert epsilon([UnboundedRelease(count=1), LaplaceRelease(count=2, scale=1.0)], 1e-5) == math.inf
    assert epsilon([UnboundedRelease(count=0), LaplaceRelease(count=2, scale=1.0)], 1e-5) == pytest.approx(
        2.0, abs=1e-3
    )
    out = account({"p": [Mechanism("x", (UnboundedRelease(count=1, reason="why"),))]}, 1e-5)
    assert out["p"]["mechanisms"]["x"]["releases"] == [{"kind": "unbounded", "reason": "why", "count": 1}]
