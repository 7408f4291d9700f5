"""The threads torch uses in every rank: ``SECUREVFL_THREADS`` (default 1).

One thread per rank by default: a run starts one process per party on one
machine, and torch's default (one thread per core in every process) would have
them compete for the same cores. Read and checked by the launcher before any rank
starts, and again by each rank (``securevfl party``)."""

from __future__ import annotations

import os

from securevfl.errors import ConfigError

THREADS_ENV = "SECUREVFL_THREADS"
MAX_THREADS = 1024


def rank_threads() -> int:
    """``SECUREVFL_THREADS`` as a thread count; a ConfigError naming the variable
    for anything but a whole number from 1 to :data:`MAX_THREADS`."""
    raw = os.environ.get(THREADS_ENV, "1")
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_THREADS:
        raise ConfigError(
            f"{THREADS_ENV}={raw!r}: the threads torch uses in each rank, a whole number from 1 to "
            f"{MAX_THREADS} (unset: 1)",
            path=THREADS_ENV,
        )
    return n
