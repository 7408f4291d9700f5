"""Checks of ``securevfl party``'s own arguments, before its rank starts: the
rendezvous address and the key file. A mistake there is a one-paragraph error
naming the flag (exit 2), not a traceback or a minute of waiting for peers."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from urllib.parse import urlparse

from securevfl.errors import ConfigError

_PUBLIC_KEY_LINE = re.compile(r"ed25519:[0-9a-f]{64}(\s|$)")


def check_rendezvous(addr: str) -> tuple[str, int]:
    """``tcp://HOST:PORT`` -> (host, port). Refuses another scheme, a missing host,
    a port outside 1-65535 and an unspecified address (``0.0.0.0``, ``::``):
    rank 0 listens only on the address given (README, "Across hosts"), which must
    be one of its own that the other hosts can reach, never every interface."""
    shape = f"the address must look like tcp://HOST:PORT (got {addr!r})"
    bad_port = f"{shape}: the port is a number from 1 to 65535"
    u = urlparse(addr)
    try:
        port = u.port
    except ValueError:
        raise ConfigError(bad_port, path="--rendezvous") from None
    if u.scheme != "tcp" or not u.hostname or port is None:
        raise ConfigError(shape, path="--rendezvous")
    if port == 0:
        raise ConfigError(bad_port, path="--rendezvous")
    try:
        unspecified = ipaddress.ip_address(u.hostname).is_unspecified
    except ValueError:  # a host name
        unspecified = False
    if unspecified:
        raise ConfigError(
            f"{u.hostname} is not an address rank 0 can be reached at (it stands for every interface, and "
            "rank 0 listens only on the address given): give an address or name of rank 0's host that "
            "the other hosts can reach, e.g. tcp://10.0.0.5:" + str(port),
            path="--rendezvous",
        )
    return u.hostname, port


def check_key_file(path: Path) -> None:
    """Refuse a public key file (``PARTY.pub``) given as ``--key``: it holds no
    secret, and the secret key file check would ask for a ``chmod`` of it."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(200)
    except OSError:
        return  # Identity.load reports why it cannot be read
    if _PUBLIC_KEY_LINE.match(head.decode("ascii", errors="replace")):
        secret = path.with_suffix(".key") if path.suffix == ".pub" else None
        hint = f" ({secret.name} beside it, if securevfl keygen wrote both)" if secret else ""
        raise ConfigError(
            f"{path} is a public key file: it is pinned in the protocol file, and --key takes this "
            f"party's secret key file{hint}",
            path="--key",
        )
