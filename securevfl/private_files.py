"""Files and folders only their owner may read: a party's secrets at rest.

Every file that holds a weight share, a key, a noise key, a model or what a party
learned of its own data (a rank's ``ranks/`` files, its checkpoints and saved
model, the attack harness's reconstructions, a ``securevfl keygen`` secret key, the
comparison cache's key) is written through this module: mode 0600 inside folders of
mode 0700 (SECURITY.md §5, "Checkpoints and saved models"; §7, "Outputs at rest").

Restrictive from the start, not tightened after writing: a file is created by
``os.open(..., 0o600)`` and a folder by ``mkdir(mode=0o700)``, which a umask can only
narrow, then set to exactly that mode (``fchmod``/``chmod``: a umask that also took
the owner's bits would leave a file its owner cannot read) before a byte is written
into it. A file that already exists keeps its old mode through ``O_CREAT``, so it
too is set to 0600 before it is truncated into or appended to.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


def private_dir(path: Path, *, tighten: bool = True) -> Path:
    """``path`` as a folder its owner alone may enter: each folder of it that does
    not exist yet (parents included) is created mode 0700. ``tighten``: an existing
    ``path`` is set to 0700 too (a folder securevfl owns, such as ``OUT/ranks`` left
    by an earlier run); without it an existing folder is left as the user made it
    (``securevfl keygen --out`` into the user's own folder)."""
    path = Path(path)
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=PRIVATE_DIR)
        except FileExistsError:  # another process (a sibling rank) made it first
            continue
        os.chmod(d, PRIVATE_DIR)  # exactly 0700, whatever the umask
    if tighten:
        os.chmod(path, PRIVATE_DIR)
    return path


def open_private(path: Path, *, append: bool = False, exclusive: bool = False) -> BinaryIO:
    """``path`` opened for binary writing, mode 0600 whatever the umask.
    ``append``: at its end, else truncated. ``exclusive``: refuse an existing file
    (FileExistsError)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
    if exclusive:
        flags |= os.O_EXCL
    fd = os.open(path, flags, PRIVATE_FILE)
    try:
        os.fchmod(fd, PRIVATE_FILE)  # an existing file keeps its mode through O_CREAT
        return os.fdopen(fd, "ab" if append else "wb")
    except BaseException:
        os.close(fd)
        raise


def write_private(path: Path, data: bytes | str, *, exclusive: bool = False) -> Path:
    """Write ``data`` (a str as UTF-8) to ``path``, mode 0600 (:func:`open_private`)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with open_private(path, exclusive=exclusive) as fh:
        fh.write(raw)
    return Path(path)
