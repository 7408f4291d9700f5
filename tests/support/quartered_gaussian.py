"""A broken DP plugin defense for the audit's tests (positive control), written against
``securevfl.plugins`` alone: it declares the Gaussian mechanism of multiplier ``z`` on rows
clipped to L2 norm ``clip`` (sensitivity ``2 clip``), but adds a quarter of the noise it
declares. The privacy audit must find its claim violated."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from securevfl.plugins import (
    Defense,
    DefenseOptions,
    EmbeddingBoundary,
    GaussianRelease,
    Mechanism,
    Plan,
    register_defense,
)


class QuarteredOptions(DefenseOptions):
    clip: float = Field(default=1.0, gt=0)
    noise_multiplier: float = Field(default=1.0, gt=0)


@register_defense
class QuarteredGaussian(Defense[QuarteredOptions]):
    name = "quartered_gaussian"
    sides = frozenset({"passive"})
    options = QuarteredOptions

    def __init__(self, params: QuarteredOptions, ctx: Any) -> None:
        super().__init__(params, ctx)
        self.noise = ctx.noise_stream("quartered_gaussian")

    def embed(self, h: torch.Tensor, *, train: bool) -> torch.Tensor:
        c = self.params.clip
        hc = h * torch.clamp(c / h.norm(dim=1, keepdim=True).clamp_min(1e-12), max=1.0)
        std = 0.25 * self.params.noise_multiplier * 2.0 * c  # the planted flaw: a quarter of the declared std
        return hc + (std * self.noise.normal(tuple(hc.shape))).to(hc.dtype)

    def mechanisms(self, plan: Plan) -> list[Mechanism]:
        z = self.params.noise_multiplier
        return [
            Mechanism(
                "quartered_gaussian",
                (GaussianRelease(count=max(plan.record_releases, plan.evaluations), noise_multiplier=z),),
                boundary=EmbeddingBoundary(sensitivity=2.0 * self.params.clip),
            )
        ]
