"""The research group's own code for docs/tutorial.md: a bottom model, a defense
and an attack, all in one module beside the protocol files.

* ``per_category`` (a model factory): one learned embedding per categorical
  column, from the party's one-hot preprocessed input, concatenated with its
  numeric columns before a small MLP. It declares a ``layout`` parameter, so
  securevfl passes it the party's :class:`~securevfl.plugins.FeatureLayout`
  (docs/extending.md, "What a factory receives").
* ``noisy_release`` (a defense, passive side): the Gaussian mechanism on every
  embedding row a party releases. Each row is clipped to L2 norm ``clip`` and
  Gaussian noise of standard deviation ``noise_multiplier x 2 clip`` is added
  (replace-one sensitivity ``2 clip``; Dwork & Roth 2014, Thm A.1). Threat model:
  an honest-but-curious active party that sees what the exchange reveals about
  the released rows (under ``mpc``: z = sum_i h'_i W_i). It does not protect the
  labels, the alignment, or the bottom model's memory of earlier records. The
  noise comes from the party's own secret stream, never from torch or numpy.
* ``column_probe`` (an attack by the active party): the bank knows one numeric
  column of a passive party (``column``, say the telco's ``monthly_bill``) for a
  random ``aux_fraction`` of the training customers, fits a ridge regression
  from the z it learned for them to that column, and predicts the column for
  every test customer from the z of the final evaluation. Score: R^2 of the
  guess against the true (preprocessed) values, ``ap``; 0 is what the aux mean
  alone achieves (chance). A property-inference attack (Ganju et al., CCS 2018)
  in its simplest form: a linear probe on what the adversary learned.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from pydantic import Field
from torch import nn

from securevfl.errors import ConfigError
from securevfl.plugins import (
    Attack,
    AttackOptions,
    Defense,
    DefenseOptions,
    EmbeddingBoundary,
    FeatureLayout,
    GaussianRelease,
    Mechanism,
    Plan,
    View,
    World,
    per_row,
    register_attack,
    register_defense,
)

# -- the bottom model -------------------------------------------------------------------


class PerCategory(nn.Module):
    """An ``nn.Embedding`` per categorical column, indexed by the position of the 1
    in the column's one-hot block (a block of zeros, a category unseen in training,
    gets a row of its own), beside the numeric columns, then an MLP to ``out``."""

    numeric: torch.Tensor

    def __init__(self, layout: FeatureLayout, out: int, dim: int, hidden: int):
        super().__init__()
        self.blocks = [(b.start, b.stop) for b in layout.categorical]
        self.register_buffer("numeric", torch.tensor(layout.numeric, dtype=torch.long), persistent=False)
        self.tables = nn.ModuleList(nn.Embedding(b.cardinality + 1, dim) for b in layout.categorical)
        width = len(layout.numeric) + dim * len(self.tables)
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [x[:, self.numeric]]
        for (start, stop), table in zip(self.blocks, self.tables, strict=True):
            block = x[:, start:stop]
            none = block.max(dim=1).values <= 0
            parts.append(table(torch.where(none, stop - start, block.argmax(dim=1))))
        return self.mlp(torch.cat(parts, dim=1))


def per_category(
    in_features: int, out: int, *, layout: FeatureLayout, dim: int = 3, hidden: int = 16
) -> nn.Module:
    """The factory, named in a protocol file as
    ``model: {factory: "bank_lab:per_category", params: {dim: 3}, out: 8}``."""
    if not layout.categorical:
        raise ConfigError("per_category needs categorical columns (preprocess.categorical)")
    return PerCategory(layout, out, dim, hidden)


# -- the defense ------------------------------------------------------------------------


def clip_rows(h: torch.Tensor, clip: float) -> torch.Tensor:
    """Each row of ``h`` scaled into the L2 ball of radius ``clip``."""
    return h * torch.clamp(clip / h.norm(dim=1, keepdim=True).clamp_min(1e-12), max=1.0)


class NoisyReleaseOptions(DefenseOptions):
    clip: float = Field(default=1.0, gt=0, description="L2 norm every released row is clipped to")
    noise_multiplier: float = Field(default=1.0, gt=0, description="noise std / sensitivity (2 clip)")


@register_defense
class NoisyRelease(Defense[NoisyReleaseOptions]):
    name = "noisy_release"
    sides = frozenset({"passive"})
    options = NoisyReleaseOptions

    def __init__(self, params: NoisyReleaseOptions, ctx) -> None:  # type: ignore[no-untyped-def]
        super().__init__(params, ctx)
        self.noise = ctx.noise_stream("noisy_release")  # the party's secret stream

    def embed(self, h: torch.Tensor, *, train: bool) -> torch.Tensor:
        hc = clip_rows(h, self.params.clip)
        std = self.params.noise_multiplier * 2.0 * self.params.clip
        return hc + (std * self.noise.normal(tuple(hc.shape))).to(dtype=hc.dtype, device=hc.device)

    def embed_local(self, h: torch.Tensor) -> torch.Tensor:
        return clip_rows(h, self.params.clip)

    def mechanisms(self, plan: Plan) -> list[Mechanism]:
        """One Gaussian release per step a record is in (or per evaluation of a test row)."""
        count = max(plan.record_releases, plan.evaluations)
        release = GaussianRelease(count=count, noise_multiplier=self.params.noise_multiplier)
        return [
            Mechanism(
                "noisy_release",
                (release,),
                boundary=EmbeddingBoundary(sensitivity=2.0 * self.params.clip, norm="l2"),
            )
        ]


# -- the attack -------------------------------------------------------------------------


def ridge(x: np.ndarray, y: np.ndarray, alpha: float) -> tuple[np.ndarray, float]:
    """Weights and intercept of a ridge regression of ``y`` on ``x`` (closed form)."""
    mx, my = x.mean(0), y.mean()
    xc = x - mx
    w = np.linalg.solve(xc.T @ xc + alpha * np.eye(x.shape[1]), xc.T @ (y - my))
    return w, float(my - mx @ w)


def r2(guess: np.ndarray, true: np.ndarray) -> float:
    """Coefficient of determination of ``guess`` for ``true``."""
    return float(1.0 - ((true - guess) ** 2).sum() / max(((true - true.mean()) ** 2).sum(), 1e-12))


class ColumnProbeOptions(AttackOptions):
    target: str | None = Field(default=None, description="victim passive party (default: the first)")
    column: str = Field(description="the victim's numeric column the bank tries to infer")
    aux_fraction: float = Field(default=0.2, gt=0, lt=1, description="training rows whose value A knows")
    alpha: float = Field(default=1.0, gt=0, description="ridge penalty")


def _column(world: World, target: str | None, column: str) -> torch.Tensor:
    """The victim's model-input column ``column`` (as its preprocessing made it)."""
    own = world.passive(target).own
    if column not in own.columns:
        raise ConfigError(f"column_probe: the target has no numeric column '{column}'", path="attacks")
    return own.x_raw[:, own.columns.index(column)].double()


