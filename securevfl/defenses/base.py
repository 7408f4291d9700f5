"""The defense seam (DESIGN §5).

A defense is a class registered by name with any of these hooks; the default of
each hook is the identity, so a defense implements only what it changes:

* passive, forward: :meth:`Defense.embed` ``h -> h'``
* passive, local loss: :meth:`Defense.local_loss` ``(x, h, grad) -> tensor``
* passive, returned gradient: :meth:`Defense.grad` ``g -> g'``
* active, labels: :meth:`Defense.labels` ``y -> y'`` (once, before training)
* active, auxiliary loss: :meth:`Defense.top_loss`
* data, before training: :meth:`Defense.select_features`
* accounting: :meth:`Defense.mechanisms` declares what a DP defense releases
  about one record over a planned run, for the one accountant (DESIGN §7). It is a
  function of the protocol and the plan, not of the data, so every rank can
  compute a budget's stopping step before training (this replaces DESIGN's
  ``privacy_spent()``, which could only look back).
* reporting: :meth:`Defense.report` adds run statistics to the result

``sides`` says where it may run; ``requires`` names backend capabilities it needs
(e.g. ``active_sees_embeddings``) so an impossible combination is refused at load.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict

from securevfl.config import Protocol
from securevfl.privacy.accountant import Mechanism, Plan
from securevfl.registry import Registry


class DefenseOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class DefenseContext:
    """Where a defense runs. ``seed`` is the protocol's shared seed: every party
    knows it, so it may only drive what all parties must agree on (e.g. class
    codes). Noise that protects something draws on ``noise_seed``, private to
    this party: fresh OS entropy per run unless the protocol pins
    ``privacy.noise_seed`` for a reproducible experiment (which anyone who knows
    it can use to subtract the noise; see SECURITY.md)."""

    proto: Protocol
    party: str
    side: str  # "active" | "passive"
    seed: int
    noise_seed: int = 0


def private_noise_seed(proto: Protocol, party: str) -> int:
    """This party's noise seed: OS entropy, or derived from a pinned
    ``privacy.noise_seed`` (experiments and tests only)."""
    pinned = proto.privacy.noise_seed
    if pinned is None:
        return secrets.randbits(63)
    from securevfl.seeding import derive_seed

    return derive_seed(pinned, "noise", party)


class Defense:
    name: ClassVar[str]
    sides: ClassVar[frozenset[str]] = frozenset({"active", "passive"})
    requires: ClassVar[frozenset[str]] = frozenset()
    options: ClassVar[type[BaseModel]] = DefenseOptions

    def __init__(self, params: BaseModel, ctx: DefenseContext):
        self.params = params
        self.ctx = ctx

    # hooks: identity by default
    def select_features(self, x: np.ndarray, columns: list[str]) -> tuple[np.ndarray, list[str]]:
        return x, columns

    def labels(self, y: torch.Tensor, *, classes: int | None = None) -> torch.Tensor:
        """Training labels (class indices; ``classes`` = K from the dataset)."""
        return y

    def embed(self, h: torch.Tensor, *, train: bool) -> torch.Tensor:
        return h

    def grad(self, g: torch.Tensor) -> torch.Tensor:
        return g

    def local_loss(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor | None:
        return None

    def top_loss(
        self,
        z: torch.Tensor,
        logits: torch.Tensor,
        y: torch.Tensor,
        embeddings: list[torch.Tensor] | None = None,
    ) -> torch.Tensor | None:
        """Active-side auxiliary loss. ``embeddings`` are the h'_i A received
        (only under backends with ``active_sees_embeddings``; None otherwise)."""
        return None

    def mechanisms(self, plan: Plan) -> list[Mechanism]:
        """What this defense releases about one record over ``plan`` (DP defenses)."""
        return []

    def report(self) -> dict[str, Any]:
        """Run statistics worth keeping in ``result.json`` (e.g. rescaling factors)."""
        return {}

    def modules(self) -> list[torch.nn.Module]:
        """Trainable parts (their parameters join the party's optimizer)."""
        return []


DEFENSES: Registry[type[Defense]] = Registry("defense")


class DefenseStack:
    """A party's defenses in protocol-file order; each hook is folded over them."""

    def __init__(self, defenses: list[Defense]):
        self.defenses = defenses

    def select_features(self, x: np.ndarray, columns: list[str]) -> tuple[np.ndarray, list[str]]:
        for d in self.defenses:
            x, columns = d.select_features(x, columns)
        return x, columns

    def labels(self, y: torch.Tensor, *, classes: int | None = None) -> torch.Tensor:
        for d in self.defenses:
            y = d.labels(y, classes=classes)
        return y

    def embed(self, h: torch.Tensor, *, train: bool) -> torch.Tensor:
        for d in self.defenses:
            h = d.embed(h, train=train)
        return h

    def grad(self, g: torch.Tensor) -> torch.Tensor:
        for d in self.defenses:
            g = d.grad(g)
        return g

    def _sum(self, parts: list[torch.Tensor | None]) -> torch.Tensor | None:
        real = [p for p in parts if p is not None]
        return sum(real[1:], real[0]) if real else None

    def local_loss(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor | None:
        return self._sum([d.local_loss(x, h) for d in self.defenses])

    def top_loss(
        self,
        z: torch.Tensor,
        logits: torch.Tensor,
        y: torch.Tensor,
        embeddings: list[torch.Tensor] | None = None,
    ) -> torch.Tensor | None:
        return self._sum([d.top_loss(z, logits, y, embeddings) for d in self.defenses])

    def modules(self) -> list[torch.nn.Module]:
        return [m for d in self.defenses for m in d.modules()]

    def mechanisms(self, plan: Plan) -> list[Mechanism]:
        return [m for d in self.defenses for m in d.mechanisms(plan)]

    def report(self) -> dict[str, Any]:
        return {d.name: r for d in self.defenses if (r := d.report())}


def build_stack(proto: Protocol, party: str, side: str, specs) -> DefenseStack:
    out = []
    for spec in specs:
        cls = DEFENSES.get(spec.name)
        params = cls.options.model_validate(spec.params)
        ctx = DefenseContext(proto, party, side, proto.training.seed, private_noise_seed(proto, party))
        out.append(cls(params, ctx))
    return DefenseStack(out)
