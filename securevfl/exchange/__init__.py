"""Exchange backends: how the interactive layer z = sum_i h'_i W_i is formed and
what each party learns (docs/design.md §4). Backends register by name in EXCHANGES.

The built-in backends are registered by where they live and imported on first
lookup (:meth:`~securevfl.registry.Registry.add_path`). ``plain`` and ``mpc``
declare themselves apart from their role objects (:mod:`.declared`, which
imports neither torch nor CrypTen) and register those in ROLES: loading a
protocol reads the declaration, and only a rank that builds its role imports
the backend's machinery. A process imports the backend its protocol names, not
CrypTen's helpers or the HE schemes of the others. This face imports nothing
heavy: the role interfaces are :mod:`securevfl.exchange.base`."""

from securevfl.exchange.spec import EXCHANGES, ROLES

EXCHANGES.add_path("plain", "securevfl.exchange.declared:Plain")
EXCHANGES.add_path("mpc", "securevfl.exchange.declared:Mpc")
EXCHANGES.add_path("ckks", "securevfl.exchange.ckks:Ckks")
EXCHANGES.add_path("paillier", "securevfl.exchange.paillier.backend:PaillierBackend")

ROLES.add_path("plain", "securevfl.exchange.plain:PlainRoles")
ROLES.add_path("mpc", "securevfl.exchange.mpc:MpcRoles")

__all__ = ["EXCHANGES", "ROLES"]
