"""Pure metric math for attacks (docs/design.md §6): reconstruction error, image
similarity, inference AUC/accuracy, and VFLAIR's defense capability score.

Everything here takes arrays and returns numbers; nothing knows about parties,
views or runs, so each function is unit-tested on its own
(tests/unit/test_attack_metrics.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from sklearn.metrics import adjusted_mutual_info_score

from securevfl.privacy.audit_math import epsilon_lower_from_counts
from securevfl.privacy.dcor import v_dcor2

#: the confidence of the lower bound a record-level attack's counts imply
TEST_CONFIDENCE = 0.95


def mse(pred: np.ndarray, true: np.ndarray) -> float:
    """Mean over all elements of ``(pred - true)**2``."""
    pred, true = np.asarray(pred, dtype=np.float64), np.asarray(true, dtype=np.float64)
    if pred.shape != true.shape:
        raise ValueError(f"shape mismatch: {pred.shape} vs {true.shape}")
    return float(np.mean((pred - true) ** 2))


def normalized_mse(pred: np.ndarray, true: np.ndarray, mean: np.ndarray) -> dict[str, float]:
    """Reconstruction error relative to the attacker who predicts ``mean`` (its
    auxiliary column means) for every row (docs/methods/dravl.md §5, "attacker hygiene").

    Returns ``mse`` (raw), ``mse_mean`` (the mean predictor's), ``nmse_raw`` =
    mse / mse_mean and ``nmse`` = min(nmse_raw, 1): an attacker that does worse
    than the mean predictor would simply answer the mean, so it is never scored
    as leaking less than nothing. nmse 0 = perfect reconstruction, 1 = no leakage
    in the MSE sense.
    """
    true = np.asarray(true, dtype=np.float64)
    base = np.broadcast_to(np.asarray(mean, dtype=np.float64), true.shape)
    m = mse(pred, true)
    m0 = mse(base, true)
    raw = m / m0 if m0 > 0 else (0.0 if m == 0 else math.inf)
    return {"mse": m, "mse_mean": m0, "nmse_raw": raw, "nmse": min(raw, 1.0)}


def per_feature_r2(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    """``1 - MSE_j / Var_j`` per column j (docs/methods/dravl.md §5: per-feature R² = 1 - nMSE_j);
    nan for a constant column."""
    pred, true = np.asarray(pred, dtype=np.float64), np.asarray(true, dtype=np.float64)
    if pred.shape != true.shape or true.ndim != 2:
        raise ValueError(
            f"expected two (rows, features) arrays of one shape, got {pred.shape} and {true.shape}"
        )
    err = ((pred - true) ** 2).mean(axis=0)
    var = true.var(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(var > 0, 1.0 - err / var, np.nan)


def log_loss(prob: np.ndarray, labels: np.ndarray, eps: float = 1e-7) -> float:
    """Binary cross-entropy of predicted probabilities (clipped to [eps, 1 - eps])."""
    p = np.clip(np.asarray(prob, dtype=np.float64), eps, 1 - eps)
    y = np.asarray(labels, dtype=np.float64)
    if p.shape != y.shape:
        raise ValueError(f"shape mismatch: {p.shape} vs {y.shape}")
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def psnr(pred: np.ndarray, true: np.ndarray, data_range: float) -> float:
    """Peak signal-to-noise ratio in dB over all elements, ``10 log10(L^2 / MSE)``."""
    if data_range <= 0:
        raise ValueError("data_range must be positive")
    m = mse(pred, true)
    return math.inf if m == 0 else 10.0 * math.log10(data_range**2 / m)


def gaussian_window(size: int, sigma: float = 1.5) -> np.ndarray:
    """Normalized 2-D Gaussian window (size x size)."""
    ax = np.arange(size, dtype=np.float64) - (size - 1) / 2.0
    g = np.exp(-(ax**2) / (2 * sigma**2))
    w = np.outer(g, g)
    return w / w.sum()


def _filter_valid(img: np.ndarray, w: np.ndarray) -> np.ndarray:
    """'valid' 2-D correlation of a batch of images (n, H, W) with window w."""
    k = w.shape[0]
    n, h, wd = img.shape
    out = np.zeros((n, h - k + 1, wd - k + 1))
    for i in range(k):
        for j in range(k):
            out += w[i, j] * img[:, i : i + h - k + 1, j : j + wd - k + 1]
    return out


def ssim(
    pred: np.ndarray, true: np.ndarray, data_range: float, *, win: int = 7, sigma: float = 1.5
) -> np.ndarray:
    """Per-image SSIM (Wang et al. 2004; docs/methods/hashvfl.md §5.3) of batches (n, H, W).

    Gaussian window with ``sigma`` 1.5; its size is ``win`` shrunk to the largest
    odd number that fits the image (8x4 digit halves use 3x3), statistics over
    valid positions only; C1 = (0.01 L)^2, C2 = (0.03 L)^2. Returns one value per
    image in [-1, 1] (1 = identical).
    """
    x = np.asarray(pred, dtype=np.float64)
    y = np.asarray(true, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 3:
        raise ValueError(f"ssim needs two (n, H, W) batches of the same shape, got {x.shape}, {y.shape}")
    k = min(win, x.shape[1], x.shape[2])
    k = k if k % 2 == 1 else k - 1
    w = gaussian_window(k, sigma)
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    mx, my = _filter_valid(x, w), _filter_valid(y, w)
    sxx = _filter_valid(x * x, w) - mx**2
    syy = _filter_valid(y * y, w) - my**2
    sxy = _filter_valid(x * y, w) - mx * my
    num = (2 * mx * my + c1) * (2 * sxy + c2)
    den = (mx**2 + my**2 + c1) * (sxx + syy + c2)
    return (num / den).reshape(x.shape[0], -1).mean(axis=1)


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC of ``scores`` for ``labels`` in {0, 1} (ties count one half),
    by the Mann-Whitney rank statistic. NaN when only one class is present."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels).astype(bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return math.nan
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s), dtype=np.float64)
    sorted_s = s[order]
    i = 0
    while i < len(s):  # average ranks over ties
        j = i
        while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def leak_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """max(AUC, 1 - AUC): the attacker's AUC when it does not know which side of
    its score the positive class lies on (Li et al. 2022, "leak AUC"). 0.5 is
    chance; 1 is perfect separation."""
    a = roc_auc(scores, labels)
    return a if math.isnan(a) else max(a, 1.0 - a)


def accuracy(pred: np.ndarray, true: np.ndarray) -> float:
    pred, true = np.asarray(pred), np.asarray(true)
    if pred.shape != true.shape:
        raise ValueError(f"shape mismatch: {pred.shape} vs {true.shape}")
    return float(np.mean(pred == true)) if pred.size else math.nan


def dcs(mp: float, ap: float, mp_ref: float, ap_ideal: float = 0.0, beta: float = 0.5) -> float:
    """VFLAIR's defense capability score of one defended run (MP, AP):

        DCS = 1 / (1 + sqrt((1 - beta) (AP - AP*)^2 + beta (MP - MP*)^2))

    with the ideal defense point (AP*, MP*) = (``ap_ideal``, ``mp_ref``): the
    attack does no better than chance (``ap_ideal``: 0 for normalized scores,
    0.5 for AUC or balanced membership accuracy) while the model keeps the main
    performance of the undefended reference run (``mp_ref``). MP and AP are in
    [0, 1]; DCS is in (0, 1], 1 = ideal. ``beta`` weighs utility against privacy.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError("beta must lie in [0, 1]")
    d = math.sqrt((1 - beta) * (ap - ap_ideal) ** 2 + beta * (mp - mp_ref) ** 2)
    return 1.0 / (1.0 + d)


def total_variation(img: np.ndarray) -> float:
    """Isotropic total variation of one (H, W) image (docs/methods/hashvfl.md §5.2), summed over
    the pixels that have both a lower and a right neighbour."""
    x = np.asarray(img, dtype=np.float64)
    dx = x[1:, :-1] - x[:-1, :-1]
    dy = x[:-1, 1:] - x[:-1, :-1]
    return float(np.sqrt(dx**2 + dy**2).sum())


def dcor_pixels(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    """Per-image distance correlation over pixels (Székely; docs/methods/hashvfl.md §5.3, DCOR).

    Each pair of images (``pred[k]``, ``true[k]``) is flattened to two vectors a
    and b whose pixels are the paired samples; with A and B the double-centred
    matrices of |a_k - a_l| and |b_k - b_l|, dCov^2 = mean(A*B) and
    dCor = sqrt(dCov^2(a, b) / sqrt(dCov^2(a, a) dCov^2(b, b))), computed in
    float64 by :func:`securevfl.privacy.dcor.v_dcor2` without its smoothing eps
    (no gradient is needed), so dCor(x, x) = 1. An image with constant pixels has
    distance variance 0; its dCor is 0 (Székely's convention). Returns one value
    per image in [0, 1] (1 = an affine copy; 0 = independent)."""
    x = np.asarray(pred, dtype=np.float64)
    y = np.asarray(true, dtype=np.float64)
    if x.shape != y.shape or x.ndim < 2:
        raise ValueError(f"dcor_pixels needs two (n, ...) batches of one shape, got {x.shape}, {y.shape}")
    out = np.zeros(x.shape[0])
    for k in range(x.shape[0]):
        a, b = x[k].reshape(-1).copy(), y[k].reshape(-1).copy()  # broadcast views are read-only
        if np.ptp(a) == 0 or np.ptp(b) == 0:
            continue
        out[k] = math.sqrt(float(v_dcor2(torch.from_numpy(a), torch.from_numpy(b), eps=0.0)))
    return out


def pixel_distribution(img: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """One image as a distribution over its pixels: shifted by its own minimum
    to be non-negative, normalised to sum 1, then floored by mixing in ``eps``
    of the uniform mass per pixel (``(p + eps) / (1 + n eps)``) so that no pixel
    has probability 0. A constant image gives the uniform distribution."""
    s = np.asarray(img, dtype=np.float64).reshape(-1)
    s = s - s.min()
    total = s.sum()
    p = s / total if total > 0 else np.full(s.shape, 1.0 / s.size)
    return (p + eps) / (1.0 + s.size * eps)


def kld_pixels(raw: np.ndarray, rec: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Per-image KL(P_raw || P_rec) in nats between pixel distributions (docs/methods/hashvfl.md §5.3, KLD;
    the paper leaves the definition open): each image becomes a distribution over its pixel positions by
    :func:`pixel_distribution` (shift to its minimum, normalise to sum 1, ``eps`` floor). The shift and
    normalisation make the value blind to brightness offset and contrast: it compares where the
    intensity mass lies. 0 for identical images (and for affine copies with a
    positive scale); larger means less alike (less leakage). Returns one value per
    image pair, shape (n,)."""
    x = np.asarray(raw, dtype=np.float64)
    y = np.asarray(rec, dtype=np.float64)
    if x.shape != y.shape or x.ndim < 2:
        raise ValueError(f"kld_pixels needs two (n, ...) batches of one shape, got {x.shape}, {y.shape}")
    out = np.zeros(x.shape[0])
    for k in range(x.shape[0]):
        p, q = pixel_distribution(x[k], eps), pixel_distribution(y[k], eps)
        out[k] = float(np.sum(p * np.log(p / q)))
    return out


def adjusted_mutual_info(labels: np.ndarray, clusters: np.ndarray) -> float:
    """Adjusted mutual information (Vinh et al. 2010; arithmetic-mean
    normalisation, as scikit-learn's default) between true labels and cluster
    ids: 1 for a relabelling of the truth, about 0 (can be slightly negative) for
    clusters independent of the labels."""
    y, c = np.asarray(labels), np.asarray(clusters)
    if y.shape != c.shape or y.ndim != 1:
        raise ValueError(f"need two 1-d label arrays of one length, got {y.shape} and {c.shape}")
    return float(adjusted_mutual_info_score(y, c))


def matched_accuracy(labels: np.ndarray, clusters: np.ndarray) -> float:
    """Accuracy of clusters read as labels under the best one-to-one cluster ->
    label matching (Hungarian assignment on the contingency table). Clusters
    left unmatched (more clusters than labels) count as wrong."""
    y, c = np.asarray(labels), np.asarray(clusters)
    if y.shape != c.shape or y.ndim != 1:
        raise ValueError(f"need two 1-d label arrays of one length, got {y.shape} and {c.shape}")
    if not y.size:
        return math.nan
    ys, yi = np.unique(y, return_inverse=True)
    cs, ci = np.unique(c, return_inverse=True)
    table = np.zeros((len(cs), len(ys)), dtype=np.int64)
    np.add.at(table, (ci, yi), 1)
    r, k = linear_sum_assignment(table, maximize=True)
    return float(table[r, k].sum() / y.size)


@dataclass(frozen=True)
class RecordTest:
    """A record-level attack read as a test of each record's secret (its label): the counts
    of the test "the attacker says positive" against the truth, and the lower bound on
    epsilon they imply (:func:`securevfl.privacy.audit_math.epsilon_lower_from_counts`,
    Clopper-Pearson at ``confidence``; Jagielski, Ullman, Oprea 2020).

    ``rule`` says how the attacker decided: ``threshold`` (score above ``threshold``, or
    below it for ``orientation`` "low", both chosen on ``chosen_on`` held-out rows that are
    not counted, so the bound is not chosen with hindsight) or ``decision`` (the attack's own
    decision, e.g. its arg-max class: nothing is chosen, every row is counted).

    The trials are different records, not one record's neighbours: the bound says how well
    the attacker tells labels apart with everything it holds, its own features included (which
    may predict labels without any mechanism releasing them). It is evidence to read beside
    the claim, not an audit verdict (docs/privacy.md, "The audit")."""

    tp: int
    fn: int
    fp: int
    tn: int
    positive: int
    rule: Literal["threshold", "decision"]
    threshold: float | None
    orientation: Literal["high", "low"] | None
    chosen_on: int
    delta: float
    confidence: float
    epsilon_lower: float

    @property
    def tpr(self) -> float:
        return self.tp / (self.tp + self.fn)

    @property
    def fpr(self) -> float:
        return self.fp / (self.fp + self.tn)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "tpr": self.tpr, "fpr": self.fpr}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RecordTest:
        """From its :meth:`to_json` form (the derived rates are recomputed, not read)."""
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


def confusion(said: np.ndarray, truth: np.ndarray) -> tuple[int, int, int, int]:
    """``(tp, fn, fp, tn)`` of boolean decisions ``said`` against boolean ``truth``."""
    s, t = np.asarray(said, dtype=bool), np.asarray(truth, dtype=bool)
    if s.shape != t.shape:
        raise ValueError(f"shape mismatch: {s.shape} vs {t.shape}")
    return (
        int(np.sum(s & t)),
        int(np.sum(~s & t)),
        int(np.sum(s & ~t)),
        int(np.sum(~s & ~t)),
    )


def _bound(c: tuple[int, int, int, int], delta: float, confidence: float) -> float:
    tp, fn, fp, tn = c
    return epsilon_lower_from_counts(tp, fn, fp, tn, delta=delta, confidence=confidence)


def choose_threshold(
    scores: np.ndarray, truth: np.ndarray, *, delta: float, confidence: float, candidates: int = 64
) -> tuple[float, Literal["high", "low"]]:
    """The threshold (among ``candidates`` quantiles of ``scores``) and side ("high": score
    above it says positive; "low": below) whose counts on these rows give the largest bound.
    Call it on rows that are not counted afterwards."""
    s, t = np.asarray(scores, dtype=np.float64), np.asarray(truth, dtype=bool)
    qs = np.unique(np.quantile(s, np.linspace(0.0, 1.0, candidates + 2)[1:-1]))
    best: tuple[float, float, Literal["high", "low"]] = (-1.0, float(np.median(s)), "high")
    for q in qs:
        for side in ("high", "low"):
            said = s > q if side == "high" else s <= q
            eps = _bound(confusion(said, t), delta, confidence)
            if eps > best[0]:
                best = (eps, float(q), side)
    return best[1], best[2]


def threshold_test(
    scores: np.ndarray,
    truth: np.ndarray,
    *,
    positive: int,
    seed: int,
    delta: float,
    confidence: float = TEST_CONFIDENCE,
) -> RecordTest | None:
    """A score attack as a :class:`RecordTest`: a seeded half of the rows chooses the
    threshold and side (:func:`choose_threshold`), the other half is counted. None when
    either half lacks a positive or a negative row (no rate to bound)."""
    s, t = np.asarray(scores, dtype=np.float64), np.asarray(truth, dtype=bool)
    order = np.random.default_rng(seed).permutation(len(s))
    pick, count = order[: len(s) // 2], order[len(s) // 2 :]
    if any(t[h].all() or not t[h].any() for h in (pick, count)):
        return None
    thr, side = choose_threshold(s[pick], t[pick], delta=delta, confidence=confidence)
    said = s[count] > thr if side == "high" else s[count] <= thr
    c = confusion(said, t[count])
    return RecordTest(
        *c,
        positive=positive,
        rule="threshold",
        threshold=thr,
        orientation=side,
        chosen_on=len(pick),
        delta=delta,
        confidence=confidence,
        epsilon_lower=_bound(c, delta, confidence),
    )


def decision_test(
    said: np.ndarray, truth: np.ndarray, *, positive: int, delta: float, confidence: float = TEST_CONFIDENCE
) -> RecordTest | None:
    """The attack's own decisions (``said``: it says positive) as a :class:`RecordTest` over
    every row. None when the rows lack a positive or a negative."""
    t = np.asarray(truth, dtype=bool)
    if t.all() or not t.any():
        return None
    c = confusion(said, t)
    return RecordTest(
        *c,
        positive=positive,
        rule="decision",
        threshold=None,
        orientation=None,
        chosen_on=0,
        delta=delta,
        confidence=confidence,
        epsilon_lower=_bound(c, delta, confidence),
    )
