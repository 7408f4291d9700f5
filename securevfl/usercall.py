"""Where a rank is in user code: the marker its watchdog reads.

A rank runs code its owner wrote (a model factory, a defense's hooks) in its main
thread. Code that blocks there (a sleep, a lock never released, a network call
that never answers) leaves the rank's heartbeat beating: its peers see a live
rank and wait in their receives for ``runtime.op_timeout_s``, then report a
transport timeout from a rank that is alive. So each call into user code is made
within :func:`user_call`, which records what is called (``"bottom model of party
'p': factory 'mylab:build'"``, ``"defense 'x' of party 'p', hook 'embed'"``) and
since when; the rank's watchdog (:mod:`securevfl.runtime.watchdog`) reads
:func:`current` and ends the run, naming the rank and the call, once one call has
lasted ``runtime.user_code_timeout_s``.

The marker is one tuple, replaced (never mutated) on entry and exit, so the
watchdog thread reads a consistent value without a lock. Calls nest: leaving one
puts back the marker of the call around it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

#: (what is being called, time.monotonic() at entry), or None outside user code
_where: tuple[str, float] | None = None


@contextmanager
def user_call(what: str) -> Iterator[None]:
    """Mark the calls made in this block as the user code ``what``."""
    global _where
    outer = _where
    _where = (what, time.monotonic())
    try:
        yield
    finally:
        _where = outer


def is_user_code(obj: object) -> bool:
    """Whether ``obj`` (a function, a class, or an instance of one) comes from code
    outside securevfl: a plugin's or a factory's module."""
    module = getattr(obj, "__module__", None) or ""
    return not (module == "securevfl" or module.startswith("securevfl."))


def current() -> tuple[str, float] | None:
    """The user code call the rank is in, and since when (``time.monotonic()``);
    None when it is in securevfl's own code."""
    return _where


def stuck_for(bound_s: float, now: float | None = None) -> tuple[str, float] | None:
    """The user code call the rank has been in for at least ``bound_s`` seconds,
    and for how long; None otherwise."""
    where = _where
    if where is None:
        return None
    waited = (time.monotonic() if now is None else now) - where[1]
    return (where[0], waited) if waited >= bound_s else None
