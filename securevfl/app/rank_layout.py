"""A protocol's rank layout, with the helper ranks its exchange backend asks for.

:class:`~securevfl.runtime.layout.Layout` is wire-level and takes the helper names
as an argument; this is the one place that asks the protocol's resolved exchange
backend for them, with its validated options.
"""

from __future__ import annotations

from securevfl.components import CheckedProtocol
from securevfl.runtime.layout import Layout


def layout_of(checked: CheckedProtocol) -> Layout:
    """Rank 0 the active party, then the passive parties, then the backend's helpers."""
    exchange = checked.components.exchange
    return Layout.from_protocol(checked.protocol, exchange.cls.helper_names(exchange.options))
