"""Randomized response on labels (docs/methods/label-dp.md §2): pure functions.

Binary labels flip with probability ``1 / (1 + e^eps)``; K-ary labels (one-hot or
class index) keep the true class with probability ``e^eps / (K - 1 + e^eps)`` and
otherwise move to one of the other ``K - 1`` classes uniformly. Each released label
is pure ``eps``-label-DP (Ghazi et al., NeurIPS 2021). ``eps = 0`` is uniform
noise, ``eps = inf`` the identity. The output has the input's kind, dtype and shape.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from securevfl.csprng import SecretStream
from securevfl.errors import DataError

Kind = Literal["binary", "onehot", "index"]


def flip_probability(epsilon: float) -> float:
    """Binary randomized response: probability that a label is flipped."""
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    return 0.0 if math.isinf(epsilon) else 1.0 / (1.0 + math.exp(epsilon))


def keep_probability(epsilon: float, classes: int) -> float:
    """K-ary randomized response: probability of keeping the true class."""
    if classes < 2:
        raise ValueError(f"randomized response needs at least 2 classes, got {classes}")
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    if math.isinf(epsilon):
        return 1.0
    e = math.exp(min(epsilon, 700.0))
    return e / (classes - 1 + e)


def transition_matrix(epsilon: float, classes: int) -> torch.Tensor:
    """P[i, j] = Pr[output j | true label i] (float64)."""
    p1 = keep_probability(epsilon, classes)
    p2 = (1.0 - p1) / (classes - 1)
    m = torch.full((classes, classes), p2, dtype=torch.float64)
    m.fill_diagonal_(p1)
    return m


def detect_kind(labels: torch.Tensor, classes: int | None = None) -> Kind:
    """binary ``(n,)``/``(n,1)`` in {0,1}; one-hot ``(n,K)`` rows summing to 1;
    class index ``(n,)`` integers in ``0..K-1`` with ``K = classes > 2``."""
    y = labels
    if y.dim() == 2 and y.shape[1] > 1:
        ok = bool(((y == 0) | (y == 1)).all()) and bool((y.sum(1) == 1).all())
        if not ok:
            raise DataError(
                f"one-hot labels of shape {tuple(y.shape)} must hold one 1 per row and 0 elsewhere"
            )
        return "onehot"
    if y.dim() == 2 and y.shape[1] == 1:
        y = y[:, 0]
    elif y.dim() != 1:
        raise DataError(f"labels must be (n,), (n,1) or one-hot (n,K); got shape {tuple(labels.shape)}")
    if y.dtype.is_floating_point and not bool((y == y.round()).all()):
        raise DataError("labels must be integer-valued (binary, class index) or one-hot")
    lo, hi = (int(y.min()), int(y.max())) if y.numel() else (0, 0)
    if classes is None or classes == 2:
        if lo < 0 or hi > 1:
            raise DataError(f"binary labels must be 0 or 1; found values in [{lo}, {hi}]")
        return "binary"
    if lo < 0 or hi >= classes:
        raise DataError(f"class-index labels must lie in 0..{classes - 1}; found values in [{lo}, {hi}]")
    return "index"


def randomize(
    labels: torch.Tensor, epsilon: float, stream: SecretStream, *, classes: int | None = None
) -> torch.Tensor:
    """Randomized response on every label, once; same kind, dtype and shape.

    ``classes`` is K for class-index labels (from the dataset, never from the
    batch); binary labels need none, one-hot labels carry K in their width.
    """
    kind = detect_kind(labels, classes)
    if math.isinf(epsilon):
        return labels.clone()
    if kind == "onehot":
        k = labels.shape[1]
        idx = _kary(labels.argmax(1), epsilon, k, stream)
        return torch.nn.functional.one_hot(idx, k).to(labels.dtype)
    flat = labels.reshape(-1).long()
    if kind == "binary":
        flip = stream.uniform(flat.shape) < flip_probability(epsilon)
        out = torch.where(flip, 1 - flat, flat)
    else:
        assert classes is not None
        out = _kary(flat, epsilon, classes, stream)
    return out.to(labels.dtype).reshape(labels.shape)


def _kary(idx: torch.Tensor, epsilon: float, k: int, stream: SecretStream) -> torch.Tensor:
    keep = stream.uniform(idx.shape) < keep_probability(epsilon, k)
    # a uniform draw over the K-1 other classes: shift by 1..K-1 modulo K (exact integers)
    shift = stream.integers(idx.shape, 1, k)
    return torch.where(keep, idx, (idx + shift) % k)
