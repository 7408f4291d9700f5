"""A minimal plugin for the tests: one defense and one attack, registered by name.

``test_scale`` (passive): multiplies the released embedding by ``factor``.
``test_grad_norm`` (a passive party's attack): scores each training record by the
norm of the gradient revealed to the attacking party, graded as a leak AUC
against the active party's labels (class 1 against the rest)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from pydantic import Field

import securevfl.attacks.metrics as metrics
from securevfl.plugins import (
    Attack,
    AttackOptions,
    Defense,
    DefenseOptions,
    View,
    World,
    register_attack,
    register_defense,
)


class ScaleOptions(DefenseOptions):
    factor: float = Field(default=0.5, gt=0)


@register_defense
class Scale(Defense[ScaleOptions]):
    name = "test_scale"
    sides = frozenset({"passive"})
    options = ScaleOptions

    def embed(self, h: torch.Tensor, *, train: bool) -> torch.Tensor:
        return h * self.params.factor

    def embed_local(self, h: torch.Tensor) -> torch.Tensor:
        return h * self.params.factor

    def report(self) -> dict[str, Any]:
        return {"factor": self.params.factor}


class GradNormOptions(AttackOptions):
    party: str | None = Field(default=None, description="the attacking passive party (default: the first)")


@register_attack
class GradNorm(Attack[GradNormOptions]):
    name = "test_grad_norm"
    adversary = "passive"
    options = GradNormOptions
    needs_classes = "it guesses class labels"

    def adversary_party(self, world: World) -> str:
        return world.passive(self.params.party).party

    def run(self, view: View) -> dict[str, Any]:
        own = view.own
        total = np.zeros(len(own.train_idx))
        count = np.zeros(len(own.train_idx))
        for f, g in zip(own.forwards, own.grads, strict=True):
            rows = np.asarray(f["rows"])
            total[rows] += g.double().norm(dim=1).numpy()
            count[rows] += 1
        rows = np.flatnonzero(count)
        return {"rows": rows, "scores": total[rows] / count[rows], "used": {"input": "revealed dL/dh'"}}

    def score(self, guess: dict[str, Any], world: World) -> dict[str, Any]:
        y = (world.active.own.y_train.numpy()[guess["rows"]] == 1).astype(int)
        auc = metrics.leak_auc(guess["scores"], y)
        return {"auc": auc, "ap": auc, "n_rows": len(y)}  # ap: the comparison table's attack column
