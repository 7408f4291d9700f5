"""Checks of ``securevfl party``'s own arguments, before its rank starts: the
rendezvous address (:func:`securevfl.runtime.address.check_rendezvous`) and the
key file. A mistake there is a one-paragraph error naming the flag (exit 2), not
a traceback or a minute of waiting for peers."""

from __future__ import annotations

import re
from pathlib import Path

from securevfl.errors import ConfigError
from securevfl.runtime.address import check_rendezvous
from securevfl.runtime.secure.keys import read_key_file

__all__ = ["check_key_file", "check_rendezvous"]

_PUBLIC_KEY_LINE = re.compile(r"ed25519:[0-9a-f]{64}(\s|$)")


def check_key_file(path: Path) -> None:
    """Refuse a public key file (``PARTY.pub``) given as ``--key``: it holds no
    secret, and the secret key file check would ask for a ``chmod`` of it. Like
    every key file it is read as a regular file of key size
    (:func:`~securevfl.runtime.secure.keys.read_key_file`): a device, a pipe or a
    folder is refused here, naming ``--key``."""
    head = read_key_file(path)[0][:200]
    if _PUBLIC_KEY_LINE.match(head.decode("ascii", errors="replace")):
        secret = path.with_suffix(".key") if path.suffix == ".pub" else None
        hint = f" ({secret.name} beside it, if securevfl keygen wrote both)" if secret else ""
        raise ConfigError(
            f"{path} is a public key file: it is pinned in the protocol file, and --key takes this "
            f"party's secret key file{hint}",
            path="--key",
        )
