"""Exchange backends: how the interactive layer z = sum_i h'_i W_i is formed and
what each party learns (docs/design.md §4).

A backend is one package, ``securevfl/exchange/<name>/``: its face declares it (an
:class:`~securevfl.exchange.spec.ExchangeBackend` subclass: capabilities, options,
load-time checks, and where its role objects live), importing neither torch nor a
crypto library, and its ``roles`` module builds the role objects
(:mod:`securevfl.exchange.base`). Each is registered here, by the path of its
declaration, in the one registry EXCHANGES, and imported on first lookup
(:meth:`~securevfl.registry.Registry.add_path`): loading a protocol reads the
declaration, and only a rank that builds its role imports the backend's machinery.
Adding a backend: docs/extending.md, "Adding an exchange backend"."""

from securevfl.exchange.spec import EXCHANGES

EXCHANGES.add_path("plain", "securevfl.exchange.plain:Plain")
EXCHANGES.add_path("mpc", "securevfl.exchange.mpc:Mpc")
EXCHANGES.add_path("ckks", "securevfl.exchange.ckks:Ckks")
EXCHANGES.add_path("paillier", "securevfl.exchange.paillier:Paillier")

__all__ = ["EXCHANGES"]
