"""The rendezvous: rank 0's key-value store at the address given in
``--rendezvous``, and how the other ranks reach it.

Rank 0 hosts a TCP store listening on that address only (loopback for local
runs) and first publishes the run's nonce: a fresh 128-bit value that every
claim and hello of this run is signed over. The other ranks probe the address
with a plain socket until something listens, then connect a store client, all
before the start-up deadline (``runtime.startup_timeout_s``); a store that
fails meanwhile is rank 0 lost.
"""

from __future__ import annotations

import errno
import secrets
import socket
import time
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from securevfl import __version__
from securevfl.errors import ConfigError, PartyFailure, ProtocolError

PROBE_S = 1.0  # one TCP probe of the rendezvous address waits at most this long
RETRY_S = 0.05  # pause between probes while rank 0 is not (yet) listening (a refused probe is cheap)
LISTEN_BACKLOG = 128
NONCE_KEY = "run/nonce"  # rank 0's fresh run nonce (hex), the first value in its store
NONCE_BYTES = 16


def is_loopback(host: str) -> bool:
    try:
        return socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


def native_message(exc: BaseException) -> str:
    """The first meaningful line of an exception's text.

    torch's C++ errors may carry a native stack trace after the message
    (``Exception raised from ...`` and ``frame #N: ...`` lines); users get the
    message alone (``--debug`` shows torch's own logs, traces included)."""
    for raw in str(exc).splitlines():
        line = raw.strip()
        if line.startswith("Exception raised from"):
            break
        if line and not line.startswith(("frame #", "<omitting python frames>")):
            return line
    return type(exc).__name__


def listen_socket(host: str, port: int) -> socket.socket:
    """Rank 0's listening socket for the rendezvous store, bound to the address
    given in ``--rendezvous`` (not to every interface): ``127.0.0.1`` keeps the
    store on loopback, a host name binds the address it resolves to (IPv4 first,
    as the other ranks and gloo resolve it)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        raise ConfigError(
            f"cannot resolve the rendezvous host {host!r}: {exc.strerror or exc}", path="--rendezvous"
        ) from None
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch does: rebinding after a run
        sock.bind(addr)
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        hints = {
            errno.EADDRINUSE: "another process already listens there (is a rank 0 already running?)",
            errno.EADDRNOTAVAIL: f"{addr[0]} is not an address of this machine: "
            "start rank 0 on the host named in --rendezvous",
            errno.EACCES: "this user may not listen on that port",
        }
        hint = hints.get(exc.errno or 0)
        raise ConfigError(
            f"cannot listen on {host}:{port} ({addr[0]}) for the rendezvous: {exc.strerror or exc}"
            + (f"; {hint}" if hint else ""),
            path="--rendezvous",
        ) from None
    return sock


def probe(host: str, port: int, timeout: float) -> str | None:
    """None when something accepts TCP connections at host:port, else why not.

    A plain socket, not a store client: torch's client retries on its own, may
    take twice its timeout, and logs a native stack trace for every failure."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__


@dataclass(frozen=True)
class Rendezvous:
    """Rank 0's store at ``host:port``; ``timeout_s`` is ``runtime.startup_timeout_s``
    and ``hosted_by`` names rank 0 in messages."""

    host: str
    port: int
    timeout_s: float
    hosted_by: str

    def lost(self, exc: BaseException | str) -> PartyFailure:
        """The store failed during start-up: rank 0 is lost."""
        why = exc if isinstance(exc, str) else native_message(exc)
        return PartyFailure(f"lost the rendezvous host {self.hosted_by} during start-up: {why}", rank=0)

    def host_store(self, world_size: int) -> dist.TCPStore:
        """Rank 0: listen on the given address and host the store there."""
        fd = listen_socket(self.host, self.port).detach()  # the store owns and closes it
        try:
            return dist.TCPStore(
                self.host,
                self.port,
                world_size,
                is_master=True,
                timeout=timedelta(seconds=self.timeout_s),
                wait_for_workers=False,
                master_listen_fd=fd,
            )
        except RuntimeError as exc:
            raise ConfigError(
                f"cannot host the rendezvous on {self.host}:{self.port}: {native_message(exc)}",
                path="--rendezvous",
            ) from exc

    def client(self, left: float) -> dist.TCPStore | str:
        """A store client connected within ``left`` seconds, or why it could not be made."""
        refused = probe(self.host, self.port, min(left, PROBE_S))
        if refused is not None:
            return refused
        try:
            store = dist.TCPStore(
                self.host,
                self.port,
                None,
                is_master=False,
                timeout=timedelta(seconds=max(left, 1.0)),
                wait_for_workers=False,
            )
        except RuntimeError as exc:  # torch's DistError family
            return native_message(exc)
        store.set_timeout(timedelta(seconds=self.timeout_s))  # later store ops
        return store

    def connect(self, deadline: float) -> dist.TCPStore:
        """Probe the address until rank 0 listens (or the deadline passes), then connect."""
        reason = "no attempt"
        while (left := deadline - time.monotonic()) > 0:
            got = self.client(left)
            if not isinstance(got, str):
                return got
            reason = got
            time.sleep(max(min(RETRY_S, deadline - time.monotonic()), 0.0))
        raise PartyFailure(
            f"could not reach the rendezvous at {self.host}:{self.port} hosted by {self.hosted_by} "
            f"within {self.timeout_s:g} s (runtime.startup_timeout_s; last attempt: {reason}): start rank 0 "
            "first, and check the address, the port and any firewall in between",
            rank=0,
        )

    def publish_nonce(self, store: dist.TCPStore) -> bytes:
        """Rank 0: draw the run's nonce and publish it before anything else."""
        nonce = secrets.token_bytes(NONCE_BYTES)
        try:
            store.set(NONCE_KEY, nonce.hex())
        except RuntimeError as exc:
            raise self.lost(exc) from exc
        return nonce

    def read_nonce(self, store: dist.TCPStore, deadline: float) -> bytes:
        """The run's nonce, once rank 0 has published it (or the deadline passes)."""
        try:
            while not store.check([NONCE_KEY]):
                if time.monotonic() > deadline:
                    raise PartyFailure(
                        f"start-up timed out after {self.timeout_s:g} s: the rendezvous at "
                        f"{self.host}:{self.port} never published its run nonce (is {self.hosted_by} "
                        f"running securevfl {__version__}?)",
                        rank=0,
                    )
                time.sleep(0.02)
            raw = store.get(NONCE_KEY)
        except RuntimeError as exc:
            raise self.lost(exc) from exc
        try:
            nonce = bytes.fromhex(raw.decode())
        except ValueError:
            nonce = b""
        if len(nonce) != NONCE_BYTES:
            raise ProtocolError(f"the run nonce in the rendezvous store of {self.hosted_by} is malformed")
        return nonce
