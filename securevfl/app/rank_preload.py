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
signal; its parent is the launcher), when the launcher started it from its main
thread (:func:`securevfl.app.rank_server.ensure_server`). Left alone it would run
until its alive pipe closes and then tear down an interpreter with torch loaded:
it outlived a SIGKILLed launcher by 6-7 s with a run's ranks, and by more than
30 s without, at load 20 on the 2-core test box.
"""

from __future__ import annotations

import os
import signal

from securevfl.runtime.lifeline import parent_death_signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
# the launcher's pid, when it started this server from its main thread
# (securevfl.app.rank_server.SERVER_LIFELINE_ENV; the name is repeated: this module imports
# nothing of the launcher's, and runs before the server's other imports)
_launcher = os.environ.pop("SECUREVFL_SERVER_ENDS_WITH", "")
if _launcher.isdigit() and parent_death_signal(signal.SIGKILL) and os.getppid() != int(_launcher):
    os.kill(os.getpid(), signal.SIGKILL)  # the launcher ended before the request was in place
