"""One computation on a background thread, joined once for its result.

Why a thread helps although SEAL's Python bindings hold the GIL for every call
(TenSEAL's ``sealapi`` bindings have no GIL release, so two threads never run
SEAL at the same time): the protocol's party spends much of a step blocked in
a transport call (a ``torch.distributed`` send or receive, which releases the
GIL while it waits), and a worker started just before such a call computes
meanwhile. Threat model: none (local computation on values this party already
holds; nothing is sent from the worker).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Worker:
    """Runs ``fn(*args)`` on a daemon thread; :meth:`result` waits for it and
    returns its value or re-raises what it raised."""

    def __init__(self, fn: Callable[..., Any], *args: Any, name: str = "ckks-worker"):
        self._out: Any = None
        self._err: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            self._out = fn(*args)
        except BaseException as exc:  # handed to whoever joins
            self._err = exc

    def result(self) -> Any:
        self._thread.join()
        if self._err is not None:
            raise self._err
        return self._out
