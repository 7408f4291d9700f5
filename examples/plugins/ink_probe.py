"""A plugin attack: the active party infers a property of a passive party's features.

``ink_probe`` plays the active party A after training. Besides its view, A is
given (declared prior knowledge) one number for a random ``aux_fraction`` of the
training rows: the mean of the victim passive party's raw features on that row
(on the ``digits`` halves: how much ink the victim's half of the image holds).
From its view A reads, for every record, the last z it learned for it (the sum
of the parties' contributions under ``mpc``; under ``plain`` and the HE backends
A's own record of z as well), fits a ridge regression from z to the property on
the aux rows, and predicts the property of every test row from the z of the
final evaluation. Score: R^2 of the guess on the test rows against the victim's
true values (``ap``; 0 is what the aux mean alone achieves, the chance level).

A property-inference attack in the sense of Ganju et al. (CCS 2018) reduced to
its simplest form: a linear probe on what the adversary learned. It never reads
the victim's features or anything else outside A's view; ``knowledge`` hands it
the declared prior, and ``score`` alone reads the ground truth.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from pydantic import Field

from securevfl.plugins import Attack, AttackOptions, View, World, per_row, register_attack


def ridge_fit(x: np.ndarray, y: np.ndarray, alpha: float) -> tuple[np.ndarray, float]:
    """Weights and intercept of ridge regression of ``y`` on ``x`` (centred, closed form)."""
    mx, my = x.mean(0), y.mean()
    xc = x - mx
    w = np.linalg.solve(xc.T @ xc + alpha * np.eye(x.shape[1]), xc.T @ (y - my))
    return w, float(my - mx @ w)


def r2(guess: np.ndarray, true: np.ndarray) -> float:
    """Coefficient of determination of ``guess`` for ``true``."""
    return float(1.0 - ((true - guess) ** 2).sum() / max(((true - true.mean()) ** 2).sum(), 1e-12))


class InkProbeOptions(AttackOptions):
    target: str | None = Field(default=None, description="victim passive party (default: the first)")
    aux_fraction: float = Field(default=0.2, gt=0, lt=1, description="training rows whose property A knows")
    alpha: float = Field(default=1.0, gt=0, description="ridge penalty")


@register_attack
class InkProbe(Attack[InkProbeOptions]):
    name = "ink_probe"
    adversary = "active"
    options = InkProbeOptions

    def knowledge(self, world: World) -> dict[str, Any]:
        """The victim's feature mean on a random ``aux_fraction`` of the training rows
        (positions into the training rows), drawn with the attack's own seed."""
        own = world.passive(self.params.target).own
        n_train = len(own.train_idx)
        rng = np.random.default_rng(self.params.seed)  # the attack's randomness, not a secret
        n_aux = max(2, round(self.params.aux_fraction * n_train))
        aux = np.sort(rng.choice(n_train, size=n_aux, replace=False))
        ink = own.x_raw[torch.as_tensor(own.train_idx[aux])].double().mean(1).numpy()
        return {"aux_rows": aux, "aux_ink": ink}

    def run(self, view: View) -> dict[str, Any]:
        own, prior = view.own, view.prior
        table = per_row(own.forwards, own.z, len(own.train_idx), len(own.test_idx))
        seen = table.train_seen[prior["aux_rows"]]
        x = table.train[prior["aux_rows"][seen]].double().numpy()
        w, b = ridge_fit(x, prior["aux_ink"][seen], self.params.alpha)
        rows = np.flatnonzero(table.test_seen)
        guess = table.test[rows].double().numpy() @ w + b
        return {"test_rows": rows, "guess": guess, "used": {"input": "z at A", "aux_rows": int(seen.sum())}}

    def score(self, guess: dict[str, Any], world: World) -> dict[str, Any]:
        own = world.passive(self.params.target).own
        true = own.x_raw[torch.as_tensor(own.test_idx[guess["test_rows"]])].double().mean(1).numpy()
        return {"ap": r2(guess["guess"], true), "chance": 0.0, "n_test": len(true)}
