"""A plugin DP defense: the Gaussian mechanism on each released embedding row (passive side).

Each passive party that lists ``{name: gaussian_release, params: {clip: 1.0, noise_multiplier: 1.0}}``
clips every row of its bottom model's output h to L2 norm ``clip`` and adds Gaussian noise of
standard deviation ``noise_multiplier x 2 clip`` to the copy it releases, at training and at
evaluation. Two records' rows, each inside the ball of radius ``clip``, are at most ``2 clip``
apart (replace-one neighbours), so one release is the Gaussian mechanism of multiplier
``noise_multiplier`` (Dwork & Roth 2014, Thm A.1; its exact epsilon: Balle & Wang 2018).

Threat model: an honest-but-curious active party (or an eavesdropper on the passive -> active
channel) that sees every released row and tries to tell which of two records a row came from.
What it does not cover: the bottom model's dependence on earlier training records, the labels,
and which records are aligned. The noise comes from the party's own secret stream
(``self.ctx.noise_stream(...)``), never from torch's or numpy's generators.

It declares what it releases (docs/extending.md, "Declaring a DP mechanism"): one Gaussian
release of multiplier ``noise_multiplier`` per step a record is in and per evaluation of a test
row, with an :class:`EmbeddingBoundary` of L2 sensitivity ``2 clip``, so the accountant composes
it and the privacy audit runs this very ``embed`` on canaries at that boundary after training.
"""

from __future__ import annotations

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


def clip_rows(h: torch.Tensor, clip: float) -> torch.Tensor:
    """Each row of ``h`` scaled into the L2 ball of radius ``clip`` (rows inside are unchanged)."""
    norm = h.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return h * torch.clamp(clip / norm, max=1.0)


class GaussianReleaseOptions(DefenseOptions):
    clip: float = Field(default=1.0, gt=0, description="L2 norm every released row is clipped to")
    noise_multiplier: float = Field(default=1.0, gt=0, description="noise std / L2 sensitivity (2 clip)")


@register_defense
class GaussianReleaseDefense(Defense[GaussianReleaseOptions]):
    name = "gaussian_release"
    sides = frozenset({"passive"})
    options = GaussianReleaseOptions

    def __init__(self, params: GaussianReleaseOptions, ctx) -> None:  # type: ignore[no-untyped-def]
        super().__init__(params, ctx)
        self.noise = ctx.noise_stream("gaussian_release")  # the party's secret stream

    @property
    def sensitivity(self) -> float:
        return 2.0 * self.params.clip

    def embed(self, h: torch.Tensor, *, train: bool) -> torch.Tensor:
        hc = clip_rows(h, self.params.clip)
        std = self.params.noise_multiplier * self.sensitivity
        return hc + (std * self.noise.normal(tuple(hc.shape))).to(dtype=hc.dtype, device=hc.device)

    def embed_local(self, h: torch.Tensor) -> torch.Tensor:
        return clip_rows(h, self.params.clip)

    def mechanisms(self, plan: Plan) -> list[Mechanism]:
        count = max(plan.record_releases, plan.evaluations)
        return [
            Mechanism(
                "gaussian_release",
                (GaussianRelease(count=count, noise_multiplier=self.params.noise_multiplier),),
                notes=("count = max(training steps a record was in, evaluations of a test row)",),
                boundary=EmbeddingBoundary(sensitivity=self.sensitivity, norm="l2"),
            )
        ]
