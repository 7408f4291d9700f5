"""Correlated differential privacy for CRDP-FL (docs/methods/crdp-fl.md §2.5, §2.7, §2.8): pure math.

Record correlation here is the *feature-oriented* similarity of docs/methods/crdp-fl.md Def. 9:
two records are correlated to degree ``w_ij = match(i, j) / l``, the share of the
``l`` considered features on which their (discretised) values agree. Correlated
sensitivity (Eqs. 20-21) inflates a query's record sensitivity ``s`` by the
thresholded degrees of a record's correlated rows, so that the Laplace noise of
the communication step covers them too.

Threat model (docs/methods/crdp-fl.md §1): organisations are honest-but-curious towards each
other; the noise is added by the organisation (a curator) over its whole dataset,
so this is central DP at organisation level, not LDP as the paper says.

Everything here is a pure function of its arguments (random draws take an
explicit ``numpy.random.Generator``), with the known flaws of the paper kept as
named options next to their fixes (docs/methods/crdp-fl.md §6):

* thresholds and sensitivities are data-dependent (local sensitivity), so the
  noise scale itself leaks; the accountants below cannot cover that;
* :func:`paper_epsilon` reproduces the paper's total ``max(eps1, m eps2 + t eps3)``;
  :func:`sound_epsilon` is docs/methods/crdp-fl.md's corrected basic composition.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from securevfl.csprng import SecretStream
from securevfl.privacy.accountant import VALUE_DISCRETIZATION, Release

# -- discretisation (docs/methods/crdp-fl.md §2.5(a) [GAP], §4 preprocessing) ---------------------------


def fit_quantile_edges(x: np.ndarray, q: int = 10) -> list[np.ndarray]:
    """Per-column interior quantile edges (``q - 1`` of them) for ``q`` bins.

    Exact matches almost never happen on continuous data, so correlation is
    computed on bin ids (docs/methods/crdp-fl.md §2.5(a)); the edges are fitted on training rows."""
    if q < 2:
        raise ValueError(f"q must be at least 2, got {q}")
    x = np.asarray(x, dtype=np.float64)
    probs = np.linspace(0.0, 1.0, q + 1)[1:-1]
    return [np.quantile(x[:, j], probs) for j in range(x.shape[1])]


def apply_bins(x: np.ndarray, edges: Sequence[np.ndarray]) -> np.ndarray:
    """Bin ids (``searchsorted`` on the edges, side ``left``), one column per feature."""
    x = np.asarray(x, dtype=np.float64)
    if x.shape[1] != len(edges):
        raise ValueError(f"{x.shape[1]} columns but {len(edges)} sets of bin edges")
    out = np.empty(x.shape, dtype=np.int64)
    for j, e in enumerate(edges):
        out[:, j] = np.searchsorted(e, x[:, j], side="left")
    return out


def quantile_codes(x: np.ndarray, q: int = 10) -> np.ndarray:
    """Bin ids of ``x`` under its own per-column ``q``-quantile edges."""
    return apply_bins(x, fit_quantile_edges(x, q))


# -- record correlation (Def. 9, Eqs. 27-28, count reading) ------------------------------


def match_counts(codes: np.ndarray, *, block: int = 512) -> np.ndarray:
    """``M_ij = #{m : codes[i, m] == codes[j, m]}``, an ``n x n`` integer matrix.

    Counts are additive over disjoint column sets (``M(A + B) = M(A) + M(B)``),
    which is what lets parties sum their own counts (securely) to the merged
    data's counts (docs/methods/crdp-fl.md §2.5(f)). Computed in row blocks to bound memory."""
    codes = np.asarray(codes)
    n = codes.shape[0]
    out = np.zeros((n, n), dtype=np.int32)
    for start in range(0, n, block):
        stop = min(n, start + block)
        out[start:stop] = (codes[start:stop, None, :] == codes[None, :, :]).sum(axis=2)
    return out


def correlation_matrix(codes: np.ndarray) -> np.ndarray:
    """``w_ij = match(i, j) / l`` (symmetric, in [0, 1], diagonal 1)."""
    codes = np.asarray(codes)
    if codes.ndim != 2 or codes.shape[1] == 0:
        raise ValueError("correlation needs a 2-d matrix with at least one column")
    return match_counts(codes) / float(codes.shape[1])


def threshold_correlation(w: np.ndarray, w0: float) -> np.ndarray:
    """Eq. 19: ``w'_ij = w_ij`` where ``w_ij >= w0``, else 0."""
    w = np.asarray(w, dtype=np.float64)
    return np.where(w >= w0, w, 0.0)


