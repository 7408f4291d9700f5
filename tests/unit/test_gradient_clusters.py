"""The gradient label-leak probe (docs/methods/hashvfl.md §7 item 2, §8.2 item 19) on hand-built
passive views: a per-class constant offset in the received gradients (what
HashVFL's consistency term adds) is found by k-means; pure noise is not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from securevfl.attacks.base import View
from securevfl.attacks.gradient_clusters import (
    GradientClusters,
    GradientClustersOptions,
    gradient_points,
    last_pass,
)
from securevfl.schedule import train_batches

C, D, N = 4, 4, 240


def _view(y: np.ndarray, grad_of, epochs: int = 3) -> View:
    batches = [b for e in range(epochs) for b in train_batches(len(y), 32, 0, e)]
    fw = [{"phase": "train", "round": i, "rows": b} for i, b in enumerate(batches)]
    grads = [grad_of(b, i) for i, b in enumerate(batches)]
    view = View(1, "p", {}, {"train_idx": np.arange(len(y)), "forwards": fw, "grads": grads})
    view.prior = {"classes": C}
    return view


def _world(y: np.ndarray):
    class _W:
        active = View(0, "a", {}, {"y_train": torch.as_tensor(y), "classes": C})

    return _W()


def _codes() -> torch.Tensor:
    return torch.tensor([[1.0, 1, -1, -1], [-1, 1, 1, -1], [1, -1, 1, 1], [-1, -1, -1, 1]])


@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"points": "per_step"},
        {"normalize": False},
        {"epochs": "last", "points": "per_step"},
    ],
)
def test_a_per_class_offset_is_found_and_noise_is_not(opts):
    y = np.random.default_rng(0).integers(0, C, N)
    gen = torch.Generator().manual_seed(1)
    offset = -_codes() / (2 * 32 * D)  # -o_y / (N B d), as the consistency term adds

    def leaky(rows, step):  # an offset plus label-free noise of 0.7 its per-coordinate size
        return offset[torch.as_tensor(y[rows])] + 0.7 * offset.abs().max() * torch.randn(
            len(rows), D, generator=gen
        )

    def noise(rows, step):
        return torch.randn(len(rows), D, generator=gen)

    attack = GradientClusters(GradientClustersOptions(**opts))
    out = attack.score(attack.run(_view(y, leaky)), _world(y))
    assert out["ami"] > 0.7 and out["accuracy"] > 0.9, out
    expected = (
        N if opts.get("points", "per_row") == "per_row" else (N if opts.get("epochs") == "last" else 3 * N)
    )
    assert out["n_points"] == expected
    chance = attack.score(attack.run(_view(y, noise)), _world(y))
    assert abs(chance["ami"]) < 0.03 and chance["accuracy"] < 0.4, chance


def test_per_row_means_sharpen_the_signal():
    """Averaging a record's gradients over its steps averages the noise away."""
    y = np.random.default_rng(2).integers(0, C, N)
    gen = torch.Generator().manual_seed(3)
    code = _codes()

    def leaky(rows, step):
        return code[torch.as_tensor(y[rows])] + 3.0 * torch.randn(len(rows), D, generator=gen)

    view = _view(y, leaky, epochs=6)
    per_step = GradientClusters(GradientClustersOptions(points="per_step"))
    per_row = GradientClusters(GradientClustersOptions(points="per_row"))
    a = per_step.score(per_step.run(view), _world(y))["ami"]
    b = per_row.score(per_row.run(view), _world(y))["ami"]
    assert b > a + 0.1, (a, b)


def test_last_pass_and_point_construction():
    fw = [
        {"phase": "train", "round": 0, "rows": np.array([0, 1])},
        {"phase": "train", "round": 1, "rows": np.array([2, 3])},
        {"phase": "train", "round": 2, "rows": np.array([1, 3])},
        {"phase": "train", "round": 3, "rows": np.array([0, 2])},
    ]
    assert last_pass(fw) == [2, 3]
    g = [
        torch.tensor([[3.0, 4.0], [1.0, 0.0]]),
        torch.ones(2, 2),
        torch.zeros(2, 2),
        torch.tensor([[0.0, 2.0]] * 2),
    ]
    x, rows = gradient_points(fw, g, 5, points="per_row", normalize=False, epochs="all")
    assert rows.tolist() == [0, 1, 2, 3]
    assert x[0].tolist() == [1.5, 3.0] and x[1].tolist() == [0.5, 0.0]
    x, rows = gradient_points(fw, g, 5, points="per_step", normalize=True, epochs="last")
    assert rows.tolist() == [1, 3, 0, 2]
    assert x[2].tolist() == [0.0, 1.0] and x[0].tolist() == [0.0, 0.0]  # a zero row stays zero
    x, _ = gradient_points(fw, g, 5, points="per_row", normalize=True, epochs="all")
    assert x[0] == pytest.approx([0.3, 0.9])  # mean of (0.6, 0.8) and (0, 1)
