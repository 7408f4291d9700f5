"""Child processes that end with the process that started them.

A rank, or a rank's PSI blinding worker, that outlives the process that started
it keeps computing, holding memory and writing into an output folder nobody
will commit (a launcher killed with SIGKILL cannot stop anything).
:func:`die_with`, called first thing in the child, prevents that:

* a child of ``origin`` itself (a spawned rank, a blinding worker) asks Linux
  for a parent-death signal (``prctl(2)``, ``PR_SET_PDEATHSIG``): it gets
  ``sig`` the moment its parent ends, SIGKILL included. The kernel sends it
  when the *thread* that created the child ends, so the child must be started
  from a thread that lives as long as the parent needs it (the launcher's, the
  rank's main thread);
* a rank the local launcher starts through a fork server
  (:func:`securevfl.app.rank_server.rank_context`) has the fork server as its
  parent, and the fork server does not end with the launcher: it runs until
  every holder of its "alive" pipe has closed it, and every rank it forks holds
  one. Such a child watches ``origin`` itself from a daemon thread, on a pidfd
  (``pidfd_open(2)``, readable once the process has ended: no polling, no pid
  reuse), or where there is none by polling it twice a second. The polling
  thread is also the fallback for a parent-death signal off Linux.

The request is in place before ``origin`` is checked once more, so a child
whose origin ended while it started ends too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
POLL_S = 0.5


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    if Path("/proc/self/stat").exists():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    try:  # no /proc (macOS): ask the kernel; a zombie counts as running there
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def parent_death_signal(sig: int) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent ends; False where
    that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _watch(origin: int, sig: int) -> None:
    """End this process with ``sig`` once process ``origin`` has ended (a daemon thread)."""
    try:
        fd = os.pidfd_open(origin)
    except ProcessLookupError:
        os.kill(os.getpid(), sig)
        return
    except (AttributeError, OSError):  # no pidfd (not Linux, or before 5.3): poll
        fd = None

    def wait() -> None:
        if fd is not None:
            select.select([fd], [], [])
        else:
            while alive(origin):
                time.sleep(POLL_S)
        os.kill(os.getpid(), sig)

    threading.Thread(target=wait, name="securevfl-lifeline", daemon=True).start()


def die_with(origin: int, sig: int = signal.SIGKILL) -> None:
    """End this process with ``sig`` when process ``origin`` ends: the process
    that started it, directly (its parent) or through a fork server (see the
    module docstring)."""
    if origin != os.getppid() or not parent_death_signal(sig):
        _watch(origin, sig)
    if not alive(origin):
        os.kill(os.getpid(), sig)  # it ended before the request was in place


# -- the rank's own descendants ------------------------------------------------------------
#
# User code a rank runs (a model factory, a plugin) may start processes of its own. A
# rank started by the local launcher adopts every process started under it
# (:func:`adopt_descendants`: Linux's child subreaper, so that one whose parent ended is
# re-parented to the rank rather than to init), and ends them all as it ends
# (:func:`end_descendants`), however its run ended: finished, failed, or stopped by its
# watchdog. A rank killed by a signal (SIGKILL) cannot: what it started is then orphaned.

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
DESCENDANT_GRACE_S = 1.0  # a descendant's time to end on SIGTERM before SIGKILL

_adopting = False


def adopt_descendants() -> bool:
    """Make this process the reaper of every process started under it (Linux; False
    elsewhere) and have :func:`end_descendants` end them."""
    global _adopting
    _adopting = True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def descendants(pid: int) -> list[int]:
    """The processes under ``pid`` (children, their children, ...), from ``/proc``;
    none where there is no ``/proc``."""
    parents: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":  # a zombie has ended already
            parents.setdefault(int(fields[1]), []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        out.extend(children)
        todo.extend(children)
    return out


def end_descendants(grace_s: float = DESCENDANT_GRACE_S) -> list[int]:
    """End the processes started under this one (after :func:`adopt_descendants`;
    nothing otherwise): SIGTERM, then SIGKILL for those alive ``grace_s`` later.
    Returns their pids."""
    if not _adopting:
        return []
    pids = descendants(os.getpid())
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return pids