def correlated_sensitivity(w: np.ndarray, w0: float, s: float = 1.0) -> float:
    """Eqs. 20-21: ``Delta_CS = max_i sum_j w'_ij s_j`` with ``s_j = s``.

    The self term ``w_ii = 1`` is included, so without correlated records the
    result is ``s`` (plain record-level DP)."""
    return float(threshold_correlation(w, w0).sum(axis=1).max() * s)


def count_global_sensitivity(w: np.ndarray, w0: float, s: float = 1.0) -> float:
    """GDP-FL's count sensitivity: ``max_i #{j : w_ij >= w0} s`` (self counted).

    Because ``0 <= w <= 1`` this is never below :func:`correlated_sensitivity`."""
    w = np.asarray(w, dtype=np.float64)
    return float((w >= w0).sum(axis=1).max() * s)


def distributed_cs(w_merged: np.ndarray, mcd: float, s: float = 1.0) -> float:
    """Eq. 30: ``Delta_CS_p``, the correlated sensitivity of the merged (selected
    feature) data thresholded at the raised threshold ``w0 = MCD``."""
    return correlated_sensitivity(w_merged, mcd, s)


@dataclass(frozen=True)
class PartDegree:
    """One part's contribution to the MCD (docs/methods/crdp-fl.md §2.5(e))."""

    mean: float  # Delta_CS^n / k_n (0 if k_n = 0)
    delta: float  # Delta_CS^n: off-diagonal thresholded row sum of the busiest record
    k: int  # correlated records of that record (excluding itself)
    row: int  # i*


def part_mean_degree(w: np.ndarray, w0: float) -> PartDegree:
    """Steps 1-4 of docs/methods/crdp-fl.md §2.5(e) on one part's correlation matrix."""
    wt = threshold_correlation(w, w0)
    np.fill_diagonal(wt, 0.0)
    sums = wt.sum(axis=1)
    i = int(np.argmax(sums))
    k = int((wt[i] > 0).sum())
    delta = float(sums[i])
    return PartDegree(delta / k if k else 0.0, delta, k, i)


def mean_correlated_degree(parts: Sequence[np.ndarray], w0: float) -> float:
    """Eq. 29: ``MCD = (1/N) sum_n mean_n`` over the parts' correlation matrices.

    In [0, 1], and at least ``w0`` whenever every part has a correlated record
    (each counted weight is ``>= w0``). Use :func:`raised_threshold` for the
    guarded value that Theorem 3 needs."""
    if not parts:
        raise ValueError("mean_correlated_degree needs at least one part")
    return float(np.mean([part_mean_degree(w, w0).mean for w in parts]))


def raised_threshold(w0: float, mcd: float) -> float:
    """The guard ``max(w0, MCD)`` (docs/methods/crdp-fl.md §6, Theorem 3's premise)."""
    return max(w0, mcd)


# -- Laplace noise on what a party releases (Eq. 31, Alg. 5 line 9) ----------------------


def laplace_noise(shape: tuple[int, ...], scale: float, rng: SecretStream) -> np.ndarray:
    """I.i.d. ``Lap(0, scale)`` draws; zeros for ``scale == 0`` (noise off)."""
    if scale < 0 or math.isnan(scale):
        raise ValueError(f"Laplace scale must be >= 0, got {scale}")
    if scale == 0.0:
        return np.zeros(shape)
    return rng.laplace_np(shape, scale)


def communication_scale(delta_cs_p: float, eps3: float) -> float:
    """Per-element Laplace scale ``Delta_CS_p / eps3`` (0 when ``eps3`` is infinite)."""
    if eps3 <= 0:
        raise ValueError(f"eps3 must be positive, got {eps3}")
    return 0.0 if math.isinf(eps3) else delta_cs_p / eps3


def record_sensitivity(mode: str, *, d_out: int, clip: float) -> float:
    """Record-level L1 sensitivity ``s`` of one released row (docs/methods/crdp-fl.md §2.5(c)).

    ``unit``: ``s = 1`` as the paper assumes, with nothing enforcing it;
    ``clipped``: each coordinate clipped to ``[-clip, clip]``, so replacing one
    record moves its row by at most ``2 d_out clip`` in L1 (replace-one neighbours)."""
    if mode == "unit":
        return 1.0
    if mode == "clipped":
        return 2.0 * d_out * clip
    raise ValueError(f"unknown sensitivity mode {mode!r}")


# -- the two accountants (docs/methods/crdp-fl.md §2.8) --------------------------------------------------


def paper_epsilon(eps1: float, eps2: float, m: int, eps3: float, t: int) -> float:
    """The paper's claimed total ``max(eps1, m eps2 + t eps3)`` (docs/methods/crdp-fl.md §2.8; unsound,
    §6)."""
    return max(eps1, m * eps2 + t * eps3)


