"""A user's own components, as a module beside a script would hold them: a
model factory, a defense class and an attack class, for the tests of
``securevfl.api`` taking objects where a protocol file names things."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from securevfl.attacks.base import Attack, AttackOptions, View
from securevfl.defenses.base import Defense, DefenseContext, DefenseOptions


def bottom(in_features: int, out: int, **params: Any) -> torch.nn.Module:
    """A model factory: one linear layer."""
    return torch.nn.Linear(in_features, out)


class RoundingOptions(DefenseOptions):
    decimals: int = Field(default=1, ge=0, le=6)


class Rounding(Defense[RoundingOptions]):
    """Rounds every released embedding to ``decimals`` places; the gradient passes
    straight through. (A test defense: it protects nothing.)"""

    name = "test_rounding"
    sides = frozenset({"passive"})
    options = RoundingOptions

    def __init__(self, params: RoundingOptions, ctx: DefenseContext):
        super().__init__(params, ctx)
        self.released = 0

    def embed(self, h: torch.Tensor, *, train: bool) -> torch.Tensor:
        scale = 10.0**self.params.decimals
        self.released += 1
        return h + (torch.round(h * scale) / scale - h).detach()

    def report(self) -> dict[str, Any]:
        return {"decimals": self.params.decimals, "released": self.released}


class Idle(Attack[AttackOptions]):
    """An attack class that guesses nothing (conversion tests only)."""

    name = "test_idle"

    def run(self, view: View) -> dict[str, Any]:
        return {"used": []}

    def score(self, guess: dict[str, Any], world: Any) -> dict[str, Any]:
        return {}


class Named(Defense[DefenseOptions]):
    """A defense class that takes a built-in's name (refused)."""

    name = "embedding_dp"
