"""Exchange backends: how the interactive layer z = sum_i h'_i W_i is formed and
what each party learns (DESIGN §4). Backends register by name in EXCHANGES."""

from securevfl.exchange import plain  # noqa: F401  (registers "plain")
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
