"""Child interpreters that start with a safe import path.

A Python started as ``python -c ...`` or ``python -m ...`` puts the working
directory first on ``sys.path``. Every process securevfl spawns is such a
child: a rank (``spawn``, and the fork server the ranks fork from), a PSI
blinding worker that holds its party's PSI scalar (:mod:`securevfl.data.dh_psi`),
the mpc floor's ping processes. ``multiprocessing`` starts each as
``python -c "from multiprocessing... import ..."``, so a ``multiprocessing/``
folder (or any module the child imports) planted in the directory a party
starts from would run inside it, with the party's keys (SECURITY.md §4b).

:func:`safe_children` sets ``PYTHONSAFEPATH=1`` (Python 3.11's ``-P``) in
this process's environment for the block in which securevfl starts its children
(and puts the value back after it: a program that calls :mod:`securevfl.api`
keeps its own environment for what it starts itself); :func:`safe_env` adds it to
an environment handed to a rank, so what a rank starts is safe too. A child
interpreter started meanwhile begins without the working directory on its path.
The child's path is replaced by its parent's once it runs, so the parent must not
have the working directory there either: the ``securevfl`` console script does
not, and ``python -m securevfl`` drops it (:func:`drop_working_directory`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

SAFE_PATH_ENV = "PYTHONSAFEPATH"


@contextlib.contextmanager
def safe_children() -> Iterator[None]:
    """Within the block, every Python this process starts begins without the
    working directory on its import path (``PYTHONSAFEPATH=1``); the variable's
    value before the block is put back after it."""
    before = os.environ.get(SAFE_PATH_ENV)
    os.environ[SAFE_PATH_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SAFE_PATH_ENV, None)
        else:
            os.environ[SAFE_PATH_ENV] = before


def safe_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with ``PYTHONSAFEPATH=1``: the environment a rank runs in, so that
    what it starts (PSI workers) is safe as well."""
    return {**env, SAFE_PATH_ENV: "1"}


def drop_working_directory(path: list[str], cwd: str) -> list[str]:
    """``path`` without the working directory ``python -m`` put first (``''`` or
    ``cwd``), and with it only at the end when ``securevfl`` itself lies there (a
    source checkout run in place: its ranks must still import it, and nothing
    there then shadows the standard library or an installed module)."""
    if not path or path[0] not in ("", cwd):
        return list(path)
    rest = list(path[1:])
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds securevfl/
    return [*rest, cwd] if os.path.abspath(here) == os.path.abspath(cwd) else rest


def safe_command_line() -> None:
    """Called first by ``python -m securevfl``: drop the working directory from
    this process's path, and have its children start without it."""
    if not sys.flags.safe_path:
        sys.path[:] = drop_working_directory(sys.path, os.getcwd())
    os.environ[SAFE_PATH_ENV] = "1"  # the command's own process: everything it starts
