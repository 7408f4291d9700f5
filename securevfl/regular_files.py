"""Files securevfl reads whole: regular files only.

A party's CSV file, a ``--data`` file of new records, a key file: each is read to
its end. A path that leads (through a link or not) to anything but a regular file
would read without bound (``/dev/zero``, ``/dev/urandom``) or block until a
timeout (a named pipe nobody writes), so such a path is refused before a byte is
read. :func:`what_is` says what a path is for a check at load; :func:`open_regular`
opens a file for reading without blocking and checks the open descriptor, so a
file swapped for a pipe between the check and the read is refused too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def kind_of_mode(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) is, as an error message says it:
    ``a named pipe (FIFO)``, ``a character device``, ..."""
    return next((name for test, name in KINDS if test(mode)), "not a regular file")


def what_is(path: Path | str) -> str | None:
    """What ``path`` leads to when it exists and is not a regular file (links
    followed); None for a regular file, and for a path that does not exist (its
    reader says so)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return None if stat.S_ISREG(mode) else kind_of_mode(mode)


class NotRegularFile(OSError):
    """A path that leads to anything but a regular file; ``kind`` says what."""

    def __init__(self, path: Path | str, kind: str):
        super().__init__(f"{path} is {kind}, not a file")
        self.filename = str(path)
        self.kind = kind


def open_regular(path: Path | str) -> int:
    """A descriptor of ``path`` open for reading, or :class:`NotRegularFile` when it
    is anything but a regular file (checked on the open descriptor; the open does
    not block on a named pipe, and nothing is read). Other failures raise the
    ``OSError`` of ``os.open`` (a socket cannot be opened: it is named too)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        kind = what_is(path)
        if kind is not None:
            raise NotRegularFile(path, kind) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(path, kind_of_mode(mode))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd
