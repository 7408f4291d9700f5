"""The built-in bottom models ``mlp`` and ``cnn`` (registered by path in
:data:`securevfl.model_kinds.MODELS`), and the Linear/ReLU stack the top model
uses too."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from securevfl.errors import ConfigError


class CNNBottom(nn.Module):
    """Small conv net for image halves: conv3x3 -> ReLU -> conv3x3 -> ReLU -> linear."""

    def __init__(self, input_shape: list[int] | tuple[int, ...], channels: int, out: int):
        super().__init__()
        c, h, w = input_shape
        self.input_shape = tuple(input_shape)
        self.features = nn.Sequential(
            nn.Conv2d(c, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.ReLU(),
        )
        self.head = nn.Linear(channels * h * w, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(x.shape[0], *self.input_shape)
        return self.head(self.features(x).flatten(1))


def mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def mlp_model(in_features: int, out: int, *, hidden: Sequence[int] = (64,)) -> nn.Module:
    """The built-in ``mlp``: Linear/ReLU layers of widths ``hidden``, then a Linear to ``out``."""
    return mlp([in_features, *hidden, out])


def cnn_model(in_features: int, out: int, *, input_shape: Sequence[int], channels: int = 8) -> nn.Module:
    """The built-in ``cnn`` (:class:`CNNBottom`) over rows reshaped to ``input_shape``."""
    c, h, w = input_shape
    if c * h * w != in_features:
        raise ConfigError(
            f"input_shape {list(input_shape)} holds {c * h * w} values but the party has {in_features} "
            "feature columns"
        )
    return CNNBottom(list(input_shape), channels, out)
