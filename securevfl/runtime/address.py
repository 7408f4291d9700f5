"""The rendezvous address ``tcp://HOST:PORT``, checked before anything connects or
listens: a malformed one is a one-paragraph error naming ``--rendezvous``, not a
``ValueError`` from :mod:`urllib.parse` (a port above 65535), and an unspecified
address (``0.0.0.0``, ``::``), which would make rank 0 listen on every interface,
is refused: rank 0 listens only on the address given (README, "Across hosts")."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlparse

from securevfl.errors import ConfigError


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
