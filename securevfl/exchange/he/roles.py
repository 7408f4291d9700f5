"""The role objects of a homomorphic backend: the two-party protocol
(:mod:`securevfl.exchange.he.protocol`) with the scheme's keys and arithmetic. A
scheme package's ``roles`` module subclasses :class:`HERoles` with its scheme."""

from __future__ import annotations

from typing import ClassVar

from securevfl.exchange.base import ActiveExchange, ExchangeContext, PassiveExchange, Roles
from securevfl.exchange.he.protocol import HEActive, HEPassive
from securevfl.exchange.he.scheme import HEScheme


class HERoles(Roles):
    """A's and P_i's side of the two-party protocol with :attr:`scheme`, sized for
    the run (:meth:`HEScheme.for_run`); the HE backends have no helper ranks."""

    scheme: ClassVar[type[HEScheme]]

    @classmethod
    def active(cls, ctx: ExchangeContext) -> ActiveExchange:
        return HEActive(ctx, cls.scheme.for_run(ctx), ctx.options.weight_init)  # type: ignore[attr-defined]

    @classmethod
    def passive(cls, ctx: ExchangeContext) -> PassiveExchange:
        return HEPassive(ctx, cls.scheme.for_run(ctx), ctx.options.weight_init)  # type: ignore[attr-defined]