def sound_epsilon(n_orgs: int, eps1: float, eps2: float, eps3: float, t: int) -> float:
    """docs/methods/crdp-fl.md's corrected basic composition ``N eps1 + eps2 + t eps3``: every
    organisation's Pearson release touches the same individual, the exponential
    mechanism costs ``eps2`` once, and each of the ``t`` rounds costs ``eps3``.
    It still takes the paper's sensitivities at face value."""
    return n_orgs * eps1 + eps2 + t * eps3


def utility_sensitivity(form: str, *, n: int, s: float, w0: float) -> float:
    """A bound on how far one replaced record moves the EM utility (docs/methods/crdp-fl.md §2.6 step 4).

    ``difference`` (``u = w0 - Delta_CS_p``): replacing record r can rewrite row r
    of ``w`` (its row sum moves by up to ``(n - 1) s``) and one entry of every
    other row (by up to ``s``), so the max row sum moves by at most ``n s``.
    ``ratio`` (``u = w0 / Delta_CS_p`` with ``Delta_CS_p`` in ``[s, n s]``): at most ``w0 / s``."""
    if form == "difference":
        return float(n) * s
    if form == "ratio":
        return w0 / s
    raise ValueError(f"unknown utility form {form!r}")


@dataclass(frozen=True)
class UnboundedRelease(Release):
    """A release with no finite record-level guarantee (no noise, or a
    sensitivity nothing enforces): the accountant reports ``epsilon = inf`` for
    any ``delta < 1/2``, and so does everything it is composed with.

    Represented as a privacy-loss distribution with half its mass at infinite
    loss, which ``dp_accounting`` composes like any other."""

    reason: str = ""

    def pld(self) -> pld_lib.PrivacyLossDistribution | None:
        if self.count == 0:
            return None
        pmf = pld_pmf.create_pmf({0: 0.5}, VALUE_DISCRETIZATION, 0.5, True)
        return pld_lib.PrivacyLossDistribution(pmf)

    def describe(self) -> dict[str, Any]:
        return {"kind": "unbounded", "reason": self.reason, "count": self.count}


# -- the merged data of several organisations (docs/methods/crdp-fl.md §2.5(e)-(f), §7.3) ---------------


@dataclass(frozen=True)
class MergedSensitivity:
    """``Delta_CS_p`` of the merged (all-organisation, selected-column) data and
    what it was computed from (docs/methods/crdp-fl.md §2.5(f), Eq. 30)."""

    delta_unit: float  # max_i sum_j [w_ij >= threshold] w_ij on the merged counts: Delta_CS_p at s = 1
    n_features: int  # l: the organisations' kept columns, summed
    mcd: float  # Eq. 29 with the organisations as the parts: the mean of their MCDs
    threshold: float  # max(w0, mcd)
    parties: int  # organisations whose counts were summed


def merged_threshold(w0: float, mcds: Sequence[float]) -> float:
    """The raised threshold of the merged data: Eq. 29 takes the mean over the
    parts, here the organisations' own MCDs, guarded as in :func:`raised_threshold`."""
    if not mcds:
        raise ValueError("merged_threshold needs at least one organisation's MCD")
    return raised_threshold(w0, float(np.mean(mcds)))


def count_threshold(threshold: float, n_features: int) -> int:
    """The smallest match count ``k`` with ``k / l >= threshold``: ``w_ij >= t``
    on ``l`` columns is ``M_ij >= ceil(t l)`` for integer counts ``M_ij``."""
    if n_features < 1:
        raise ValueError("n_features must be at least 1")
    return math.ceil(threshold * n_features - 1e-9)


def merged_correlated_sensitivity(
    counts: Sequence[np.ndarray], n_features: Sequence[int], mcds: Sequence[float], w0: float
) -> MergedSensitivity:
    """Eq. 30 on the merged data, in the clear: ``M = sum_r M_r`` over the
    organisations' match-count matrices of the same rows in the same order,
    ``l = sum_r l_r``, threshold ``max(w0, mean MCD)``; ``delta_unit`` is at
    ``s = 1`` (each organisation scales by its own record sensitivity).

    The reference for :func:`securevfl.privacy.secure_sum.secure_merged_sensitivity`,
    which computes the same in MPC and opens only the scalars."""
    if not counts or not (len(counts) == len(n_features) == len(mcds)):
        raise ValueError("one count matrix, column count and MCD per organisation")
    total = np.sum([np.asarray(c, dtype=np.int64) for c in counts], axis=0)
    l_total = int(sum(n_features))
    thr = merged_threshold(w0, mcds)
    mask = total >= count_threshold(thr, l_total)
    delta = float((total * mask).sum(axis=1).max()) / l_total
    return MergedSensitivity(delta, l_total, float(np.mean(mcds)), thr, len(counts))
