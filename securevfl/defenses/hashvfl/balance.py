"""Bit-balance bookkeeping of the passive hash (docs/methods/hashvfl.md §7 item 5): a counter of
+1 bits per unit for the report, and the running per-unit median that
``balance: median`` thresholds at in evaluation."""

from __future__ import annotations

from typing import Any

import torch

from securevfl.privacy import hashing


class _BalanceCounter:
    """+1 counts per bit over a stretch of batches."""

    def __init__(self) -> None:
        self.ones: torch.Tensor | None = None
        self.rows = 0

    def add(self, codes: torch.Tensor) -> None:
        ones = (codes > 0).sum(0).double().cpu()
        self.ones = ones if self.ones is None else self.ones + ones
        self.rows += codes.shape[0]

    def summary(self) -> dict[str, Any]:
        if self.ones is None or not self.rows:
            return {}
        frac = (self.ones / self.rows).float()
        return {
            "rows": self.rows,
            "plus_fraction": [round(float(f), 4) for f in frac],
            "entropy_bits_mean": float(hashing.bit_entropy(frac).mean()),
            "mean_abs_deviation": float((frac - 0.5).abs().mean()),
        }


class MedianThreshold(torch.nn.Module):
    """Running per-unit median of the bottom model's output v (before BN), for
    the ``balance: median`` hash (docs/methods/hashvfl.md §7 item 5). It has no trainable
    parameters; the running median is a buffer, so it travels with the party's
    defense modules like BN's running statistics.

    It is kept before BN, not after, so that evaluation compares like with like:
    BN is a per-unit monotone affine map, so Sign(BN(v) - BN(m)) = Sign(gamma)
    Sign(v - m) whichever statistics BN uses, and the test codes do not depend on
    how far BN's running statistics differ from the training batches' (which, on
    skewed units, shifts a threshold kept after BN)."""

    def __init__(self, bits: int, momentum: float):
        super().__init__()
        self.momentum = momentum
        self.running: torch.Tensor
        self.batches: torch.Tensor
        self.register_buffer("running", torch.zeros(bits))
        self.register_buffer("batches", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def observe(self, v: torch.Tensor) -> None:
        """Fold a training batch's median into the running one (the first batch's
        median starts it, rather than an average with 0)."""
        m = hashing.column_median(v)
        first = int(self.batches) == 0
        self.running.copy_(m if first else hashing.running_update(self.running, m, self.momentum))
        self.batches += 1