@register_attack
class ColumnProbe(Attack[ColumnProbeOptions]):
    name = "column_probe"
    adversary = "active"
    options = ColumnProbeOptions

    def knowledge(self, world: World) -> dict[str, Any]:
        """The column's value on a random ``aux_fraction`` of the training rows."""
        own = world.passive(self.params.target).own
        n_train = len(own.train_idx)
        rng = np.random.default_rng(self.params.seed)  # the attack's randomness, not a secret
        aux = np.sort(
            rng.choice(n_train, size=max(2, round(self.params.aux_fraction * n_train)), replace=False)
        )
        values = _column(world, self.params.target, self.params.column)
        return {"aux_rows": aux, "aux_values": values[torch.as_tensor(own.train_idx[aux])].numpy()}

    def run(self, view: View) -> dict[str, Any]:
        own, prior = view.own, view.prior
        table = per_row(own.forwards, own.z, len(own.train_idx), len(own.test_idx))
        seen = table.train_seen[prior["aux_rows"]]
        w, b = ridge(
            table.train[prior["aux_rows"][seen]].double().numpy(),
            prior["aux_values"][seen],
            self.params.alpha,
        )
        rows = np.flatnonzero(table.test_seen)
        guess = table.test[rows].double().numpy() @ w + b
        return {"test_rows": rows, "guess": guess, "used": {"input": "z at A", "aux_rows": int(seen.sum())}}

    def score(self, guess: dict[str, Any], world: World) -> dict[str, Any]:
        own = world.passive(self.params.target).own
        values = _column(world, self.params.target, self.params.column)
        true = values[torch.as_tensor(own.test_idx[guess["test_rows"]])].numpy()
        return {"ap": r2(guess["guess"], true), "chance": 0.0, "n_test": len(true)}
