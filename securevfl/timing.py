"""Wall time per phase of a rank's run, and the process's peak memory.

A rank's run has phases a user waits through: start-up (rendezvous and
handshake), data (reading its own file), alignment (PSI), setup (models, keys,
collective defense steps), training, evaluation and write-out; the launcher adds
the attacks. Each rank reports its own phases in its summary and ``result.json``
gathers them per rank, so a slow run shows where its time went.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class PhaseClock:
    """Seconds spent per named phase; a phase entered twice accumulates.

    ``cpu`` holds the CPU seconds of the process (all its threads) and of the
    worker processes it started and reaped (PSI's blinding workers) in the phases
    timed with :meth:`phase`: on a shared machine wall time depends on the load,
    CPU time much less, so a benchmark can compare runs taken under different loads."""

    seconds: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0, c0 = time.perf_counter(), cpu_s()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)
            self.cpu[name] = self.cpu.get(name, 0.0) + cpu_s() - c0

    def rounded(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in self.seconds.items()}

    def rounded_cpu(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in self.cpu.items()}


def cpu_s() -> float:
    """CPU seconds of this process and of its reaped child processes."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def peak_rss_mib() -> float:
    """This process's own peak resident memory so far, in MiB.

    On Linux this is ``VmHWM`` from ``/proc/self/status``: ``ru_maxrss`` is kept
    across ``execve``, so a rank started by the 'spawn' method would report its
    launcher's peak whenever that is larger (every rank of a run then showed the
    same number). Elsewhere ``ru_maxrss`` (KiB on Linux, bytes on macOS)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024
