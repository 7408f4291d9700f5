"""What every party does before training: load its own file, align by PSI, split,
standardize; build its defense stack and plan its steps under the privacy budget."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from securevfl.config import PartySpec, Protocol
from securevfl.data.alignment import align_active, align_passive
from securevfl.data.partition import dataset_standardize, party_source
from securevfl.data.party_data import (
    PartyData,
    check_test_rows,
    load_party_data,
    split_indices,
    standardize,
)
from securevfl.defenses.base import CollectiveContext, build_stack, run_collectives
from securevfl.defenses.budget import allowed_steps
from securevfl.exchange.base import ExchangeBackend, ExchangeContext
from securevfl.privacy.accountant import account
from securevfl.privacy.budget import plan_for
from securevfl.runtime.channel import Channel
from securevfl.runtime.layout import Layout, Role
from securevfl.runtime.session import Session
from securevfl.schedule import planned_steps
from securevfl.seeding import generator


@dataclass
class Prepared:
    """A party's aligned rows, split into train and test (features scaled)."""

    data: PartyData  # aligned rows, in agreed order
    train_idx: np.ndarray
    test_idx: np.ndarray
    x_train: np.ndarray
    x_test: np.ndarray


def prepare(proto: Protocol, layout: Layout, role: Role, channel: Channel, data_dir: Path) -> Prepared:
    source = party_source(proto, role.party, data_dir)
    raw = load_party_data(source, role.party, is_active=role.kind == "active")
    channel.phase = "psi"
    if role.kind == "active":
        order = align_active(channel, layout, raw.ids)
    else:
        order = align_passive(channel, layout, role.rank, raw.ids)
    channel.phase = "setup"  # what follows (e.g. key exchange) is set-up, not PSI
    data = raw.take(order)
    train_idx, test_idx = split_indices(
        len(data.ids), proto.dataset.test_fraction, generator(proto.training.seed, "split")
    )
    check_test_rows(role.party, len(test_idx), data.classes)
    x_tr, x_te = data.x[train_idx], data.x[test_idx]
    if data.x.shape[1] and dataset_standardize(proto, data_dir):
        x_tr, x_te = standardize(x_tr, x_te)
    return Prepared(data, train_idx, test_idx, x_tr, x_te)


class Party:
    """What every party holds: its session, protocol, exchange context, prepared
    rows and its defense stack (in protocol-file order). Each role adds its own
    models and exchange in :meth:`_setup`."""

    side: str  # "active" | "passive"

    def __init__(
        self,
        session: Session,
        backend: type[ExchangeBackend],
        ctx: ExchangeContext,
        prep: Prepared,
        *,
        progress: bool,
    ):
        self.s = session
        self.proto = session.proto
        self.ctx = ctx
        self.prep = prep
        self.device = ctx.device
        self.backend = backend
        self.spec = self._spec()
        self.stack = build_stack(self.proto, self.spec.name, self.side, self.spec.defenses)
        n_train = len(prep.train_idx)
        self.planned_steps = planned_steps(n_train, self.proto.training)
        self.allowed_steps = allowed_steps(self.proto, n_train)
        self._setup(prep, progress=progress)
        self._collective(n_train)

    def _collective(self, n_train: int) -> None:
        """Every party rank enters the defenses' collective set-up steps here, once
        the exchange is up and before the first training step (DESIGN §5 seam)."""
        self.ctx.channel.phase = "setup"
        comm = CollectiveContext(
            self.proto,
            self.s.layout,
            self.s.rank,
            self.spec.name,
            self.side,
            n_train,
            frozenset(self.backend.capabilities),
        )
        run_collectives(self.stack, comm)

    def privacy_summary(self, steps: int) -> dict[str, Any]:
        """This party's own accounting over the steps actually run, and its
        defenses' run statistics (merged into ``result.json`` by rank 0)."""
        plan = plan_for(steps, len(self.prep.train_idx), self.proto.training)
        mechs = self.stack.mechanisms(plan)
        return {
            "privacy": account({self.spec.name: mechs}, self.proto.privacy.delta) if mechs else {},
            "defense_report": self.stack.report(),
            "planned_steps": self.planned_steps,
            "allowed_steps": self.allowed_steps,
        }

    def _setup(self, prep: Prepared, *, progress: bool) -> None:
        raise NotImplementedError

    def _spec(self) -> PartySpec:
        role = self.s.role
        return self.proto.parties.active if role.kind == "active" else self.proto.parties.passive[role.index]
