"""The exchange-backend seam.

A backend is one class registered by name. It declares

* ``capabilities``: what it offers, e.g. ``active_sees_embeddings`` (A receives
  h'_i in the clear) or ``cuda``; defenses and attacks state what they require,
  and a protocol asking for a combination that cannot work is rejected at load;
* ``options``: a strict pydantic model of its ``exchange.params``;
* ``helper_names``: extra ranks it needs (a dealer, say);

and builds one role object per rank. The party code only ever calls
``forward``/``backward`` on those role objects, so the training loop never
branches on a backend's name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict

from securevfl.config import Protocol
from securevfl.registry import Registry
from securevfl.runtime.channel import Channel
from securevfl.runtime.layout import Layout


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass
class ExchangeContext:
    """What a role object may use: its channel, the layout, the protocol, the
    embedding sizes d_i of every passive party and the torch device."""

    channel: Channel
    layout: Layout
    rank: int
    proto: Protocol
    options: BaseModel
    embed_dims: list[int]
    device: torch.device


class ActiveExchange(ABC):
    """Active-party side. ``forward`` returns sum_i h'_i W_i for the batch (as much
    as A is allowed to see: the sum's value, not its parts); ``backward`` takes
    dL/dz, updates or helps update every W_i and returns nothing."""

    @abstractmethod
    def forward(self, batch_size: int, *, train: bool) -> torch.Tensor: ...

    @abstractmethod
    def backward(self, grad_z: torch.Tensor) -> None: ...

    def embeddings(self) -> list[torch.Tensor] | None:
        """The passive parties' embeddings h'_i of the last forward, where this
        backend shows them to A (``active_sees_embeddings``); None otherwise. In a
        training step they require grad, so an active-side loss on them (e.g.
        HashVFL's consistency loss) reaches the passive parties through the
        returned gradient."""
        return None

    def state(self) -> dict[str, torch.Tensor]:
        """Plaintext parameters this party holds (for checkpoints and tests)."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources at the end of the run."""


class PassiveExchange(ABC):
    """Passive-party side: ``forward`` contributes h'_i for a batch; ``backward``
    returns dL/dh'_i (train steps only)."""

    @abstractmethod
    def forward(self, h: torch.Tensor, *, train: bool) -> None: ...

    @abstractmethod
    def backward(self) -> torch.Tensor: ...

    def state(self) -> dict[str, torch.Tensor]:
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources at the end of the run."""


class HelperExchange(ABC):
    """A helper rank (e.g. a triple dealer): serves until the parties are done."""

    @abstractmethod
    def serve(self) -> None: ...


class ExchangeBackend(ABC):
    name: ClassVar[str]
    capabilities: ClassVar[frozenset[str]] = frozenset()
    options: ClassVar[type[BaseModel]] = NoOptions
    description: ClassVar[str] = ""

    @classmethod
    def helper_names(cls, proto: Protocol) -> list[str]:
        return []

    @classmethod  # noqa: B027 - optional hook
    def check(cls, proto: Protocol, options: BaseModel) -> None:
        """Extra load-time checks (security floors, sizes); raise ConfigError."""

    @classmethod
    @abstractmethod
    def active(cls, ctx: ExchangeContext) -> ActiveExchange: ...

    @classmethod
    @abstractmethod
    def passive(cls, ctx: ExchangeContext) -> PassiveExchange: ...

    @classmethod
    def helper(cls, ctx: ExchangeContext) -> HelperExchange:
        raise NotImplementedError(f"backend {cls.name} has no helper ranks")

    @classmethod
    def result_info(cls, options: BaseModel) -> dict[str, Any]:
        """What the result record should say about this backend's settings."""
        return {"backend": cls.name, "params": options.model_dump(mode="json")}


EXCHANGES: Registry[type[ExchangeBackend]] = Registry("exchange backend")
