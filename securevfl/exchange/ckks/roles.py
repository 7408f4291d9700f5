"""The role objects of ``ckks``: the two-party HE protocol with :class:`CkksScheme`."""

from __future__ import annotations

from securevfl.exchange.ckks.scheme import CkksScheme
from securevfl.exchange.he.roles import HERoles


class CkksRoles(HERoles):
    """A's and P_i's side of ``ckks`` (its declaration: :class:`~securevfl.exchange.ckks.Ckks`)."""

    scheme = CkksScheme
