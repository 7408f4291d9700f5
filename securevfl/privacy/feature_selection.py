"""CRDP-FL's private feature selection and optimisation (docs/methods/crdp-fl.md §2.3, §2.4, §2.6): pure math.

The pipeline one organisation runs on its own training rows (Algorithm 1):

1. stability selection: score ``S_i = T_freq(f_i) / N_sub`` over row subsets with a
   pluggable base selector; features with ``S_i >= theta`` are important (§2.4(a));
2. a DP Pearson redundancy filter over important pairs, Laplace noise on every
   coefficient, one feature of each ``|P~| > theta_per`` pair moved to beta (§2.4(b));
3. the correlation threshold raised from ``w0`` to ``max(w0, MCD)`` (§2.5(e));
4. ``m`` candidate subsets of beta, one chosen by the exponential mechanism with
   utility ``w0 - Delta_CS_p(alpha + c)`` (§2.6); ``alpha_final = alpha + c*``;
5. ``Delta_CS_p`` of the final columns, the sensitivity the communication noise uses.

Threat model: as :mod:`securevfl.privacy.correlated` (central DP at the
organisation, honest-but-curious peers). The stability selection, the MCD and
``Delta_CS_p`` are computed from the data without noise (docs/methods/crdp-fl.md §6, items 3
and 10); only the Pearson coefficients (eps1) and the candidate choice (eps2) are
randomised.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np
from sklearn.linear_model import LogisticRegression

from securevfl.csprng import SecretStream
from securevfl.privacy.correlated import (
    apply_bins,
    correlated_sensitivity,
    count_global_sensitivity,
    fit_quantile_edges,
    match_counts,
    mean_correlated_degree,
    raised_threshold,
    utility_sensitivity,
)

#: a base selector: rows of one subset (and their labels, if any) -> boolean mask of important columns
Selector = Callable[[np.ndarray, "np.ndarray | None"], np.ndarray]


# -- stability selection (§2.4(a)) --------------------------------------------------------


def row_subsets(n: int, n_subsets: int, mode: str, rng: SecretStream) -> list[np.ndarray]:
    """The data subsets of stability selection.

    ``shards``: a random partition of the rows into ``n_subsets`` near-equal shards
    (docs/methods/crdp-fl.md's default: the organisation's client shards); ``subsamples``:
    ``n_subsets`` random half-size subsamples (classic stability selection)."""
    if n_subsets < 1:
        raise ValueError(f"n_subsets must be at least 1, got {n_subsets}")
    if mode == "shards":
        return [np.sort(s) for s in np.array_split(rng.permutation_np(n), n_subsets)]
    if mode == "subsamples":
        return [np.sort(rng.choice_np(n, max(1, n // 2))) for _ in range(n_subsets)]
    raise ValueError(f"unknown subset mode {mode!r}")


def l1_logistic_selector(c: float = 0.1) -> Selector:
    """docs/methods/crdp-fl.md's base selector: L1 logistic regression (liblinear, ``C``); a
    feature is important iff some class has a nonzero coefficient. Needs labels."""

    def select(x: np.ndarray, y: np.ndarray | None) -> np.ndarray:
        if y is None:
            raise ValueError("the l1_logistic base selector needs labels")
        model = LogisticRegression(penalty="l1", solver="liblinear", C=c).fit(x, y)
        return np.any(np.abs(model.coef_) > 0, axis=0)

    return select


def pca_leverage_selector(variance: float = 0.9) -> Selector:
    """A label-free base selector: the smallest number ``k`` of principal components
    explaining ``variance`` of the subset's variance, and each feature's leverage
    on them (``sum_c V[c, f]^2``, which sums to ``k``); a feature is important iff
    its leverage is at least the average ``k / d``.

    securevfl's passive parties hold no labels (the paper's organisations all
    do), so a supervised selector is not available to them."""
    if not 0.0 < variance <= 1.0:
        raise ValueError(f"variance must be in (0, 1], got {variance}")

    def select(x: np.ndarray, y: np.ndarray | None) -> np.ndarray:
        xc = x - x.mean(axis=0)
        _, sv, vt = np.linalg.svd(xc, full_matrices=False)
        ev = sv**2
        total = ev.sum()
        if total <= 0:
            return np.zeros(x.shape[1], dtype=bool)
        k = int(np.searchsorted(np.cumsum(ev) / total, variance - 1e-12) + 1)
        lev = (vt[:k] ** 2).sum(axis=0)
        return lev >= k / x.shape[1] - 1e-12

    return select


def stability_scores(
    x: np.ndarray, subsets: Sequence[np.ndarray], selector: Selector, y: np.ndarray | None = None
) -> np.ndarray:
    """Eq. 23: ``S_i = T_freq(f_i) / N_sub``, the share of subsets that mark feature i."""
    votes = np.zeros(x.shape[1])
    for idx in subsets:
        votes += selector(x[idx], None if y is None else y[idx]).astype(float)
    return votes / len(subsets)


# -- the DP Pearson filter (§2.4(b)) ------------------------------------------------------


def pearson_matrix(x: np.ndarray) -> np.ndarray:
    """Eq. 24 for every column pair (constant columns correlate 0 with everything)."""
    x = np.asarray(x, dtype=np.float64)
    xc = x - x.mean(axis=0)
    sd = np.sqrt((xc**2).mean(axis=0))
    safe = np.where(sd > 0, sd, 1.0)
    p = (xc.T @ xc) / x.shape[0] / np.outer(safe, safe)
    p[(sd == 0)[:, None] | (sd == 0)[None, :]] = 0.0
    return np.clip(p, -1.0, 1.0)


def pearson_noise_scale(eps1: float, n_pairs: int, mode: str) -> float:
    """Laplace scale per coefficient, ``Delta / eps_per_coefficient``.

    ``paper``: ``Delta_CS_per = 1`` and each coefficient gets the whole ``eps1``
    (the paper's claim; the max-over-pairs sensitivity and the [0, 1] range are
    both wrong, docs/methods/crdp-fl.md §6 item 4). ``strict``: global sensitivity 2 (Pearson is in
    [-1, 1]) and ``eps1`` split over the ``n_pairs`` coefficients by basic
    composition, so the whole release is ``eps1``-DP. 0 when ``eps1`` is infinite."""
    if eps1 <= 0:
        raise ValueError(f"eps1 must be positive, got {eps1}")
    if math.isinf(eps1):
        return 0.0
    if mode == "paper":
        return 1.0 / eps1
    if mode == "strict":
        return 2.0 * max(1, n_pairs) / eps1
    raise ValueError(f"unknown Pearson mode {mode!r}")


@dataclass(frozen=True)
class PearsonResult:
    kept: list[int]  # important features surviving the filter (column positions)
    moved: list[int]  # important features moved to beta, in the order moved
    scale: float  # Laplace scale used per coefficient
    noisy: dict[tuple[int, int], float]  # the released noisy coefficients


def pearson_filter(
    x: np.ndarray,
    important: Sequence[int],
    scores: np.ndarray,
    *,
    eps1: float,
    theta_per: float,
    mode: str,
    rng: SecretStream,
) -> PearsonResult:
    """Noise every important pair's ``P_{m,n}`` with ``Lap(scale)`` (all pairs are
    drawn, i.e. released, up front), then walk the pairs in order: where
    ``|P~| > theta_per`` and neither feature has been moved yet, move the one with
    the lower stability score (tie: the higher column index) to beta."""
    important = sorted(int(i) for i in important)
    pairs = list(combinations(important, 2))
    scale = pearson_noise_scale(eps1, len(pairs), mode)
    p = pearson_matrix(x) if pairs else np.zeros((0, 0))
    noise = rng.laplace_np((len(pairs),), scale) if scale > 0 else np.zeros(len(pairs))
    noisy = {(a, b): float(p[a, b] + e) for (a, b), e in zip(pairs, noise, strict=True)}
    moved: list[int] = []
    for (a, b), v in noisy.items():
        if a in moved or b in moved or abs(v) <= theta_per:
            continue
        moved.append(a if scores[a] < scores[b] else b)
    return PearsonResult([i for i in important if i not in moved], moved, scale, noisy)


# -- candidates and the exponential mechanism (§2.6) --------------------------------------


def generate_candidates(beta: Sequence[int], b: float, m: int, rng: SecretStream) -> list[list[int]]:
    """``m`` candidate subsets of beta, each ``ceil(b |beta|)`` features drawn
    uniformly without replacement (docs/methods/crdp-fl.md §2.6 step 1 [GAP] default). An empty
    beta gives one empty candidate."""
    beta = sorted(int(i) for i in beta)
    if not 0.0 < b <= 1.0:
        raise ValueError(f"b must be in (0, 1], got {b}")
    if not beta:
        return [[]]
    size = math.ceil(b * len(beta))
    return [sorted(int(i) for i in rng.choice_np(np.asarray(beta), size)) for _ in range(m)]


def utility(w0: float, delta_cs_p: np.ndarray, form: str = "difference") -> np.ndarray:
    """Eq. 32: ``u = w0 - Delta_CS_p(c)`` (default) or the ratio reading ``w0 / Delta_CS_p(c)``."""
    d = np.asarray(delta_cs_p, dtype=np.float64)
    if form == "difference":
        return w0 - d
    if form == "ratio":
        return w0 / d
    raise ValueError(f"unknown utility form {form!r}")


def em_probabilities(u: np.ndarray, eps2: float, delta_u: float) -> np.ndarray:
    """Eq. 33: ``softmax(eps2 u / (2 Delta_u))`` (computed stably; ``eps2 = inf``
    puts all mass uniformly on the maximisers)."""
    u = np.asarray(u, dtype=np.float64)
    if eps2 <= 0 or delta_u <= 0:
        raise ValueError("eps2 and delta_u must be positive")
    if math.isinf(eps2):
        best = u == u.max()
        return best / best.sum()
    a = eps2 * u / (2.0 * delta_u)
    a -= a.max()
    e = np.exp(a)
    return e / e.sum()


def exponential_mechanism(u: np.ndarray, eps2: float, delta_u: float, rng: SecretStream) -> int:
    """Draw one index with :func:`em_probabilities` (pure ``eps2``-DP when
    ``delta_u`` bounds the utility's sensitivity)."""
    p = em_probabilities(u, eps2, delta_u)
    return rng.weighted_index(p)


# -- the whole per-organisation pipeline (Algorithm 1) ------------------------------------


@dataclass(frozen=True)
class SelectionConfig:
    """Every knob of :func:`select_features` (docs/methods/crdp-fl.md §2.3-2.6, Table 1, [GAP] defaults)."""

    theta: float = 0.5
    theta_per: float = 0.9
    eps1: float = 1.0
    eps2: float = 1.0
    w0: float = 0.4
    b: float = 0.5
    m: int = 10
    q: int = 10
    n_subsets: int = 5
    subsets: str = "shards"
    pearson: str = "paper"
    utility: str = "difference"
    delta_u: str = "paper"
    beta_includes_unimportant: bool = True
    s: float = 1.0
    mcd_parts: int = 1
    select: bool = True  # False: keep every column (FS off), still compute the sensitivities


@dataclass(frozen=True)
class Selection:
    """What the pipeline decided, and the statistics behind it."""

    scores: list[float]
    important: list[int]
    alpha: list[int]
    beta: list[int]
    moved: list[int]
    pearson_scale: float
    mcd: float
    w0_raised: float
    candidates: list[list[int]]
    candidate_cs: list[float]
    em_probabilities: list[float]
    delta_u: float
    chosen: int
    alpha_final: list[int]
    delta_cs: float  # Delta_CS at the initial w0 on alpha_final (for comparison)
    delta_cs_p: float  # Delta_CS_p at the raised threshold on alpha_final
    delta_gs: float  # GDP-FL's count sensitivity on alpha_final at w0
    extra: dict[str, Any] = field(default_factory=dict)


def _cs_of(counts: np.ndarray, n_cols: int, w0: float, s: float) -> float:
    return correlated_sensitivity(counts / float(n_cols), w0, s) if n_cols else s


def select_features(
    x: np.ndarray,
    cfg: SelectionConfig,
    rng: SecretStream,
    *,
    selector: Selector,
    y: np.ndarray | None = None,
) -> Selection:
    """Algorithm 1 (DataAggregation) for one organisation on its standardised
    training rows ``x``; correlation is computed on ``q``-quantile bins of ``x``.

    Sensitivities are in units of the record sensitivity ``cfg.s``. The merged
    data of the paper is this organisation's own columns here (see
    :mod:`securevfl.privacy.secure_sum` for summing counts across organisations)."""
    n, d = x.shape
    if d == 0:
        raise ValueError("feature selection needs at least one column")
    if cfg.select:
        subsets = row_subsets(n, cfg.n_subsets, cfg.subsets, rng)
        scores = stability_scores(x, subsets, selector, y)
        important = [i for i in range(d) if scores[i] >= cfg.theta]
        pr = pearson_filter(
            x, important, scores, eps1=cfg.eps1, theta_per=cfg.theta_per, mode=cfg.pearson, rng=rng
        )
    else:  # every column is kept: alpha is everything, nothing is noised or chosen
        scores = np.ones(d)
        important = list(range(d))
        pr = PearsonResult(important, [], 0.0, {})
    alpha = pr.kept
    unimportant = [i for i in range(d) if i not in important]
    beta = sorted(pr.moved + (unimportant if cfg.beta_includes_unimportant else []))

    codes = apply_bins(x, fit_quantile_edges(x, cfg.q))
    parts = [p for p in np.array_split(np.arange(d), max(1, min(cfg.mcd_parts, d))) if len(p)]
    mcd = mean_correlated_degree([match_counts(codes[:, p]) / float(len(p)) for p in parts], cfg.w0)
    w_raised = raised_threshold(cfg.w0, mcd)

    def counts(cols: Sequence[int]) -> np.ndarray:
        return match_counts(codes[:, list(cols)]) if len(cols) else np.zeros((n, n), dtype=np.int32)

    base = counts(alpha)
    candidates = generate_candidates(beta, cfg.b, cfg.m, rng) if cfg.select else [[]]
    cand_cs = [_cs_of(base + counts(c), len(alpha) + len(c), w_raised, cfg.s) for c in candidates]
    delta_u = 1.0 if cfg.delta_u == "paper" else utility_sensitivity(cfg.utility, n=n, s=cfg.s, w0=cfg.w0)
    probs = em_probabilities(utility(cfg.w0, np.array(cand_cs), cfg.utility), cfg.eps2, delta_u)
    chosen = exponential_mechanism(utility(cfg.w0, np.array(cand_cs), cfg.utility), cfg.eps2, delta_u, rng)
    final = sorted(set(alpha) | set(candidates[chosen]))
    if not final:  # nothing survived: keep the best-scored feature so the party still has an input
        final = [int(np.argmax(scores))]
    fc = counts(final)
    w_final = fc / float(len(final))
    return Selection(
        scores=[float(v) for v in scores],
        important=important,
        alpha=alpha,
        beta=beta,
        moved=pr.moved,
        pearson_scale=pr.scale,
        mcd=mcd,
        w0_raised=w_raised,
        candidates=candidates,
        candidate_cs=cand_cs,
        em_probabilities=[float(p) for p in probs],
        delta_u=delta_u,
        chosen=chosen,
        alpha_final=final,
        delta_cs=correlated_sensitivity(w_final, cfg.w0, cfg.s),
        delta_cs_p=correlated_sensitivity(w_final, w_raised, cfg.s),
        delta_gs=count_global_sensitivity(w_final, cfg.w0, cfg.s),
        extra={"pearson_pairs": len(pr.noisy)},
    )
