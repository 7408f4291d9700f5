"""Exchange backends: how the interactive layer z = sum_i h'_i W_i is formed and
what each party learns (DESIGN §4). Backends register by name in EXCHANGES."""

from securevfl.exchange import ckks, mpc, paillier, plain  # noqa: F401  (register the backends)
from securevfl.exchange.base import (
    EXCHANGES,
    ActiveExchange,
    ExchangeBackend,
    ExchangeContext,
    HelperExchange,
    PassiveExchange,
)

__all__ = [
    "EXCHANGES",
    "ActiveExchange",
    "ExchangeBackend",
    "ExchangeContext",
    "HelperExchange",
    "PassiveExchange",
]
