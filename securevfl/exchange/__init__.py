"""Exchange backends: how the interactive layer z = sum_i h'_i W_i is formed and
what each party learns (docs/design.md §4). Backends register by name in EXCHANGES.

The built-in backends are registered by where they live and imported on first
lookup (:meth:`~securevfl.registry.Registry.add_path`): a process imports the
backend its protocol names, not CrypTen's helpers or the HE schemes of the others."""

from securevfl.exchange.base import (
    EXCHANGES,
    ActiveExchange,
    ExchangeBackend,
    ExchangeContext,
    HelperExchange,
    PassiveExchange,
)

EXCHANGES.add_path("plain", "securevfl.exchange.plain:Plain")
EXCHANGES.add_path("mpc", "securevfl.exchange.mpc:Mpc")
EXCHANGES.add_path("ckks", "securevfl.exchange.ckks:Ckks")
EXCHANGES.add_path("paillier", "securevfl.exchange.paillier.backend:PaillierBackend")

__all__ = [
    "EXCHANGES",
    "ActiveExchange",
    "ExchangeBackend",
    "ExchangeContext",
    "HelperExchange",
    "PassiveExchange",
]
