"""Bottom, interactive and top models, built under named seeds.

Every component is constructed under :func:`securevfl.seeding.seeded` with a label
naming it, so the split run and a centralized reference build bit-identical
initial weights (tests compare them).
"""

from __future__ import annotations

import torch
from torch import nn

from securevfl import optim
from securevfl.config import InteractiveSpec, ModelSpec, TopSpec, TrainingSpec
from securevfl.seeding import seeded


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


def build_bottom(spec: ModelSpec, in_features: int, *, seed: int, party: str) -> nn.Module:
    """A party's bottom model f_i; the caller checks ``in_features`` fits the spec."""
    with seeded(seed, "bottom", party):
        if spec.kind == "cnn":
            assert spec.input_shape is not None
            return CNNBottom(spec.input_shape, spec.channels, spec.out)
        return mlp([in_features, *spec.hidden, spec.out])


def build_interactive(in_features: int, out: int, *, seed: int, party: str) -> nn.Linear:
    """One party's block W_i of the interactive layer (no bias: the bias b is the
    active party's own parameter)."""
    with seeded(seed, "interactive", party):
        return nn.Linear(in_features, out, bias=False)


def build_bias(out: int) -> nn.Parameter:
    return nn.Parameter(torch.zeros(out))


class Top(nn.Module):
    """g(z): ReLU on the interactive output, optional hidden layers, logits."""

    def __init__(self, spec: TopSpec, in_features: int, classes: int):
        super().__init__()
        self.net = nn.Sequential(nn.ReLU(), mlp([in_features, *spec.hidden, classes]))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


def build_top(spec: TopSpec, in_features: int, classes: int, *, seed: int) -> Top:
    with seeded(seed, "top"):
        return Top(spec, in_features, classes)


def interactive_optimizer(params, spec: InteractiveSpec) -> optim.Optimizer:
    """SGD with momentum for the passive blocks W_i (see InteractiveSpec)."""
    return optim.SGD(list(params), lr=spec.lr, momentum=spec.momentum)


def make_optimizer(params, training: TrainingSpec) -> optim.Optimizer:
    params = list(params)
    if training.optimizer == "adam":
        return optim.Adam(params, lr=training.lr)
    return optim.SGD(params, lr=training.lr, momentum=training.momentum)
