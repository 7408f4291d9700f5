"""MixMatch (Berthelot et al., NeurIPS 2019) for the model-completion head of the
passive label-inference attack (Fu et al., USENIX Security 2022; docs/methods/hashvfl.md §5.4).

The attacker holds a few labelled training records and its own features of every
training record (the unlabelled pool). Each step:

1. augment a batch of labelled records once and a batch of unlabelled records
   ``k`` times (the caller's ``augment``: fresh noise each call);
2. guess the unlabelled records' labels: the head's softmax averaged over the
   ``k`` augmentations, sharpened with temperature ``t`` (:func:`sharpen`);
3. shuffle the labelled and unlabelled pairs together and MixUp each with a
   shuffled partner, lambda ~ Beta(alpha, alpha), lambda' = max(lambda, 1 - lambda)
   so each mixed point stays closer to its own (:func:`mixup`);
4. loss = cross-entropy on the mixed labelled part + lambda_u * MSE between the
   softmax and the mixed guessed labels on the unlabelled part, lambda_u ramped
   up linearly from 0.

Left out of the original (documented simplifications): the EMA of the weights and
the interleaved BatchNorm statistics (the head has no BatchNorm).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from securevfl import optim
from securevfl.attacks.learners import Standardizer, _mlp, proba_of


def sharpen(p: torch.Tensor, t: float) -> torch.Tensor:
    """Temperature sharpening of row distributions: p^(1/t) / sum_j p_j^(1/t).
    t = 1 is the identity; t -> 0 tends to the one-hot argmax."""
    if t <= 0:
        raise ValueError(f"sharpening temperature must be positive, got {t}")
    q = p.clamp_min(0) ** (1.0 / t)
    return q / q.sum(dim=1, keepdim=True)


def mixup(
    x1: torch.Tensor, y1: torch.Tensor, x2: torch.Tensor, y2: torch.Tensor, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """MixMatch's MixUp: lambda' = max(lam, 1 - lam), returns
    (lambda' x1 + (1 - lambda') x2, lambda' y1 + (1 - lambda') y2)."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"mixup weight must lie in [0, 1], got {lam}")
    lam = max(lam, 1.0 - lam)
    return lam * x1 + (1 - lam) * x2, lam * y1 + (1 - lam) * y2


def fit_mixmatch(
    x_pool: torch.Tensor,
    known_rows: torch.Tensor,
    known_labels: torch.Tensor,
    classes: int,
    augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor],
    *,
    hidden: list[int],
    seed: int,
    epochs: int = 25,
    batch_size: int = 64,
    k: int = 2,
    t: float = 0.5,
    alpha: float = 0.75,
    lambda_u: float = 10.0,
    rampup: float = 0.5,
    lr: float = 2e-3,
    weight_decay: float = 1e-3,
):
    """Train an MLP head with MixMatch; returns ``predict_proba(x) -> (n, classes)``.

    ``x_pool``: the attacker's un-augmented features of every training record (the
    unlabelled pool, also the z-score statistics); ``known_rows`` index the pool;
    ``augment(rows, gen)`` returns fresh augmented features of those rows. One
    epoch is one pass over the pool in unlabelled batches of ``batch_size``;
    lambda_u reaches its full value after ``rampup`` of all steps."""
    g = torch.Generator().manual_seed(seed)
    beta = np.random.default_rng(seed)
    sx = Standardizer(x_pool)
    torch.manual_seed(seed)
    net = _mlp(x_pool.shape[1], hidden, classes)
    opt = optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
    y_known = nn.functional.one_hot(known_labels.long(), classes).float()
    n = len(x_pool)
    steps = epochs * max(1, -(-n // batch_size))
    ramp_steps = max(1.0, rampup * steps)
    for step in range(steps):
        lab = torch.randint(len(known_rows), (min(batch_size, len(known_rows)),), generator=g)
        unl = torch.randint(n, (batch_size,), generator=g)
        xl = sx(augment(known_rows[lab], g))
        yl = y_known[lab]
        us = [sx(augment(unl, g)) for _ in range(k)]
        with torch.no_grad():
            q = sharpen(torch.stack([torch.softmax(net(u), 1) for u in us]).mean(0), t)
        wx = torch.cat([xl, *us])
        wy = torch.cat([yl, *([q] * k)])
        perm = torch.randperm(len(wx), generator=g)
        mx, my = mixup(wx, wy, wx[perm], wy[perm], float(beta.beta(alpha, alpha)))
        out = net(mx)
        nl = len(xl)
        loss_x = -(my[:nl] * torch.log_softmax(out[:nl], 1)).sum(1).mean()
        loss_u = ((torch.softmax(out[nl:], 1) - my[nl:]) ** 2).mean()
        w = lambda_u * min(1.0, (step + 1) / ramp_steps)
        opt.zero_grad()
        (loss_x + w * loss_u).backward()
        opt.step()
    return proba_of(net, sx)
