"""Label DP by randomized response at the active party (docs/methods/label-dp.md).

Threat model: a semi-honest passive party infers A's labels from the gradients
dL/dh'_i it receives (norm/direction scoring, model completion). A trains on
labels perturbed once, before training, by K-ary randomized response, so the
gradients can reveal at most the perturbed labels: each label is pure
``epsilon``-label-DP, and reusing the same noisy labels every epoch is
post-processing (the total stays ``epsilon``, docs/methods/label-dp.md §3). Test labels are never
perturbed (they are only used to score the model).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from securevfl.defenses.base import Defense
from securevfl.privacy.accountant import EpsDeltaRelease, Mechanism, NonPrivateRelease, Plan
from securevfl.privacy.boundary import LabelBoundary
from securevfl.privacy.randomized_response import randomize


class LabelDPOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    epsilon: float = Field(ge=0, description="label-DP epsilon; 0 = uniform labels, null = no noise")

    @field_validator("epsilon", mode="before")
    @classmethod
    def _null_is_infinite(cls, v: Any) -> Any:
        """A protocol writes "no noise" as ``null`` (non-finite numbers are refused
        at load); internally it is eps = inf."""
        return math.inf if v is None else v


class LabelDP(Defense[LabelDPOptions]):
    name = "label_dp"
    sides = frozenset({"active"})
    needs_classes = "randomized response replaces a label by another class"
    options = LabelDPOptions

    def __init__(self, params: LabelDPOptions, ctx) -> None:
        super().__init__(params, ctx)
        self.flipped: float | None = None
        self.classes: int | None = None  # K, known once the labels are (the audit's boundary)

    def labels(self, y: torch.Tensor, *, classes: int | None = None) -> torch.Tensor:
        eps = self.params.epsilon
        self.classes = classes
        out = randomize(y, eps, self.ctx.noise_stream("label_dp"), classes=classes)  # private
        self.flipped = float((out != y).float().mean()) if y.numel() else 0.0
        return out

    def mechanisms(self, plan: Plan) -> list[Mechanism]:
        eps = self.params.epsilon
        release = NonPrivateRelease(count=1) if math.isinf(eps) else EpsDeltaRelease(count=1, epsilon=eps)
        return [
            Mechanism(
                "label_dp.randomized_response",
                (release,),
                notes=("labels perturbed once before training and reused: pure eps per label",),
                # neighbours: two different labels, through this defense's own labels() hook
                boundary=LabelBoundary(classes=max(2, self.classes or 2)),
            )
        ]

    def report(self) -> dict[str, float]:
        return {} if self.flipped is None else {"labels_changed": self.flipped}
