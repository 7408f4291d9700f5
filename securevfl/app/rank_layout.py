"""A protocol's rank layout, with the helper ranks its exchange backend asks for.

:class:`~securevfl.runtime.layout.Layout` is wire-level and takes the helper names
as an argument; this is the one place that looks them up in the exchange registry.
"""

from __future__ import annotations

from securevfl.config import Protocol
from securevfl.exchange import EXCHANGES
from securevfl.runtime.layout import Layout


def layout_of(proto: Protocol) -> Layout:
    """Rank 0 the active party, then the passive parties, then the backend's helpers."""
    backend = EXCHANGES.get(proto.exchange.backend, path="exchange.backend")
    return Layout.from_protocol(proto, backend.helper_names(proto))
