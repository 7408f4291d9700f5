"""The online evaluation attacker and the day-chunked stream protocol of docs/methods/dravl.md
(§5 mode 1, §4.2 "training regime", §8.8).

Threat model: the simulated worst-case active party that knows the ground-truth
inputs ``phi(x)`` of the records it receives embeddings for. :class:`OnlineReconstructor`
is R_I trained alongside the split model on each training batch's
``(Z_sent.detach(), phi(x))`` with an optimizer of its own: it never feeds a
gradient back into the bottom model. Under the stream protocol the rows arrive in
``days`` chunks in row order; each day is first evaluated (the model's AUC and
log-loss, R_I's MSE on that day's embeddings), then trained on, one pass. The
per-day values are averaged, as the paper reports them.

The post-hoc attacker (mode 2, the default for claims) is the registered
``feature_reconstruction`` attack; both answer with the better of R_I and the
mean predictor where they can (here: R_I only, as the paper's online R_I does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from securevfl import optim


class OnlineReconstructor:
    """R_I: an MLP from the sent embedding to ``phi(x)``, one Adam step per
    observed training batch (docs/methods/dravl.md §4.2: ``q -> 256 -> 256 -> d_x``, lr 1e-3)."""

    def __init__(
        self, d_in: int, d_out: int, *, hidden: Sequence[int] = (256, 256), lr: float = 1e-3, seed: int = 0
    ):
        gen = torch.Generator().manual_seed(seed)
        layers: list[nn.Module] = []
        width = d_in
        with torch.random.fork_rng(devices=[]):  # nn.Linear's default init draws on the global RNG
            for h in hidden:
                layers += [nn.Linear(width, h), nn.ReLU()]
                width = h
            layers.append(nn.Linear(width, d_out))
        self.net = nn.Sequential(*layers)
        with torch.no_grad():  # its own seeded init: uniform in +-1/sqrt(fan_in), as nn.Linear's
            for layer in self.net:
                if isinstance(layer, nn.Linear):
                    bound = layer.in_features**-0.5
                    for p in (layer.weight, layer.bias):
                        p.copy_((torch.rand(p.shape, generator=gen) * 2 - 1) * bound)
        self.opt = optim.Adam(self.net.parameters(), lr=lr)
        self.steps = 0

    def observe(self, z_sent: torch.Tensor, x: torch.Tensor) -> float:
        """One training step on a batch; ``z_sent`` is detached, so nothing flows
        back into whatever produced it. Returns the batch MSE before the step."""
        z = z_sent.detach().float()
        loss = ((self.net(z) - x.detach().float()) ** 2).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.steps += 1
        return float(loss.detach())

    @torch.no_grad()
    def mse(self, z_sent: torch.Tensor, x: torch.Tensor) -> float:
        """Mean over elements of ``(R_I(z) - phi(x))^2`` (docs/methods/dravl.md §5, metric 1)."""
        return float(((self.net(z_sent.float()) - x.float()) ** 2).mean())


def day_chunks(n: int, days: int) -> list[np.ndarray]:
    """Row positions ``0..n-1`` cut into ``days`` consecutive chunks of sizes that
    differ by at most one (the stream's days, in row order)."""
    if not 1 <= days <= n:
        raise ValueError(f"cannot cut {n} rows into {days} days")
    return [c for c in np.array_split(np.arange(n), days)]


@dataclass
class DayMetrics:
    """What the stream protocol records per day, before training on that day."""

    auc: list[float] = field(default_factory=list)
    log_loss: list[float] = field(default_factory=list)
    mse: list[float] = field(default_factory=list)
    nmse: list[float] = field(default_factory=list)

    def add(self, *, auc: float, log_loss: float, mse: float, target_var: float) -> None:
        self.auc.append(auc)
        self.log_loss.append(log_loss)
        self.mse.append(mse)
        self.nmse.append(mse / target_var if target_var > 0 else float("nan"))

    def averages(self) -> dict[str, float]:
        """Per-day values averaged over the days (the paper's reporting)."""
        return {k: float(np.mean(v)) for k, v in vars(self).items() if v}
