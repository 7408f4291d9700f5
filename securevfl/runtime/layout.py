"""Rank layout: rank 0 is the active party, ranks 1..k the passive parties, then
any helper ranks the exchange backend needs (e.g. a triple dealer)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from securevfl.config import Protocol

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
    def from_protocol(cls, proto: Protocol) -> Layout:
        from securevfl.exchange import EXCHANGES

        backend = EXCHANGES.get(proto.exchange.backend, path="exchange.backend")
        roles = [Role(0, "active", proto.parties.active.name, 0)]
        for i, p in enumerate(proto.parties.passive):
            roles.append(Role(1 + i, "passive", p.name, i))
        for j, name in enumerate(backend.helper_names(proto)):
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
            from securevfl.errors import ConfigError

            raise ConfigError(
                f"rank {rank} is out of range: this protocol has {self.world_size} ranks "
                f"(0..{self.world_size - 1}: " + ", ".join(f"{r.rank}={r.label}" for r in self.roles) + ")",
                path="--rank",
            )
        return self.roles[rank]
