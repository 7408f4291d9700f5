"""Imported by the ranks' fork server only, first of its preloaded modules
(:data:`securevfl.app.rank_server.RANK_MODULES`): from here on the server ignores
SIGINT, and so does every rank it forks until the rank's entry point takes SIGINT
back (:func:`securevfl.app.launcher._rank_main`).

Ctrl-C reaches every process of the terminal's group. A rank forked a moment
before would otherwise get its KeyboardInterrupt inside multiprocessing's own
start-up code (its after-fork hooks), before the rank's entry point can turn it
into a quiet stop, and print a traceback (measured: 2 of 10 Ctrl-C stops at load 37-50 on
the 2-core test box). A rank that ignores a Ctrl-C in that window is stopped by
the launcher, which got the same Ctrl-C (:func:`~securevfl.app.launcher.stop_ranks`).
The server itself ignores SIGINT in its loop anyway (multiprocessing.forkserver);
this also covers its imports.
"""

from __future__ import annotations

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
