"""Imported by the ranks' fork server only, first of its preloaded modules
(:data:`securevfl.app.rank_server.RANK_MODULES`): from here on the server ignores
SIGINT, and so does every rank it forks until the rank's entry point takes SIGINT
back (:func:`securevfl.app.launcher._rank_main`); and the server ends with the
process that started it.

Ctrl-C reaches every process of the terminal's group. A rank forked a moment
before would otherwise get its KeyboardInterrupt inside multiprocessing's own
start-up code (its after-fork hooks), before the rank's entry point can turn it
into a quiet stop, and print a traceback (measured: 2 of 10 Ctrl-C stops at load 37-50 on
the 2-core test box). A rank that ignores a Ctrl-C in that window is stopped by
the launcher, which got the same Ctrl-C (:func:`~securevfl.app.launcher.stop_ranks`).
The server itself ignores SIGINT in its loop anyway (multiprocessing.forkserver);
this also covers its imports. It starts with SIGINT blocked
(:func:`securevfl.app.rank_server.ensure_server`), so that a Ctrl-C while its
interpreter starts, before this module runs, cannot print a traceback either; it
is unblocked here, once ignored (a pending one is then dropped).

The server ends when its launcher does, SIGKILL included (Linux's parent-death
signal; its parent is the launcher): left alone it would run until every rank
it forked has ended and then tear down an interpreter with torch loaded, seconds
after a killed launcher (25 s at load 17 on the 2-core test box).
"""

from __future__ import annotations

import os
import signal

from securevfl.runtime.lifeline import parent_death_signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
_launcher = os.getppid()
if parent_death_signal(signal.SIGKILL) and os.getppid() != _launcher:
    os.kill(os.getpid(), signal.SIGKILL)  # the launcher ended before the request was in place
