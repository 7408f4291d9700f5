"""A user's own bottom model, named in a protocol file as ``factory: "my_models:bottom"``
(the e2e tests copy this file beside their protocol files).

When ``$SVFL_FACTORY_MARKS`` names a folder, importing the module writes
``import-<pid>`` there, every call of a factory ``call-<pid>`` and a training
step ``device-<pid>`` (the device of the module's parameters), so a test can tell
which processes imported it, ran it, and where it trained. The other factories fail the
ways a user's factory can (for the tests of those failures)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

MARKS = os.environ.get("SVFL_FACTORY_MARKS")
if MARKS:
    Path(MARKS, f"import-{os.getpid()}").write_text("imported\n")


class Bottom(nn.Module):
    """Linear -> tanh -> Linear -> tanh, scaled: embeddings bounded by ``scale``."""

    def __init__(self, in_features: int, out: int, hidden: int, scale: float):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.Tanh(), nn.Linear(hidden, out), nn.Tanh())
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if MARKS and self.training:  # a training step: where the module's parameters live
            Path(MARKS, f"device-{os.getpid()}").write_text(str(next(self.parameters()).device))
        return self.scale * self.net(x)


def bottom(in_features: int, out: int, *, hidden: int = 16, scale: float = 1.0) -> nn.Module:
    if MARKS:
        Path(MARKS, f"call-{os.getpid()}").write_text(f"{in_features} {out}\n")
    return Bottom(in_features, out, hidden, scale)


def raising(in_features: int, out: int) -> nn.Module:
    raise ValueError(f"no model for {in_features} columns (secret detail 1234)")


def not_a_module(in_features: int, out: int) -> dict[str, int]:
    return {"in": in_features, "out": out}


def wrong_width(in_features: int, out: int) -> nn.Module:
    return nn.Linear(in_features, out + 1)
