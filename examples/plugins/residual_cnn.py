"""A residual CNN bottom model for a passive party's image half (a model factory).

Named in a protocol file by import path, beside the file::

    model: {factory: "residual_cnn:bottom", params: {input_shape: [1, 8, 4]}, out: 16}

securevfl calls ``bottom(in_features, out, **params)`` in the owning party's rank
alone and checks the module's output on a probe batch (``out`` float32 columns).
A party's features arrive as flat float32 rows; the built-in ``digits`` dataset
gives each pixel as one column ``px_R_C`` scaled to [0, 1], so a party holding
``px_?_[0-3]`` holds the left 8x4 half of each image, row-major, which this model
views as ``input_shape`` (as the built-in ``cnn`` does).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from securevfl.errors import ConfigError


class ResidualBlock(nn.Module):
    """conv3x3 -> BN -> ReLU -> conv3x3 -> BN, plus the input (He et al., 2016)."""

    def __init__(self, channels: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


class ResidualCNN(nn.Module):
    """A stem convolution, ``blocks`` residual blocks, global average pooling, a linear head."""

    def __init__(self, input_shape: Sequence[int], out: int, channels: int, blocks: int):
        super().__init__()
        self.input_shape = tuple(input_shape)
        self.stem = nn.Sequential(nn.Conv2d(self.input_shape[0], channels, 3, padding=1), nn.ReLU())
        self.blocks = nn.Sequential(*(ResidualBlock(channels) for _ in range(blocks)))
        self.head = nn.Linear(channels, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x.view(x.shape[0], *self.input_shape)))
        return self.head(x.mean(dim=(2, 3)))


def bottom(
    in_features: int, out: int, *, input_shape: Sequence[int], channels: int = 16, blocks: int = 2
) -> nn.Module:
    """The factory: a :class:`ResidualCNN` over rows reshaped to ``input_shape`` (C, H, W)."""
    c, h, w = input_shape
    if c * h * w != in_features:
        # a ConfigError's message reaches the user as it is: it names shapes, no data
        raise ConfigError(
            f"input_shape {list(input_shape)} holds {c * h * w} values, the party has {in_features}"
        )
    return ResidualCNN(input_shape, out, channels, blocks)
