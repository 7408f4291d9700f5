"""How local ranks start: the multiprocessing context, and the fork server that
forks them (:func:`rank_context`).

A command that starts ranks (``run``, ``predict``, ``compare``) starts the fork
server as it begins (:func:`start_rank_server`), before it imports the launcher
itself: the server's imports (torch, the rank's pipeline) and the command's own
(the launcher, the data materialization, the reports) then run side by side
instead of one after the other, and the first rank forks from a server that
is ready sooner. This module imports nothing heavy, so the command line can
start the server before anything else.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.context
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import signal
import tempfile
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from securevfl.errors import ConfigError
from securevfl.runtime.safepath import safe_children

START_METHOD_ENV = "SECUREVFL_START_METHOD"
START_METHODS = ("forkserver", "spawn")
# what the fork server imports once, before it forks any rank: the ranks' entry points,
# and the command line, which a rank started from the `securevfl` console script re-imports
# with that script as its main module (3.4 of 18.6 CPU s of a 2-step plain `securevfl run`)
RANK_MODULES = [
    "securevfl.app.rank_preload",  # first: the server and its ranks ignore SIGINT until a rank's entry point
    "securevfl.app.launcher",
    "securevfl.app.predict",
    "securevfl.cli",
]


def rank_context() -> Any:
    """The multiprocessing context ranks start in, from ``SECUREVFL_START_METHOD``.

    ``forkserver`` (the default where the OS has it): a server process, started once
    per launching process and kept for its later runs, imports :data:`RANK_MODULES`
    and forks every rank from itself. A rank then starts in milliseconds instead of
    importing torch, scikit-learn and securevfl again (about 5 CPU s a rank on the
    2026-11-26 test box; a local run's start-up was mostly that). The server is a
    fresh interpreter that has only imported modules (no threads, no process group,
    no CUDA), which is what makes forking it safe; it is the default start method of
    Python 3.14 on Linux. A rank imports, after it is forked, what only its role and
    its protocol need (the exchange backend's roles, its defenses: registered by
    path). ``spawn``: every rank a fresh interpreter, for tools that inject code at
    interpreter start-up (a ``sitecustomize`` probe, a re-imported benchmark
    script), and the only method on Windows. Each rank gets the launcher's
    environment as it is at launch either way
    (:func:`securevfl.app.launcher._rank_main`). Either way the child interpreter
    (a spawned rank, the fork server) starts without the working directory on
    its import path: the launcher starts them within
    :func:`~securevfl.runtime.safepath.safe_children`."""
    available = mp.get_all_start_methods()
    method = os.environ.get(START_METHOD_ENV) or ("forkserver" if "forkserver" in available else "spawn")
    if method not in START_METHODS or method not in available:
        raise ConfigError(
            f"{START_METHOD_ENV}={method!r}: ranks start with one of "
            f"{[m for m in START_METHODS if m in available]}"
        )
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(RANK_MODULES)  # read when the server starts; later calls change nothing
    return ctx


#: the pid of the process a fork server ends with (its parent), for securevfl.app.rank_preload
SERVER_LIFELINE_ENV = "SECUREVFL_SERVER_ENDS_WITH"


@contextlib.contextmanager
def _ends_with_this_process() -> Iterator[None]:
    """Within the block, a fork server started ends with this process
    (:mod:`securevfl.app.rank_preload`: Linux's parent-death signal), when it is
    started from the main thread: the signal comes when the *thread* that started
    the server ends, and a server started from another thread (``api.run`` in a
    worker thread) must outlive it, for the ranks of that process's other launches."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    os.environ[SERVER_LIFELINE_ENV] = str(os.getpid())
    try:
        yield
    finally:
        os.environ.pop(SERVER_LIFELINE_ENV, None)


def ensure_server() -> None:
    """Start this process's fork server unless it runs, with SIGINT blocked while it
    starts: the server's interpreter inherits the blocked signal, so a Ctrl-C while
    it starts up cannot interrupt it (with a traceback on the terminal) before
    :mod:`securevfl.app.rank_preload` ignores SIGINT and unblocks it. A Ctrl-C that
    reaches this process meanwhile waits until the server is started, and is raised
    then."""
    with safe_children(), _ends_with_this_process():
        # multiprocessing's resource tracker, which the server needs, is started first: its
        # start-up unblocks SIGINT in this thread (rather than restoring the mask it found)
        multiprocessing.resource_tracker.ensure_running()
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            multiprocessing.forkserver.ensure_running()
        except OSError as exc:
            if "AF_UNIX path too long" not in str(exc):
                raise
            raise ConfigError(
                f"the ranks' fork server listens on a socket in the temporary folder "
                f"{tempfile.gettempdir()}, whose path is too long for a Unix socket (at most 107 bytes "
                "in all): set TMPDIR to a shorter folder, or SECUREVFL_START_METHOD=spawn",
                path="TMPDIR",
            ) from None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def start_processes(procs: Iterable[Any]) -> None:
    """Start rank processes of :func:`rank_context` (the fork server first, when it
    is not running yet: :func:`ensure_server`), each without the working directory
    on its import path (:func:`~securevfl.runtime.safepath.safe_children`)."""
    procs = list(procs)
    if any(isinstance(p, multiprocessing.context.ForkServerProcess) for p in procs):
        ensure_server()
    with safe_children():
        for p in procs:
            p.start()


def start_rank_server() -> None:
    """Start the fork server now, without waiting for its imports (it takes requests
    once they are done); nothing under ``spawn``. A later :func:`rank_context`
    gets the same server."""
    if rank_context().get_start_method() == "forkserver":
        ensure_server()


def stop_rank_server() -> None:
    """End this process's fork server now, with SIGKILL, once the command's ranks
    have ended: at the end of every launching command (:func:`securevfl.cli.entry`),
    and once a stopped command has stopped its ranks (Ctrl-C, SIGTERM:
    :func:`securevfl.cli.main`).

    Left alone, the server ends only after the command itself has ended (it runs
    until every holder of its "alive" pipe has closed it), and then tears down a
    whole interpreter with torch, scikit-learn and securevfl loaded: about 1 CPU s
    on the 2026-11-28 test box, run after the command's own exit, not beside it, and
    stretched by whatever else the machine runs. Until it is gone the command's
    stderr stays open (the server holds it), so whoever waits for the command's
    output waits for that teardown too. The server holds nothing worth a clean
    exit: it only imported modules and forked. Nothing under ``spawn``, or where no
    server was started."""
    server = multiprocessing.forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    stop = getattr(server, "_stop", None)  # closes the "alive" pipe and reaps the (dead) server
    if stop is not None:
        with contextlib.suppress(OSError):
            stop()
