"""An embedding-bag bottom model over categorical columns (a model factory).

Each feature column is a categorical field whose value is an integer code; the
model looks up one learned vector per (column, code) pair and averages a row's
vectors (``torch.nn.EmbeddingBag``, one bag per row), then maps the average to
``out`` columns. This is the usual first layer of a click-through-rate model over
hashed or dictionary-coded fields. Named in a protocol file as::

    model: {factory: "embedding_bag:bottom", params: {levels: 17, scale: 16}, out: 16}

A party's features arrive as float32 rows; a column's code is
``round(value * scale)``, clamped to ``0 .. levels - 1``. For integer-coded
columns use ``scale: 1``. In examples/plugins the codes are the built-in
``digits`` dataset's pixel intensities (0..16, which the dataset scales to [0, 1],
hence ``scale: 16``): each pixel is a field with 17 levels.
"""

from __future__ import annotations

import torch
from torch import nn


def codes(x: torch.Tensor, levels: int, scale: float) -> torch.Tensor:
    """Token ids of a batch: column ``j``'s code ``c`` becomes ``j * levels + c``."""
    c = torch.round(x * scale).long().clamp(0, levels - 1)
    return c + torch.arange(x.shape[1], device=x.device) * levels


class EmbeddingBagBottom(nn.Module):
    def __init__(self, in_features: int, out: int, levels: int, scale: float, dim: int):
        super().__init__()
        self.levels, self.scale = levels, scale
        self.bag = nn.EmbeddingBag(in_features * levels, dim, mode="mean")
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(dim, out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.bag(codes(x, self.levels, self.scale)))


def bottom(in_features: int, out: int, *, levels: int = 17, scale: float = 1.0, dim: int = 32) -> nn.Module:
    """The factory: an :class:`EmbeddingBagBottom` with ``levels`` codes per column."""
    return EmbeddingBagBottom(in_features, out, levels, scale, dim)
