"""What a DP mechanism declares about its neighbouring inputs, so that the audit can test it
(docs/privacy.md, "The audit"; docs/extending.md, "Declaring a DP mechanism").

A :class:`~securevfl.privacy.accountant.Mechanism` may carry one boundary: the pair of inputs
of the defense's own hook that the mechanism's accounting treats as neighbours. The audit
(:mod:`securevfl.privacy.audit`) builds canary pairs exactly at that boundary, runs the hook on
them many times with fresh secret noise and turns how well a test tells them apart into a lower
bound on the mechanism's per-release epsilon. A boundary is a public constant of the protocol
(never a statistic of the data).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Norm = Literal["l1", "l2"]


@dataclass(frozen=True)
class EmbeddingBoundary:
    """The mechanism is the defense's own ``embed(h, train=True)``: two rows that differ by
    ``sensitivity`` in ``norm`` are neighbours (the replace-one sensitivity the noise is
    calibrated to). ``assumed=True`` says that nothing in the code enforces that bound (e.g. a
    calibration that assumes an embedding scale of 1 without clipping): the audit then also
    audits at the scale the run actually released."""

    sensitivity: float
    norm: Norm = "l2"
    assumed: bool = False

    def __post_init__(self) -> None:
        if not (self.sensitivity > 0 and math.isfinite(self.sensitivity)):
            raise ValueError(
                f"an embedding boundary needs a positive finite sensitivity, got {self.sensitivity}"
            )
        if self.norm not in ("l1", "l2"):
            raise ValueError(f"an embedding boundary's norm is 'l1' or 'l2', got {self.norm!r}")


@dataclass(frozen=True)
class LabelBoundary:
    """The mechanism is the defense's own ``labels(y, classes=K)``: two different labels are
    neighbours."""

    classes: int

    def __post_init__(self) -> None:
        if self.classes < 2:
            raise ValueError(f"a label boundary needs at least 2 classes, got {self.classes}")


Boundary = EmbeddingBoundary | LabelBoundary
