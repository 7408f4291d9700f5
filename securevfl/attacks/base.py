"""The attack seam (DESIGN §6).

An attack runs inside the adversary's own rank after training, on a :class:`View`:
the tensors that rank received (from its ledger) plus its own data and models. It
never sees anything another rank kept to itself, so what it learns is what that
party could learn. ``requires`` names the backend capabilities under which the
attack's view exists, checked at load like a defense's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict

from securevfl.registry import Registry


class AttackOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass
class View:
    """What one rank saw: received tensors by tag (in arrival order, with their
    round), plus the rank's own data and plaintext state."""

    rank: int
    party: str
    received: dict[str, list[tuple[int, torch.Tensor]]]
    own: dict[str, Any] = field(default_factory=dict)

    def tensors(self, tag: str) -> list[torch.Tensor]:
        return [t for _, t in self.received.get(tag, [])]


class Attack:
    name: ClassVar[str]
    adversary: ClassVar[str] = "active"  # "active" | "passive"
    requires: ClassVar[frozenset[str]] = frozenset()
    options: ClassVar[type[BaseModel]] = AttackOptions

    def __init__(self, params: BaseModel):
        self.params = params

    def run(self, view: View) -> dict[str, float]:
        raise NotImplementedError


ATTACKS: Registry[type[Attack]] = Registry("attack")
