"""A user's own bottom model, named in a protocol file as ``factory: "my_models:bottom"``
(the e2e tests copy this file beside their protocol files).

Every call records the process that made it in ``$SVFL_FACTORY_MARKS/<pid>`` when
that variable is set, so a test can tell which ranks ran the factory."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn


class Bottom(nn.Module):
    """Linear -> tanh -> Linear -> tanh, scaled: embeddings bounded by ``scale``."""

    def __init__(self, in_features: int, out: int, hidden: int, scale: float):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.Tanh(), nn.Linear(hidden, out), nn.Tanh())
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * self.net(x)


def bottom(in_features: int, out: int, *, hidden: int = 16, scale: float = 1.0) -> nn.Module:
    marks = os.environ.get("SVFL_FACTORY_MARKS")
    if marks:
        Path(marks, str(os.getpid())).write_text(f"{in_features} {out}\n")
    return Bottom(in_features, out, hidden, scale)
