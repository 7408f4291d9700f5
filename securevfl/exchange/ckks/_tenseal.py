"""TenSEAL is an optional dependency (the ``crypto`` extra): it is imported on
first use, so that loading securevfl (and refusing a ckks protocol without it,
see :func:`securevfl.exchange.ckks.params.check`) works without it."""

from __future__ import annotations

import importlib
from typing import Any


class _Lazy:
    """A module imported on first attribute access."""

    def __init__(self, name: str):
        self._name = name
        self._mod: Any = None

    def __getattr__(self, attr: str) -> Any:
        if self._mod is None:
            self._mod = importlib.import_module(self._name)
        return getattr(self._mod, attr)


ts: Any = _Lazy("tenseal")
sa: Any = _Lazy("tenseal.sealapi")
