"""VFL-AFE's distribution-adjustment pieces (docs/methods/vfl-afe.md §2.5-2.7), as pure functions.

* :func:`fcm`: fuzzy c-means (Bezdek et al. 1984) on the gradients a passive party receives,
  giving pseudo-classes. This is a label-clustering attack the passive party runs on
  purpose (docs/methods/vfl-afe.md §1): it degrades the active party's label privacy by design.
* :func:`contrastive_loss`: Eq. 8 over confidently clustered rows, with the spec's sign
  fix (``push``, default), the ``pull`` alternative and the printed ``literal`` form.
* :func:`kl_gaussian_loss`: Eq. 6, a scale-free soft-histogram KL between the pairwise
  distance distribution and a Gaussian (the spec's concrete choice; the paper gives none).

None of these touch the noise: they only change the passive model's parameters.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

ClMode = Literal["push", "pull", "literal"]


def fcm(
    g: torch.Tensor,
    classes: int,
    *,
    m: float = 2.0,
    max_iter: int = 100,
    tol: float = 1e-5,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fuzzy c-means of the rows of ``g`` (detached, float64, on ``g``'s device).

    Returns ``(U, I, conf)``: the ``n x C`` membership matrix (rows on the simplex), each
    row's most probable cluster and its membership. Cluster IDs are arbitrary; only
    "same or different cluster" carries meaning. Memberships are invariant to scaling ``g``.
    """
    if m <= 1:
        raise ValueError(f"the FCM fuzzifier must be > 1, got {m}")
    if classes < 2:
        raise ValueError(f"FCM needs at least 2 clusters, got {classes}")
    x = g.detach().to(torch.float64)
    n = x.shape[0]
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(n, classes, generator=gen, dtype=torch.float64).to(x.device)
    u = u / u.sum(1, keepdim=True)
    power = 2.0 / (m - 1.0)
    for _ in range(max_iter):
        um = u**m
        centres = (um.T @ x) / um.sum(0)[:, None]
        dist = torch.cdist(x, centres) + 1e-12
        # U_jc = 1 / sum_c' (D_jc / D_jc')^(2/(m-1)), computed from the inverse powers
        inv = dist ** (-power)
        new = inv / inv.sum(1, keepdim=True)
        done = float((new - u).abs().max()) < tol
        u = new
        if done:
            break
    conf, idx = u.max(1)
    return u, idx, conf


def fcm_centres(g: torch.Tensor, u: torch.Tensor, m: float = 2.0) -> torch.Tensor:
    """The FCM centres implied by memberships ``u`` (for diagnostics and reference checks)."""
    um = u.to(torch.float64) ** m
    return (um.T @ g.detach().to(torch.float64)) / um.sum(0)[:, None]


def purity(clusters: torch.Tensor, labels: torch.Tensor, keep: torch.Tensor | None = None) -> float:
    """Harness-only diagnostic (uses true labels): the share of rows in their cluster's
    majority class, over the kept rows (all rows when ``keep`` is None)."""
    if keep is not None:
        clusters, labels = clusters[keep], labels[keep]
    if clusters.numel() == 0:
        return float("nan")
    hit = 0
    for c in clusters.unique():
        hit += int(torch.bincount(labels[clusters == c]).max())
    return hit / clusters.numel()


def contrastive_loss(
    hs: torch.Tensor,
    clusters: torch.Tensor,
    conf: torch.Tensor,
    c: float,
    beta: float,
    mode: ClMode = "push",
) -> torch.Tensor:
    """Eq. 8 over the ordered pairs of kept rows (``conf >= c``), normalised by ``1/n^2`` with
    ``n`` the full batch size.

    * ``push`` (default, the spec's sign fix): ``-beta/n^2 sum (1 - omega) ||h_j - h_k||``;
    * ``pull``: ``+beta/n^2 sum omega ||h_j - h_k||``;
    * ``literal``: as printed, ``+beta/n^2 sum (1 - omega) ||h_j - h_k||``, which pulls
      different clusters together (kept only to reproduce the typo).

    Zero when fewer than 2 rows are kept or all kept rows share one cluster. Rows below the
    threshold get exactly zero gradient (they are not in the sum).
    """
    n = hs.shape[0]
    keep = conf >= c
    zero = hs.sum() * 0.0
    if int(keep.sum()) < 2:
        return zero
    kept_ids = clusters[keep]
    if bool((kept_ids == kept_ids[0]).all()):
        return zero
    rows = torch.nonzero(keep).flatten()
    j, k = torch.triu_indices(rows.numel(), rows.numel(), offset=1, device=hs.device)
    same = kept_ids[j] == kept_ids[k]
    if mode == "pull":
        sel, sign = same, 1.0
    elif mode in ("push", "literal"):
        sel, sign = ~same, -1.0 if mode == "push" else 1.0
    else:
        raise ValueError(f"unknown contrastive mode {mode!r} (known: push, pull, literal)")
    if not bool(sel.any()):
        return zero
    a, b = rows[j[sel]], rows[k[sel]]
    diff = hs[a] - hs[b]
    dist = torch.sqrt((diff * diff).sum(1) + 1e-24)
    # each unordered pair stands for the two ordered pairs (j, k) and (k, j)
    return sign * beta * 2.0 * dist.sum() / (n * n)


def kl_gaussian_loss(d: torch.Tensor, alpha: float = 1.0, bins: int = 64) -> torch.Tensor:
    """``alpha * KL(P(d) || N(mu, sigma^2))`` of distances ``d`` (docs/methods/vfl-afe.md §2.5): standardise
    ``d`` (gradients flow through ``d``, its mean and std), soft-histogram it with a Gaussian
    kernel of one bin width over ``linspace(-4, 4, bins)``, and compare with the standard
    normal smoothed by the same kernel. Invariant to scaling ``d``."""
    if d.numel() < 2:
        return d.sum() * 0.0
    mu = d.mean()
    sd = d.std(correction=0).clamp_min(1e-12)
    z = (d - mu) / sd
    u = torch.linspace(-4.0, 4.0, bins, dtype=d.dtype, device=d.device)
    tau = float(u[1] - u[0])
    p = torch.exp(-((z[:, None] - u[None, :]) ** 2) / (2 * tau * tau)).sum(0)
    p = p / p.sum()
    var = 1.0 + tau * tau
    q = torch.exp(-(u * u) / (2 * var)) / math.sqrt(2 * math.pi * var)
    q = q / q.sum()
    kl = (p * torch.log(p.clamp_min(1e-12) / q.clamp_min(1e-12))).sum()
    return alpha * kl
