"""Rank layout: rank 0 is the active party, ranks 1..k the passive parties, then
any helper ranks the exchange backend needs (e.g. a triple dealer).

The layout is wire-level: it knows the protocol's parties and takes the helper
names from its caller (the backend's ``helper_names``, looked up in the exchange
registry by :func:`securevfl.app.rank_layout.layout_of`), so the runtime does not
depend on the exchange backends built on top of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from securevfl.config import Protocol
from securevfl.errors import ConfigError

RoleKind = Literal["active", "passive", "helper"]


@dataclass(frozen=True)
class Role:
    rank: int
    kind: RoleKind
    party: str
    index: int  # position among roles of its kind

    @property
    def label(self) -> str:
        return f"{self.kind} '{self.party}'"


@dataclass(frozen=True)
class Layout:
    roles: tuple[Role, ...]

    @classmethod
    def from_protocol(cls, proto: Protocol, helpers: Sequence[str]) -> Layout:
        """The protocol's parties in rank order, then one helper rank per name in
        ``helpers`` (the exchange backend's ``helper_names(proto)``)."""
        roles = [Role(0, "active", proto.parties.active.name, 0)]
        for i, p in enumerate(proto.parties.passive):
            roles.append(Role(1 + i, "passive", p.name, i))
        for j, name in enumerate(helpers):
            roles.append(Role(len(roles), "helper", name, j))
        return cls(tuple(roles))

    @property
    def world_size(self) -> int:
        return len(self.roles)

    @property
    def active(self) -> Role:
        return self.roles[0]

    @property
    def passive(self) -> list[Role]:
        return [r for r in self.roles if r.kind == "passive"]

    @property
    def helpers(self) -> list[Role]:
        return [r for r in self.roles if r.kind == "helper"]

    def names(self) -> dict[int, str]:
        return {r.rank: r.label for r in self.roles}

    def role(self, rank: int) -> Role:
        if not 0 <= rank < self.world_size:
            raise ConfigError(
                f"rank {rank} is out of range: this protocol has {self.world_size} ranks "
                f"(0..{self.world_size - 1}: " + ", ".join(f"{r.rank}={r.label}" for r in self.roles) + ")",
                path="--rank",
            )
        return self.roles[rank]
