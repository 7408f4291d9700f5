"""Small supervised learners the attacks train on their own (CPU, seconds):
a z-scored MLP regressor with early stopping, and an MLP classifier."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from securevfl import optim


def _mlp(d_in: int, hidden: list[int], d_out: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    d = d_in
    for h in hidden:
        layers += [nn.Linear(d, h), nn.ReLU()]
        d = h
    layers.append(nn.Linear(d, d_out))
    return nn.Sequential(*layers)


class Standardizer:
    """Per-column z-score with statistics of the attacker's own training set
    (docs/methods/dravl.md §5 hygiene: the embedding's scale cannot fake privacy)."""

    def __init__(self, x: torch.Tensor):
        self.mean = x.mean(0)
        self.std = x.std(0, unbiased=False).clamp_min(1e-6)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std

    def inverse(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.std + self.mean


def fit_regressor(
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    hidden: list[int],
    seed: int,
    max_epochs: int = 500,
    lr: float = 1e-3,
    batch_size: int = 32,
    val_fraction: float = 0.2,
    patience: int = 40,
):
    """Train an MLP x -> y (MSE, Adam, minibatches) with early stopping on a
    held-out part of (x, y). Returns ``predict(x) -> y`` and the validation MSEs
    of the model and of the constant mean predictor, so the caller can answer
    with whichever of the two is better (docs/methods/dravl.md §5)."""
    g = torch.Generator().manual_seed(seed)
    n = x.shape[0]
    perm = torch.randperm(n, generator=g)
    n_val = max(1, round(n * val_fraction)) if n > 4 else 0
    va, tr = perm[:n_val], perm[n_val:]
    sx, sy = Standardizer(x[tr]), Standardizer(y[tr])
    xt, yt = sx(x[tr]), sy(y[tr])
    xv, yv = sx(x[va]), sy(y[va])
    torch.manual_seed(seed)
    net = _mlp(x.shape[1], hidden, y.shape[1])
    opt = optim.Adam(net.parameters(), lr=lr, weight_decay=1e-5)
    best, best_state, wait = float("inf"), None, 0
    for _ in range(max_epochs):
        net.train()
        for b in torch.randperm(len(xt), generator=g).split(batch_size):
            opt.zero_grad()
            nn.functional.mse_loss(net(xt[b]), yt[b]).backward()
            opt.step()
        if n_val == 0:
            continue
        net.eval()
        with torch.no_grad():
            v = float(nn.functional.mse_loss(net(xv), yv))
        if v < best - 1e-6:
            best, best_state, wait = v, {k: t.clone() for k, t in net.state_dict().items()}, 0
        else:
            wait += 1
            if wait >= patience:
                break
    if best_state is not None:
        net.load_state_dict(best_state)
    net.eval()

    def predict(q: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return sy.inverse(net(sx(q)))

    with torch.no_grad():
        val_model = float(((predict(x[va]) - y[va]) ** 2).mean()) if n_val else float("nan")
        val_mean = float(((y[tr].mean(0) - y[va]) ** 2).mean()) if n_val else float("nan")
    return predict, val_model, val_mean


def fit_classifier(
    x: torch.Tensor,
    y: torch.Tensor,
    classes: int,
    *,
    hidden: list[int],
    seed: int,
    epochs: int = 300,
    lr: float = 1e-2,
    weight_decay: float = 1e-3,
):
    """Train an MLP classifier (cross-entropy, Adam, full batch) on z-scored x;
    returns ``predict_proba(x) -> (n, classes)``."""
    sx = Standardizer(x)
    torch.manual_seed(seed)
    net = _mlp(x.shape[1], hidden, classes)
    opt = optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
    xt, yt = sx(x), y.long()
    for _ in range(epochs):
        opt.zero_grad()
        nn.functional.cross_entropy(net(xt), yt).backward()
        opt.step()
    return proba_of(net, sx)


def proba_of(net: nn.Module, sx: Standardizer):
    """``predict_proba(x) -> (n, classes)`` of a trained classifier on inputs
    z-scored by ``sx`` (evaluation mode, no gradient)."""
    net.eval()

    def predict_proba(q: torch.Tensor) -> np.ndarray:
        with torch.no_grad():
            return torch.softmax(net(sx(q)), dim=1).numpy()

    return predict_proba
