"""The exchange-backend seam: the role objects a backend builds, one per rank.

A backend is one package whose face declares it (capabilities, options, helper
ranks, load-time checks, where its role objects live: :mod:`securevfl.exchange.spec`,
re-exported here) and whose ``roles`` module builds one role object per rank, with
the interfaces below. The party code only ever calls ``forward``/``backward`` on
those role objects, so the training loop never branches on a backend's name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from pydantic import BaseModel

from securevfl.components import CheckedProtocol, Components
from securevfl.config import Protocol
from securevfl.errors import CheckpointError
from securevfl.exchange.spec import (
    EXCHANGES,
    SEEDED_WARNING,
    ExchangeBackend,
    NoOptions,
    Roles,
    check_weight_init,
)
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


@dataclass
class ExchangeContext:
    """What a role object may use: its channel, the layout, the protocol and its
    resolved components (passed down from the checked loader), the embedding
    sizes d_i of every passive party and the torch device."""

    channel: Channel
    layout: Layout
    rank: int
    checked: CheckedProtocol
    options: BaseModel
    embed_dims: list[int]
    device: torch.device
    # per passive party: whether everything it sends forward is +-1 (components.PartyComponents.sends_codes)
    sends_codes: list[bool] = field(default_factory=list)

    @property
    def proto(self) -> Protocol:
        return self.checked.protocol

    @property
    def components(self) -> Components:
        return self.checked.components


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


__all__ = [
    "EXCHANGES",
    "SEEDED_WARNING",
    "ActiveExchange",
    "ExchangeBackend",
    "ExchangeContext",
    "HelperExchange",
    "NoOptions",
    "PassiveExchange",
    "Roles",
    "RunPlan",
    "check_weight_init",
]
