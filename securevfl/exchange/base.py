"""The exchange-backend seam.

A backend is one class registered by name. It declares

* ``capabilities``: what it offers, e.g. ``active_sees_embeddings`` (A receives
  h'_i in the clear), ``cuda``, or ``local_steps`` (FedBCD rounds: the round
  methods below); defenses and attacks state what they require,
  and a protocol asking for a combination that cannot work is rejected at load;
* ``options``: a strict pydantic model of its ``exchange.params``;
* ``helper_names``: extra ranks it needs (a dealer, say);

and builds one role object per rank. The party code only ever calls
``forward``/``backward`` on those role objects, so the training loop never
branches on a backend's name.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict

from securevfl.config import Protocol
from securevfl.errors import CheckpointError, CryptoParameterError, SecurityWarning
from securevfl.registry import Registry
from securevfl.runtime.channel import Channel
from securevfl.runtime.layout import Layout
from securevfl.snapshot import ComponentState


@dataclass(frozen=True)
class RunPlan:
    """The batch sizes a run will put through the exchange, the same at every party
    (:mod:`securevfl.schedule` derives them from the protocol and the aligned row
    counts): ``train``, how many training steps of each batch size are still to
    come (counts, not a list of steps: its size does not grow with the number of
    epochs); ``evaluation``, one evaluation pass's batch sizes in order (every
    evaluation runs the same batches)."""

    train: Mapping[int, int]
    evaluation: tuple[int, ...]


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
    # per passive party: whether everything it sends forward is +-1 (defenses.base.sends_codes)
    sends_codes: list[bool] = field(default_factory=list)


class ActiveExchange(ABC):
    """Active-party side. ``forward`` returns sum_i h'_i W_i for the batch (as much
    as A is allowed to see: the sum's value, not its parts); ``backward`` takes
    dL/dz, updates or helps update every W_i and returns nothing."""

    @abstractmethod
    def forward(self, batch_size: int, *, train: bool) -> torch.Tensor: ...

    def expect(self, plan: RunPlan) -> None:  # noqa: B027 - optional hook
        """The run's batch sizes ahead (called once, before the first step; prediction
        calls it with its one pass): a backend that prepares material ahead
        (``mpc``'s dealer tuples) sizes it to what the run will use. A caller that
        does not call it gets the backend's default sizing."""

    @abstractmethod
    def backward(self, grad_z: torch.Tensor) -> None: ...

    # -- FedBCD rounds (capability ``local_steps``; docs/methods/crdp-fl.md §2.2 Eq. 14) --------------
    def receive_round(self, sizes: list[int]) -> None:
        """Receive every passive party's embeddings for a round's batches (of
        ``sizes`` rows), one message per party, and keep them for the round."""
        raise NotImplementedError(f"{type(self).__name__} has no FedBCD rounds")

    def forward_local(self, r: int, *, record_grad: bool) -> torch.Tensor:
        """z for the round's batch ``r`` from the kept embeddings and the current
        interactive layer. ``record_grad``: the following :meth:`backward_local`
        adds dL/dh'_i of this batch to what :meth:`send_round_grads` sends and
        changes nothing; otherwise it updates the layer and sends nothing."""
        raise NotImplementedError(f"{type(self).__name__} has no FedBCD rounds")

    def backward_local(self, grad_z: torch.Tensor) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no FedBCD rounds")

    def send_round_grads(self) -> None:
        """Send each passive party dL/dh'_i for all the round's batches, one message."""
        raise NotImplementedError(f"{type(self).__name__} has no FedBCD rounds")

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

    def checkpoint_state(self) -> ComponentState:
        """What this rank holds of the interactive layer, to continue a run from a
        checkpoint or to predict with the trained model: its weights or its
        shares of them, their optimizer state. It never leaves this rank (docs/design.md
        §12). The default holds nothing."""
        return ComponentState()

    def restore(self, state: ComponentState) -> None:
        """Take back what :meth:`checkpoint_state` returned (on the same rank, for
        the same protocol), after construction and before the first step."""
        _restore_nothing(self, state)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources at the end of the run."""


class PassiveExchange(ABC):
    """Passive-party side: ``forward`` contributes h'_i for a batch; ``backward``
    returns dL/dh'_i (train steps only)."""

    @abstractmethod
    def forward(self, h: torch.Tensor, *, train: bool) -> None: ...

    def expect(self, plan: RunPlan) -> None:  # noqa: B027 - optional hook
        """As :meth:`ActiveExchange.expect`."""

    @abstractmethod
    def backward(self) -> torch.Tensor: ...

    # -- FedBCD rounds (capability ``local_steps``) -------------------------------------
    def send_round(self, hs: list[torch.Tensor]) -> None:
        """Contribute h'_i for each of a round's batches, in one message."""
        raise NotImplementedError(f"{type(self).__name__} has no FedBCD rounds")

    def receive_round_grads(self, sizes: list[int]) -> list[torch.Tensor]:
        """dL/dh'_i for each of the round's batches, computed by A at the
        round's parameters (one message)."""
        raise NotImplementedError(f"{type(self).__name__} has no FedBCD rounds")

    def state(self) -> dict[str, torch.Tensor]:
        return {}

    def checkpoint_state(self) -> ComponentState:
        """What this rank holds of the interactive layer, to continue a run from a
        checkpoint or to predict with the trained model: its weights or its
        shares of them, their optimizer state. It never leaves this rank (docs/design.md
        §12). The default holds nothing."""
        return ComponentState()

    def restore(self, state: ComponentState) -> None:
        """Take back what :meth:`checkpoint_state` returned (on the same rank, for
        the same protocol), after construction and before the first step."""
        _restore_nothing(self, state)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources at the end of the run."""


class HelperExchange(ABC):
    """A helper rank (e.g. a triple dealer): serves until the parties are done.

    A helper keeps no state a resumed run needs (a dealer's tuples are fresh
    randomness per request), so it writes no checkpoint: on ``--resume`` it
    starts afresh and serves the parties from the agreed epoch on."""

    @abstractmethod
    def serve(self) -> None: ...


def _restore_nothing(obj: object, state: ComponentState) -> None:
    if state.tensors or state.meta:
        keys = sorted([*state.tensors, *state.meta])
        raise CheckpointError(
            f"{type(obj).__name__} holds no checkpoint state, but the checkpoint has {keys[:5]}"
        )


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


#: what a run with ``weight_init: seeded`` (and ``insecure: true``) is told, and records
SEEDED_WARNING = (
    "weight_init: seeded: the active party starts from the interactive layer's W_i^0 of the public "
    "seed and so knows it exactly (it can read h'_i off z_i at the first steps); for step-by-step "
    "comparisons with plain only, not private"
)


def check_weight_init(options: BaseModel) -> None:
    """Refuse ``weight_init: seeded`` unless the options also say ``insecure: true``
    (a CryptoParameterError naming the field), and warn when they do. Under
    ``seeded`` A holds W_i^0, which every party can compute from the protocol seed,
    so z_i = h'_i W_i hands A the embedding at the first steps: a verification
    setting (runs compared step by step with ``plain``), like CrypTen's TFP provider.
    For the options of a backend with ``weight_init`` and ``insecure`` fields."""
    if getattr(options, "weight_init", None) != "seeded":
        return
    if not getattr(options, "insecure", False):
        raise CryptoParameterError(
            "weight_init: seeded gives the active party the initial interactive weights W_i^0 "
            "exactly (they follow from the public seed), so z_i reveals the embeddings h'_i at the "
            "first steps; it is for step-by-step comparisons with plain only: set insecure: true "
            "beside it to allow that, or leave weight_init at its default",
            path="exchange.params.weight_init",
        )
    warnings.warn(SecurityWarning(SEEDED_WARNING), stacklevel=3)


EXCHANGES: Registry[type[ExchangeBackend]] = Registry("exchange backend")
