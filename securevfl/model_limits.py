"""The stated limits on what one party trains (README, "Runs and output folders"), in one
place for the two places that count: :mod:`securevfl.sizing` at load, from the
shapes of the built-in models (no model built, torch not imported), and
:mod:`securevfl.models` in the owner's rank, for a model user code built (a
factory, a plugin's registered kind), which only that rank may run and count.

A party beyond :data:`MAX_PARAMETERS` parameters, or whose training state
(:data:`BYTES_PER_PARAMETER` a parameter) exceeds this machine's physical memory,
is refused."""

from __future__ import annotations

import os

MAX_PARAMETERS = 1 << 31
"""The most parameters one party trains (2,147,483,648: 8 GiB of float32
weights, about 32 GiB to train): the stated limit, on any machine."""
BYTES_PER_PARAMETER = 16
"""About what training one parameter takes: the weight, its gradient and two
moments of Adam, float32."""


def physical_memory() -> int | None:
    """This machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def gib(n: int) -> str:
    return f"{n / (1 << 30):,.1f} GiB"


def over_limit(parameters: int, memory: int | None) -> str | None:
    """Which limit ``parameters`` trained parameters exceed, in words (``memory``:
    the machine's, in bytes; None: unknown, not checked); None within both."""
    if parameters > MAX_PARAMETERS:
        return f"a party trains at most {MAX_PARAMETERS:,} parameters"
    if memory is not None and parameters * BYTES_PER_PARAMETER > memory:
        return f"this machine has {gib(memory)} of memory"
    return None
