"""The role objects of ``paillier``: the two-party HE protocol with :class:`PaillierScheme`."""

from __future__ import annotations

from securevfl.exchange.he.roles import HERoles
from securevfl.exchange.paillier.backend import PaillierScheme


class PaillierRoles(HERoles):
    """A's and P_i's side of ``paillier`` (its declaration:
    :class:`~securevfl.exchange.paillier.Paillier`)."""

    scheme = PaillierScheme
