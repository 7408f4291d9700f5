"""A rank's session: rendezvous, start-up checks, liveness watchdog, shutdown.

Rank 0 hosts a TCP key-value store at the rendezvous address, listening on that
address only (loopback for local runs); every rank claims its rank in the store
(a second claim of the same rank is refused), publishes a hello (its rank, party,
pid, protocol digest), checks that world size, roles and protocol digest agree,
and only then joins the gloo process group. Connecting and the handshake share
one deadline, ``runtime.startup_timeout_s``, which holds even when the address
answers TCP but never speaks the store's protocol.
A watchdog thread publishes a heartbeat and watches every peer's: a peer that
dies, stalls (no heartbeat for ``peer_timeout_s``) or reports an error ends this
rank with a :class:`PartyFailure` naming it, even while the main thread is
blocked in a receive. Store values are JSON validated by pydantic, never pickles.

Identities (issue #19, :mod:`securevfl.runtime.secure`): every hello carries the
rank's Ed25519 identity key and an ephemeral X25519 key; once every hello is in,
each rank checks every presented identity against the protocol's pins (or the
throw-away keys the local launcher pins), runs the SIGMA-style authentication
with every peer through the store (:mod:`.secure.handshake`) and derives the
sealed links the channel uses. An authenticator that does not verify stops the
start-up (exit 2, naming the rank) before the process group exists, so nothing of
the run's data is sent.

Everything the store carries is signed with the writer's identity key and bound
to this run: rank 0 publishes a fresh run nonce first; claims and hellos are
signed over it, error notes, heartbeats and ``done`` flags over the session hash
of every hello (:func:`.secure.handshake.session_hash`; an error note written
before every hello is in, over the nonce). A claim or hello counts
only once it verifies with the rank's pinned key (with the key its claim was
signed with, where nothing is pinned), so a process without the key (or one
replaying an earlier run's values) cannot take a rank from its party: the real
rank displaces it, and the other ranks wait for the real one until the start-up
deadline, naming the impostor only if it never comes. A rank whose own key is
not the pinned one stops before it claims anything and learns nothing about the
rank's holder. A value that does not verify is ignored; run summaries travel
sealed on the link to rank 0.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import socket
import sys
import threading
import time
import warnings
from base64 import b64decode, b64encode
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, ValidationError

from securevfl import __version__
from securevfl.config import Protocol
from securevfl.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    PartyFailure,
    ProtocolError,
    SecureVFLError,
    SecurityWarning,
)
from securevfl.runtime.layout import Layout, Role
from securevfl.runtime.secure import handshake as hs
from securevfl.runtime.secure import keys
from securevfl.runtime.secure.keys import Identity
from securevfl.runtime.secure.link import Links

EXIT_USER_ERROR = 2
EXIT_PARTY_FAILURE = 3
HEARTBEAT_S = 0.5
PROBE_S = 1.0  # one TCP probe of the rendezvous address waits at most this long
RETRY_S = 0.05  # pause between probes while rank 0 is not (yet) listening (a refused probe is cheap)
STARTUP_GRACE_S = 2.0  # past the start-up deadline, a blocked native call is abandoned
LISTEN_BACKLOG = 128
SUMMARY_STREAM = "summary"  # run summaries go to rank 0 sealed on their own stream
NONCE_KEY = "run/nonce"  # rank 0's fresh run nonce (hex), the first value in its store
# a rank whose own key is not the pinned one tries this long to tell the rendezvous
# which key it presented (so that its peers can name it), then stops
PRESENT_S = 10.0


class Hello(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rank: int
    world_size: int
    party: str
    role: str
    digest: str
    pid: int
    host: str
    version: str
    run_id: str  # rank 0's names the run (its checkpoints carry it)
    identity: str  # Ed25519 public key, hex
    ephemeral: str  # X25519 public key, hex (this run only)
    # --resume: the epochs of this rank's complete checkpoints and their run ids,
    # or why its checkpoints cannot be used; None: a fresh run
    checkpoints: dict[int, str] | None = None
    checkpoint_error: str | None = None
    # what the ranks run together: "train" (securevfl run / party) or "predict"
    # (securevfl predict / party --predict); ranks started for different purposes
    # would exchange different messages, so they are refused at start-up
    purpose: str = "train"


class ResumeOffer(BaseModel):
    """What a rank started with ``--resume`` brings to the handshake: its complete,
    verified checkpoints (epoch -> run id), or the error that makes them unusable."""

    model_config = ConfigDict(extra="forbid")
    checkpoints: dict[int, str]
    error: str | None = None


def agree_checkpoint(hellos: dict[int, Hello], who: Any) -> tuple[int | None, str]:
    """The checkpoint every party rank resumes from: the newest epoch that every
    party rank holds from the same run (helper ranks keep no checkpoints). Returns
    (epoch or None for a fresh run, the run id). A rank that cannot offer its
    checkpoints, ranks that were not all started with ``--resume``, or ranks with
    no checkpoint in common: a CheckpointError naming the rank and the reason,
    raised alike at every rank."""
    ranks = sorted(hellos)
    for r in ranks:
        if hellos[r].checkpoint_error is not None:
            raise CheckpointError(str(hellos[r].checkpoint_error))
    resuming = [r for r in ranks if hellos[r].checkpoints is not None]
    if not resuming:
        return None, hellos[ranks[0]].run_id
    fresh = [r for r in ranks if hellos[r].checkpoints is None]
    if fresh:
        raise CheckpointError(
            f"{who(fresh[0])} was started without --resume while {who(resuming[0])} resumes: "
            "start every rank with --resume, or none"
        )
    held = {r: hellos[r].checkpoints or {} for r in ranks if hellos[r].role != "helper"}
    common = set.intersection(*({(e, run) for e, run in h.items()} for h in held.values()))
    if not common:
        listed = "; ".join(f"{who(r)} holds epochs {sorted(h) or 'none'}" for r, h in held.items())
        raise CheckpointError(
            "no checkpoint of the same run and epoch is held by every rank (field 'checkpoints': "
            f"{listed}): every rank must resume from the same checkpoint"
        )
    epoch, run_id = max(common)
    return epoch, run_id


class Claim(BaseModel):
    """Who holds a rank: written with an atomic compare-and-set, so that a second
    process started with the same ``--rank`` is refused before it can overwrite
    the first one's hello. ``token`` makes each claim unique; ``sig`` is the
    claimant's signature over the body, bound to the run nonce. A claim counts
    only when that signature verifies for this run with the rank's pinned key
    (any key, where none is pinned): one that does not is displaced."""

    model_config = ConfigDict(extra="forbid")
    pid: int
    host: str
    token: str
    identity: str = ""  # the claimant's Ed25519 public key, hex
    sig: str = ""

    def body(self) -> bytes:
        return f"{self.pid} {self.host} {self.token} {self.identity}".encode()


class SignedNote(BaseModel):
    """A value a rank publishes in the store for its peers (a hello, an error
    report, a heartbeat, a done flag), signed with its identity key over
    :func:`~securevfl.runtime.secure.handshake.note_message`."""

    model_config = ConfigDict(extra="forbid")
    body: str
    sig: str


def sign_note(identity: Identity, binding: bytes, rank: int, kind: str, body: str) -> str:
    """``body`` signed by ``identity`` as rank ``rank``'s value of ``kind`` in the
    run ``binding`` names, as the store carries it."""
    sig = identity.sign(hs.note_message(binding, rank, kind, body.encode()))
    return SignedNote(body=body, sig=sig.hex()).model_dump_json()


def open_note(raw: bytes, signer: bytes, binding: bytes, rank: int, kind: str) -> str | None:
    """The body of a value from :func:`sign_note`, or None when it is malformed or
    not signed by ``signer`` as rank ``rank``'s ``kind`` for this run (forged, or
    replayed from another run)."""
    try:
        signed = SignedNote.model_validate_json(raw)
        sig = bytes.fromhex(signed.sig)
    except (ValidationError, ValueError):
        return None
    if not keys.verify(signer, sig, hs.note_message(binding, rank, kind, signed.body.encode())):
        return None
    return signed.body


class Authenticators(BaseModel):
    """One rank's handshake answer to every peer: signature and key-confirmation
    MAC, hex, keyed by the peer's rank."""

    model_config = ConfigDict(extra="forbid")
    sig: dict[str, str]
    mac: dict[str, str]


class ErrorNote(BaseModel):
    """A rank's error report. ``message`` is public: it goes to every peer
    through the store. ``detail`` (the owner's own IDs, lines, paths, or a bug's
    exception text) stays in the owner's error file and stderr and is removed
    from the copy published to peers (:meth:`public`)."""

    model_config = ConfigDict(extra="forbid")
    rank: int
    kind: str
    message: str
    lost_rank: int | None = None
    detail: str | None = None

    def public(self) -> ErrorNote:
        return self.model_copy(update={"detail": None})


def error_note(rank: int, exc: BaseException) -> ErrorNote:
    """What a failing rank reports. A :class:`SecureVFLError`'s message is written
    to be shared (a :class:`DataError` keeps IDs and values in its ``detail``);
    any other exception is a bug whose text may quote data, so only its type
    crosses to the peers."""
    if isinstance(exc, SecureVFLError):
        return ErrorNote(
            rank=rank,
            kind=type(exc).__name__,
            message=str(exc),
            lost_rank=exc.rank if isinstance(exc, PartyFailure) else None,
            detail=exc.detail if isinstance(exc, DataError) else None,
        )
    return ErrorNote(
        rank=rank,
        kind=type(exc).__name__,
        message=f"internal error ({type(exc).__name__}); the traceback is in this rank's own log",
        detail=f"{type(exc).__name__}: {exc}",
    )


def parse_rendezvous(addr: str) -> tuple[str, int]:
    u = urlparse(addr)
    if u.scheme != "tcp" or not u.hostname or not u.port:
        raise ConfigError(f"rendezvous must look like tcp://HOST:PORT (got {addr!r})", path="--rendezvous")
    return u.hostname, u.port


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


def pins_required(setting: bool | str, spans_hosts: str | None) -> bool:
    """Whether every rank must present a pinned key: ``security.require_pinned_keys``
    ``true`` always, ``false`` never, ``auto`` when the run spans hosts
    (``spans_hosts`` says why it does, None when it does not)."""
    if setting == "auto":
        return spans_hosts is not None
    return bool(setting)


def pins_of(proto: Protocol, layout: Layout, *, spans_hosts: str | None = None) -> dict[int, str]:
    """The identity each rank must present, by rank: a party's ``key`` under its
    entry, a helper's under ``security.helper_keys``. A rank without a pin is a
    ConfigError where :func:`pins_required` says pins are required; a run across
    hosts whose protocol opts out (``require_pinned_keys: false``) goes on with a
    :class:`SecurityWarning` naming the ranks nobody authenticates."""
    by_party = {p.name: p.key for p in [proto.parties.active, *proto.parties.passive]}
    pins: dict[int, str] = {}
    missing: list[Role] = []
    for role in layout.roles:
        pin = (
            proto.security.helper_keys.get(role.party) if role.kind == "helper" else by_party.get(role.party)
        )
        if pin is not None:
            pins[role.rank] = pin
        else:
            missing.append(role)
    if not missing:
        return pins
    setting = proto.security.require_pinned_keys
    first = missing[0]
    path = f"security.helper_keys.{first.party}" if first.kind == "helper" else "parties"
    labels = ", ".join(f"{role.label} (rank {role.rank})" for role in missing)
    if setting is True:
        raise ConfigError(
            f"no key is pinned for {first.label} (rank {first.rank}); security.require_pinned_keys is on",
            path=path,
        )
    if pins_required(setting, spans_hosts):
        raise ConfigError(
            f"this run spans hosts ({spans_hosts}), so every rank must present a pinned key, and no key "
            f"is pinned for {labels}: pin each (key: ed25519:... under a party's entry, a helper's under "
            "security.helper_keys; securevfl keygen prints it), or set security.require_pinned_keys: "
            "false to run with unauthenticated ranks",
            path=path,
        )
    if spans_hosts is not None:
        warnings.warn(
            SecurityWarning(
                f"security.require_pinned_keys is false and this run spans hosts ({spans_hosts}): {labels} "
                "present keys nobody pinned, so nothing authenticates them: anyone who reaches the "
                "rendezvous can take their place and read and alter what the other ranks send them"
            ),
            stacklevel=2,
        )
    return pins


class Session:
    """Context manager around one rank's life in the run.

    ``identity`` is this rank's long-term key (``securevfl party --key``; a
    throw-away one if None); ``pins`` overrides the protocol's pins (the local
    launcher pins the throw-away keys it hands its ranks). Without ``pins`` the
    protocol's pins apply, required by :func:`pins_required` (a rendezvous that is
    not a loopback address makes the run span hosts)."""

    def __init__(
        self,
        proto: Protocol,
        layout: Layout,
        rank: int,
        rendezvous: str,
        out_dir: Path,
        resume: ResumeOffer | None = None,
        *,
        identity: Identity | None = None,
        pins: dict[int, str] | None = None,
        purpose: str = "train",
    ):
        self.proto = proto
        self.purpose = purpose
        self.resume = resume
        # set by the handshake: the run's id, and the checkpoint epoch every rank resumes from
        self.run_id = ""
        self.resume_epoch: int | None = None
        self.layout = layout
        self.role: Role = layout.role(rank)
        self.rank = rank
        self.host, self.port = parse_rendezvous(rendezvous)
        self.rt = proto.runtime
        self.out_dir = Path(out_dir)
        self.names = layout.names()
        self.store: dist.TCPStore | None = None
        self._watch_store: dist.TCPStore | None = None  # the watchdog's own client, made at start-up
        self._claimed = False  # this process holds its rank in the store
        self.nonce = b""  # rank 0's run nonce: claims and hellos are signed over it
        self.session = b""  # the session hash, once every hello is in: notes are signed over it
        self._keys: dict[int, bytes] = {}  # identity keys of the ranks whose hello counts
        self.hellos: dict[int, Hello] = {}
        self._lost: PartyFailure | None = None
        self._lost_event = threading.Event()
        self._stop = threading.Event()
        self._report_lock = threading.Lock()
        self._reported = False
        self._ignored: dict[int, bytes] = {}  # error notes that did not verify (reported once)
        self._watchdog: threading.Thread | None = None
        self.digest = proto.digest()
        self.identity = identity if identity is not None else Identity.generate()
        self._own_pins = pins is None  # the protocol's pins (not the local launcher's)
        self._spans_hosts = (
            None if is_loopback(self.host) else f"the rendezvous {self.host} is not a loopback address"
        )
        self.pins = pins if pins is not None else pins_of(proto, layout, spans_hosts=self._spans_hosts)
        self._ephemeral = hs.ephemeral()
        self.peer_keys: dict[int, bytes] = {}  # rank -> verified identity key
        self.links: Links | None = None  # set once the handshake has authenticated every peer

    # -- naming ---------------------------------------------------------------------
    def who(self, rank: int) -> str:
        return f"rank {rank} ({self.names.get(rank, '?')})"

    # -- start-up ---------------------------------------------------------------------
    def __enter__(self) -> Session:
        if is_loopback(self.host):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        self._start_up()
        assert self.store is not None
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore("pg/", self.store),
            rank=self.rank,
            world_size=self.layout.world_size,
            timeout=timedelta(seconds=self.rt.op_timeout_s),
        )
        self._watchdog = threading.Thread(target=self._watch, name="securevfl-watchdog", daemon=True)
        self._watchdog.start()
        return self

    def _start_up(self) -> None:
        """Connect, claim this rank, handshake and connect the watchdog's store
        client, all before one deadline (``runtime.startup_timeout_s``).

        The work runs in a daemon thread: a torch store client whose peer accepts
        TCP but never answers (a stopped rank 0, another service on the port)
        blocks in native code past its own timeout. The thread is abandoned
        then, and this rank fails naming rank 0 instead of hanging."""
        timeout = self.rt.startup_timeout_s
        deadline = time.monotonic() + timeout
        stores: list[dist.TCPStore] = []
        failure: list[BaseException] = []
        claimed = threading.Event()

        def work() -> None:
            try:
                refusal = self._own_key_refusal()
                if refusal is not None:
                    raise self._present(refusal, min(deadline, time.monotonic() + PRESENT_S))
                store = self._connect(deadline)
                stores.append(store)
                self.nonce = self._run_nonce(store, deadline)
                self._claim(store, deadline)
                claimed.set()
                self._handshake(store, deadline)
                self._watch_store = self._watch_client(deadline)
            except BaseException as exc:  # re-raised in the calling thread
                failure.append(exc)

        worker = threading.Thread(target=work, name="securevfl-startup", daemon=True)
        worker.start()
        worker.join(max(deadline - time.monotonic(), 0.0) + STARTUP_GRACE_S)
        if worker.is_alive():  # blocked in native code: leave the store alone
            raise PartyFailure(
                f"start-up did not finish within {timeout:g} s: the rendezvous at "
                f"{self.host}:{self.port} hosted by {self.who(0)} accepts connections but does not "
                "answer (a stopped rank 0, or another service on that port)",
                rank=0,
            )
        self.store = stores[0] if stores else None
        self._claimed = claimed.is_set()
        if failure:
            raise failure[0]

    def _own_key_refusal(self) -> str | None:
        """Why this rank may not take part (its identity key is not the one pinned
        for it), or None. Checked before anything is sent to the rendezvous."""
        pin = self.pins.get(self.rank)
        if pin is None or keys.matches(pin, self.identity.public):
            return None
        return (
            f"this rank's identity key ({keys.short(self.identity.public)}) is not the key the protocol "
            f"pins for {self.role.label} ({pin[:23]}...): start it with --key naming that party's secret "
            "key file"
        )

    def _present(self, refusal: str, until: float) -> ConfigError:
        """This rank's key is not the pinned one. Until ``until``, try to leave a
        claim signed with it at the rendezvous (one that does not count: the
        rank's party can still take the rank, and its peers name this key if the
        party never comes); then the refusal, saying whether the rendezvous was
        told. Nothing is read from the store but the run nonce, so this process
        learns nothing about the rank's holder. Rank 0 hosts the rendezvous and
        with the wrong key hosts nothing."""
        if self.rank == 0:
            return ConfigError(refusal, path="--key")
        window = max(until - time.monotonic(), 0.0)
        try:
            store = self._connect(until)
            nonce = self._run_nonce(store, until)
            store.compare_set(f"claim/{self.rank}", "", self._claim_record(nonce))
        except (SecureVFLError, RuntimeError):
            return ConfigError(
                f"{refusal} (the rendezvous at {self.host}:{self.port} did not answer within "
                f"{window:.0f} s either; nothing was sent to it)",
                path="--key",
            )
        return ConfigError(
            f"{refusal} (the rendezvous at {self.host}:{self.port} was reached; its other ranks wait "
            "for the pinned key until their start-up deadline)",
            path="--key",
        )

    def _client(self, left: float) -> dist.TCPStore | str:
        """A store client connected to rank 0's store, or why it could not be made."""
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
        store.set_timeout(timedelta(seconds=self.rt.startup_timeout_s))  # later store ops, as before
        return store

    def _connect(self, deadline: float) -> dist.TCPStore:
        """Rank 0 hosts the store; the others probe its address until it listens
        (or the deadline passes), then connect."""
        timeout = self.rt.startup_timeout_s
        if self.rank == 0:
            fd = listen_socket(self.host, self.port).detach()  # the store owns and closes it
            try:
                return dist.TCPStore(
                    self.host,
                    self.port,
                    self.layout.world_size,
                    is_master=True,
                    timeout=timedelta(seconds=timeout),
                    wait_for_workers=False,
                    master_listen_fd=fd,
                )
            except RuntimeError as exc:
                raise ConfigError(
                    f"cannot host the rendezvous on {self.host}:{self.port}: {native_message(exc)}",
                    path="--rendezvous",
                ) from exc
        reason = "no attempt"
        while (left := deadline - time.monotonic()) > 0:
            got = self._client(left)
            if not isinstance(got, str):
                return got
            reason = got
            time.sleep(max(min(RETRY_S, deadline - time.monotonic()), 0.0))
        raise PartyFailure(
            f"could not reach the rendezvous at {self.host}:{self.port} hosted by {self.who(0)} "
            f"within {timeout:g} s (runtime.startup_timeout_s; last attempt: {reason}): start rank 0 "
            "first, and check the address, the port and any firewall in between",
            rank=0,
        )

    def _watch_client(self, deadline: float) -> dist.TCPStore:
        """The watchdog's own store client, connected within the start-up deadline."""
        got = self._client(max(deadline - time.monotonic(), 0.0))
        if isinstance(got, str):
            raise PartyFailure(f"lost the rendezvous host {self.who(0)} during start-up: {got}", rank=0)
        return got

    def _run_nonce(self, store: dist.TCPStore, deadline: float) -> bytes:
        """Rank 0 draws the run's nonce and publishes it before anything else; the
        others read it. Claims and hellos are signed over it, so that no claim or
        hello of an earlier run counts in this one."""
        try:
            if self.rank == 0:
                nonce = secrets.token_bytes(16)
                store.set(NONCE_KEY, nonce.hex())
                return nonce
            while not store.check([NONCE_KEY]):
                if time.monotonic() > deadline:
                    raise PartyFailure(
                        f"start-up timed out after {self.rt.startup_timeout_s:g} s: the rendezvous at "
                        f"{self.host}:{self.port} never published its run nonce (is {self.who(0)} running "
                        f"securevfl {__version__}?)",
                        rank=0,
                    )
                time.sleep(0.02)
            raw = store.get(NONCE_KEY)
        except RuntimeError as exc:
            raise PartyFailure(
                f"lost the rendezvous host {self.who(0)} during start-up: {native_message(exc)}", rank=0
            ) from exc
        try:
            nonce = bytes.fromhex(raw.decode())
        except ValueError:
            nonce = b""
        if len(nonce) != 16:
            raise ProtocolError(f"the run nonce in the rendezvous store of {self.who(0)} is malformed")
        return nonce

    def _claim_record(self, nonce: bytes) -> str:
        """This process's claim of its rank, signed over the run nonce."""
        mine = Claim(
            pid=os.getpid(),
            host=socket.gethostname(),
            token=secrets.token_hex(8),
            identity=self.identity.public.hex(),
        )
        sig = self.identity.sign(hs.note_message(nonce, self.rank, "claim", mine.body()))
        return mine.model_copy(update={"sig": sig.hex()}).model_dump_json()

    def _signed_claim(self, rank: int, raw: bytes) -> Claim | None:
        """The claim ``raw`` holds if it is signed for this run by the key it names."""
        try:
            claim = Claim.model_validate_json(raw)
            pub, sig = bytes.fromhex(claim.identity), bytes.fromhex(claim.sig)
        except (ValidationError, ValueError):
            return None
        signed = keys.verify(pub, sig, hs.note_message(self.nonce, rank, "claim", claim.body()))
        return claim if signed else None

    def _counting_claim(self, rank: int, raw: bytes) -> Claim | None:
        """The claim ``raw`` holds if it counts for ``rank`` in this run: signed
        over this run's nonce with the key pinned for the rank (with any key,
        where none is pinned)."""
        claim = self._signed_claim(rank, raw)
        pin = self.pins.get(rank)
        if claim is None or (pin is not None and not keys.matches(pin, bytes.fromhex(claim.identity))):
            return None
        return claim

    def _claim(self, store: dist.TCPStore, deadline: float) -> None:
        """Claim this rank with an atomic compare-and-set, before publishing
        anything under it. A claim that does not count (:meth:`_counting_claim`:
        an impostor's, a forged one, one replayed from an earlier run) is
        displaced. A rank held by a claim that counts is a ``ConfigError`` naming
        the process holding it; this process then writes nothing more to the
        store (its error report stays local), so the run of the first claimant
        goes on."""
        raw = self._claim_record(self.nonce)
        key = f"claim/{self.rank}"
        expected: str | bytes = ""
        try:
            while True:
                # the held value goes back as bytes (it may not be UTF-8); torch accepts both
                held = store.compare_set(key, expected, raw)  # type: ignore[arg-type]
                if held == raw.encode():
                    return
                if expected and held == expected:  # the claim being displaced vanished meanwhile
                    expected = ""
                    continue
                owner = self._counting_claim(self.rank, held)
                if owner is not None:
                    pinned = "the pinned key" if self.rank in self.pins else "a key nobody pinned"
                    raise ConfigError(
                        f"rank {self.rank} is already claimed by another process (pid {owner.pid} on host "
                        f"{owner.host}) at the rendezvous {self.host}:{self.port}; its claim is signed with "
                        f"key {keys.short(bytes.fromhex(owner.identity))}, {pinned}: start each rank exactly "
                        "once per run",
                        path="--rank",
                    )
                if time.monotonic() > deadline:
                    raise PartyFailure(
                        f"start-up timed out after {self.rt.startup_timeout_s:g} s: rank {self.rank} could "
                        "not be claimed, claims that do not count kept replacing this rank's in the "
                        "rendezvous store (someone is writing into it)",
                        rank=None,
                    )
                expected = held  # a claim that does not count: displace it
        except RuntimeError as exc:
            raise PartyFailure(
                f"lost the rendezvous host {self.who(0)} during start-up: {native_message(exc)}", rank=0
            ) from exc

    def _handshake(self, store: dist.TCPStore, deadline: float) -> None:
        """Exchange hellos and authenticators; a store that fails meanwhile is
        rank 0 lost."""
        try:
            raws = self._exchange_hellos(store, deadline)
            self._authenticate(store, raws, deadline)
        except RuntimeError as exc:  # the store went away mid-handshake
            raise PartyFailure(
                f"lost the rendezvous host {self.who(0)} during start-up: {native_message(exc)}", rank=0
            ) from exc

    def _exchange_hellos(self, store: dist.TCPStore, deadline: float) -> dict[int, bytes]:
        """Publish this rank's signed hello, wait until every rank's hello counts
        (:meth:`_accepted_hello`) or the deadline passes, and check that they all
        run this protocol in their expected roles. Returns the hellos as
        published (the handshake's transcripts and the session hash cover these
        bytes)."""
        me = Hello(
            rank=self.rank,
            world_size=self.layout.world_size,
            party=self.role.party,
            role=self.role.kind,
            digest=self.digest,
            pid=os.getpid(),
            host=socket.gethostname(),
            version=__version__,
            purpose=self.purpose,
            run_id=secrets.token_hex(8),
            checkpoints=None if self.resume is None else self.resume.checkpoints,
            checkpoint_error=None if self.resume is None else self.resume.error,
            identity=self.identity.public.hex(),
            ephemeral=hs.ephemeral_public(self._ephemeral).hex(),
        )
        mine = sign_note(self.identity, self.nonce, self.rank, "hello", me.model_dump_json())
        store.set(f"hb/{self.rank}", "0")
        store.set(f"hello/{self.rank}", mine)
        world = self.layout.world_size
        raws: dict[int, bytes] = {self.rank: mine.encode()}
        hellos: dict[int, Hello] = {self.rank: me}
        self._keys[self.rank] = self.identity.public
        refused: dict[int, SecureVFLError] = {}  # why a rank's hello in the store does not count
        judged: dict[int, bytes] = {}
        while len(raws) < world:
            for r in range(world):
                if r in raws or not store.check([f"hello/{r}"]):
                    continue
                raw = store.get(f"hello/{r}")
                if judged.get(r) == raw:
                    continue
                judged[r] = raw
                got = self._accepted_hello(store, r, raw)
                if isinstance(got, Hello):
                    raws[r], hellos[r] = raw, got
                    self._keys[r] = bytes.fromhex(got.identity)
                    refused.pop(r, None)
                else:
                    refused[r] = got
            if len(raws) == world:
                break
            missing = [r for r in range(world) if r not in raws]
            for r in sorted(raws):  # a peer gave up waiting: conclude now, from what the store holds
                if r != self.rank and store.check([f"err/{r}"]):
                    failure = self._peer_error(r, store.get(f"err/{r}"))
                    if failure is not None:
                        raise self._evidence(store, missing, refused) or failure
            if time.monotonic() > deadline:
                raise self._evidence(store, missing, refused) or PartyFailure(
                    f"start-up timed out after {self.rt.startup_timeout_s:g} s: "
                    + ", ".join(self.who(r) for r in missing)
                    + " never joined the rendezvous",
                    rank=missing[0],
                )
            time.sleep(0.05)
        self.session = hs.session_hash(self.digest, self.nonce, [raws[r] for r in range(world)])
        for r in range(world):
            h, expect = hellos[r], self.layout.roles[r]
            if h.rank != r or h.world_size != world:
                raise ConfigError(
                    f"{self.who(r)} was started with world size {h.world_size} as rank {h.rank}; "
                    f"this protocol needs world size {world}"
                )
            if h.purpose != me.purpose:
                raise ConfigError(
                    f"{self.who(r)} was started to {h.purpose}, this rank to {me.purpose}: start every "
                    "rank of a prediction with --predict (securevfl party) or all of them with "
                    "securevfl predict"
                )
            if h.digest != me.digest:
                raise ConfigError(
                    f"{self.who(r)} runs a different protocol (digest {h.digest}, mine {me.digest}): "
                    "start every rank with the same protocol file and --set overrides"
                )
            if (h.party, h.role) != (expect.party, expect.kind):
                raise ConfigError(
                    f"rank {r} announced itself as {h.role} '{h.party}', expected {expect.label}"
                )
            self.hellos[r] = h
        hosts = sorted({h.host for h in self.hellos.values()})
        if self._own_pins and self._spans_hosts is None and len(hosts) > 1:
            # ranks on several hosts (a forwarded loopback port): the rule for runs across hosts
            pins_of(self.proto, self.layout, spans_hosts="its ranks run on hosts " + ", ".join(hosts))
        self.resume_epoch, self.run_id = agree_checkpoint(self.hellos, self.who)
        return raws

    def _accepted_hello(self, store: dist.TCPStore, r: int, raw: bytes) -> Hello | SecureVFLError:
        """Rank ``r``'s hello if it counts: signed over this run's nonce with the
        identity key it carries, and that key the one pinned for ``r`` (or, where
        none is pinned, the key ``r``'s claim was signed with). Otherwise why
        not, raised only if no hello of ``r`` counts by the deadline: the real
        rank may still overwrite an impostor's or a stale one."""
        try:
            signed = SignedNote.model_validate_json(raw)
            h = Hello.model_validate_json(signed.body)
            identity, eph = bytes.fromhex(h.identity), bytes.fromhex(h.ephemeral)
            if len(identity) != 32 or len(eph) != 32:
                raise ValueError("key length")
        except (ValidationError, ValueError):
            return ProtocolError(
                f"{self.who(r)} failed the handshake: its signature does not verify: its hello in the "
                "rendezvous store is unsigned or malformed (forged, or written by a version of securevfl "
                f"other than {__version__}); refused at start-up"
            )
        if open_note(raw, identity, self.nonce, r, "hello") is None:
            return ProtocolError(
                f"{self.who(r)} failed the handshake: its signature does not verify with the identity key "
                f"{keys.short(identity)} of its hello (a forged hello, or one of another run, in the "
                "rendezvous store); refused at start-up"
            )
        if r in self.pins:
            return h if keys.matches(self.pins[r], identity) else self._impostor(r, identity)
        claim = store.get(f"claim/{r}") if store.check([f"claim/{r}"]) else b""
        owner = self._counting_claim(r, claim)
        if owner is None or owner.identity != h.identity:
            return ProtocolError(
                f"{self.who(r)}: the hello in the rendezvous store carries identity key "
                f"{keys.short(identity)}, not the key the rank was claimed with (a process published a "
                "hello for a rank it does not hold); refused at start-up"
            )
        return h

    def _impostor(self, r: int, identity: bytes) -> ProtocolError:
        pin = self.pins[r]
        return ProtocolError(
            f"{self.who(r)} presented identity key {keys.short(identity)}, not the key the protocol pins "
            f"for {self.layout.roles[r].label} ({pin[:23]}...): refused at start-up (an impostor, or that "
            "party's rank was started with the wrong --key); nothing of the run was sent"
        )

    def _evidence(
        self, store: dist.TCPStore, missing: list[int], refused: dict[int, SecureVFLError]
    ) -> SecureVFLError | None:
        """What the store says about the ranks in ``missing``, which have no hello
        that counts: the reason their hello in the store was refused, or a claim
        signed with a key that is not the pinned one (a rank started with the
        wrong key tells the rendezvous so); None if it says nothing."""
        for r in missing:
            if r in refused:
                return refused[r]
            if r in self.pins and store.check([f"claim/{r}"]):
                claim = self._signed_claim(r, store.get(f"claim/{r}"))
                if claim is not None and not keys.matches(self.pins[r], bytes.fromhex(claim.identity)):
                    return self._impostor(r, bytes.fromhex(claim.identity))
        return None

    def _authenticate(self, store: dist.TCPStore, raws: dict[int, bytes], deadline: float) -> None:
        """SIGMA-style mutual authentication with every peer (:mod:`.secure.handshake`):
        publish a signature and a key-confirmation MAC per peer, verify every
        peer's, then derive the sealed links."""
        me, world = self.rank, self.layout.world_size
        peers = [r for r in range(world) if r != me]
        transcripts: dict[int, bytes] = {}
        prks: dict[int, bytes] = {}
        sigs: dict[str, str] = {}
        macs: dict[str, str] = {}
        for r in peers:
            a, b = min(me, r), max(me, r)
            t = hs.transcript(self.digest, a, raws[a], b, raws[b])
            try:
                prk = hs.pair_secret(self._ephemeral, bytes.fromhex(self.hellos[r].ephemeral), t)
            except ValueError:
                raise ProtocolError(f"{self.who(r)} sent an invalid ephemeral key in its hello") from None
            transcripts[r], prks[r] = t, prk
            sigs[str(r)] = self.identity.sign(hs.auth_message(t, me, r)).hex()
            macs[str(r)] = hs.confirm_tag(prk, t, me, r).hex()
        store.set(f"auth/{me}", Authenticators(sig=sigs, mac=macs).model_dump_json())
        waiting = list(peers)
        while waiting:
            # every answer present is verified first, so that this rank names an
            # impostor itself rather than relaying a peer's report of it
            for r in list(waiting):
                if store.check([f"auth/{r}"]):
                    self._verify_peer(r, store.get(f"auth/{r}"), transcripts[r], prks[r])
                    waiting.remove(r)
            for r in waiting:
                if store.check([f"err/{r}"]):
                    failure = self._peer_error(r, store.get(f"err/{r}"))
                    if failure is not None:
                        raise failure
            if waiting and time.monotonic() > deadline:
                raise PartyFailure(
                    f"start-up timed out after {self.rt.startup_timeout_s:g} s: "
                    + ", ".join(self.who(r) for r in waiting)
                    + " never completed the handshake",
                    rank=waiting[0],
                )
            if waiting:
                time.sleep(0.02)

        def keys_for(peer: int, stream: str) -> tuple[bytes, bytes]:
            return hs.stream_key(prks[peer], stream, me, peer), hs.stream_key(prks[peer], stream, peer, me)

        self.links = Links(me, peers, keys_for, self.who)

    def _verify_peer(self, r: int, raw: bytes, t: bytes, prk: bytes) -> None:
        """Check peer ``r``'s signature (with the identity key its hello carried,
        already checked against the pin) and its key-confirmation MAC."""
        try:
            auth = Authenticators.model_validate_json(raw)
            sig, mac = bytes.fromhex(auth.sig[str(self.rank)]), bytes.fromhex(auth.mac[str(self.rank)])
        except (ValidationError, ValueError, KeyError):
            raise ProtocolError(f"{self.who(r)} sent a malformed handshake answer") from None
        identity = bytes.fromhex(self.hellos[r].identity)
        if not keys.verify(identity, sig, hs.auth_message(t, r, self.rank)):
            raise ProtocolError(
                f"{self.who(r)} failed the handshake: its signature does not verify with the identity key "
                f"{keys.short(identity)} of its hello (a forged hello or answer in the rendezvous store); "
                "refused at start-up"
            )
        if not hs.confirm_ok(prk, t, r, self.rank, mac):
            raise ProtocolError(
                f"{self.who(r)} failed the handshake: its key confirmation does not match (its hello's "
                "ephemeral key was replaced in the rendezvous store); refused at start-up"
            )
        self.peer_keys[r] = identity

    @property
    def pids(self) -> dict[int, int]:
        return {r: h.pid for r, h in self.hellos.items()}

    # -- signed store values ------------------------------------------------------------
    def _signed(self, body: str, kind: str) -> str:
        """``body`` as this rank's ``kind`` value for the store, signed over the
        session hash (over the run nonce, if this rank fails before every hello
        is in)."""
        return sign_note(self.identity, self.session or self.nonce, self.rank, kind, body)

    def _opened(self, r: int, raw: bytes, kind: str) -> str | None:
        """The body of rank ``r``'s ``kind`` value if it is signed by the identity
        key of ``r``'s hello over this run's session hash or run nonce, else None
        (forged, or replayed from another run)."""
        if r not in self._keys:
            return None
        for binding in (self.session, self.nonce):
            body = open_note(raw, self._keys[r], binding, r, kind) if binding else None
            if body is not None:
                return body
        return None

    def _beat(self, r: int, raw: bytes) -> int | None:
        body = self._opened(r, raw, "hb")
        return int(body) if body is not None and body.isdigit() else None

    def _done(self, r: int, raw: bytes) -> bool:
        return self._opened(r, raw, "done") == "1"

    # -- liveness -------------------------------------------------------------------------
    def _watch(self) -> None:
        """Beat this rank's heartbeat and watch every peer's: a peer whose signed
        heartbeat does not advance for ``peer_timeout_s``, or whose signed error
        note appears, is declared lost; a peer's signed ``done`` flag ends the
        watch of it. Values that do not verify are ignored, so a forged beat or
        flag cannot hide a dead peer."""
        client = self._watch_store
        assert client is not None
        peers = [r for r in range(self.layout.world_size) if r != self.rank]
        start = time.monotonic()
        last: dict[int, tuple[int, float]] = {r: (0, start) for r in peers}  # newest beat, seen when
        seen: dict[int, bytes] = {}
        beat = 0
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                beat += 1
                client.set(f"hb/{self.rank}", self._signed(str(beat), "hb"))
                for r in list(peers):
                    if client.check([f"err/{r}"]):
                        failure = self._peer_error(r, client.get(f"err/{r}"))
                        if failure is not None:
                            self._declare(failure)
                            return
                    if client.check([f"done/{r}"]) and self._done(r, client.get(f"done/{r}")):
                        peers.remove(r)
                        continue
                    v = client.get(f"hb/{r}")
                    if seen.get(r) != v:
                        seen[r] = v
                        n = self._beat(r, v)
                        if n is not None and n > last[r][0]:
                            last[r] = (n, now)
                    if now - last[r][1] > self.rt.peer_timeout_s:
                        self._declare(
                            PartyFailure(
                                f"{self.who(r)} stopped responding: no heartbeat for "
                                f"{self.rt.peer_timeout_s:.0f} s (the process died or stalled)",
                                rank=r,
                            )
                        )
                        return
            except Exception as exc:
                if self._stop.is_set():
                    return
                self._declare(
                    PartyFailure(
                        f"lost the rendezvous host {self.who(0)} (it died or the network failed: "
                        f"{native_message(exc)})",
                        rank=0,
                    )
                )
                return
            self._stop.wait(HEARTBEAT_S)

    def _peer_error(self, r: int, raw: bytes) -> PartyFailure | None:
        """The failure rank ``r``'s error note reports, or None when the note is
        not signed by ``r``'s identity key for this run (someone else wrote it,
        or it is replayed from an earlier run: ignored, and said once)."""
        if self._ignored.get(r) == raw or r not in self._keys:
            return None
        body = self._opened(r, raw, "error")
        if body is None:
            self._ignored[r] = raw
            print(
                f"securevfl: rank {self.rank}: ignoring an error note for {self.who(r)} in the rendezvous "
                "store that is not signed by its identity key for this run (forged, or replayed from "
                "another run)",
                file=sys.stderr,
                flush=True,
            )
            return None
        try:
            note = ErrorNote.model_validate_json(body)
        except ValidationError:
            return PartyFailure(f"{self.who(r)} failed (its error report was malformed)", rank=r)
        if note.lost_rank is not None and note.lost_rank != self.rank:
            return PartyFailure(f"{note.message} (reported by {self.who(r)})", rank=note.lost_rank)
        return PartyFailure(f"{self.who(r)} failed: {note.message}", rank=r)

    def _declare(self, failure: PartyFailure) -> None:
        """Record a lost peer; if the main thread has not picked it up within a
        grace period (it may be blocked in a receive), end the process."""
        self._lost = failure
        self._lost_event.set()
        if self._stop.wait(3.0):
            return
        self.report(failure)
        os._exit(EXIT_PARTY_FAILURE)

    def diagnose(self, peer: int, exc: Exception) -> PartyFailure:
        """Called by the channel when a send/recv fails: which rank was lost?"""
        if self._lost_event.wait(self.rt.peer_timeout_s + 5.0) and self._lost is not None:
            self._stop.set()
            return self._lost
        if peer < 0:
            return PartyFailure(
                f"an MPC collective failed (a peer was lost): {native_message(exc)}", rank=None
            )
        return PartyFailure(f"lost connection to {self.who(peer)}: {native_message(exc)}", rank=peer)

    # -- reporting ---------------------------------------------------------------------
    def report(self, exc: BaseException) -> None:
        """Publish this rank's error (for peers), write it to its error file and
        stderr. Only the first report counts. A process that never claimed its
        rank (a duplicate) keeps the report out of the store: the error is its
        own, not the run's."""
        with self._report_lock:
            if self._reported:
                return
            self._reported = True
        note = error_note(self.rank, exc)
        write_error_file(self.out_dir, note)
        print(f"securevfl: rank {self.rank} ({self.role.label}): {note.message}", file=sys.stderr, flush=True)
        if note.detail:
            print(
                f"securevfl: rank {self.rank}, for its owner only: {note.detail}", file=sys.stderr, flush=True
            )
        if self.store is not None and self._claimed and self.nonce:
            try:
                self.store.set(f"err/{self.rank}", self._signed(note.public().model_dump_json(), "error"))
                if self.rank == 0:
                    self._linger()
            except Exception:
                pass

    def _linger(self, seconds: float = 5.0) -> None:
        """Rank 0 hosts the store: keep it up briefly so peers can read the error."""
        assert self.store is not None
        end = time.monotonic() + seconds
        others = range(1, self.layout.world_size)
        while time.monotonic() < end:
            if all(self.store.check([f"err/{r}"]) or self.store.check([f"done/{r}"]) for r in others):
                return
            time.sleep(0.1)

    # -- shutdown ------------------------------------------------------------------------
    def finish(self, summary: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Publish this rank's summary; rank 0 collects and returns all of them."""
        assert self.store is not None
        if self.rank != 0:
            self._stop.set()
            if self._watchdog is not None:
                self._watchdog.join(timeout=5)
            assert self.links is not None
            sealed = self.links.link(0, SUMMARY_STREAM).seal(json.dumps(summary).encode())
            self.store.set(f"summary/{self.rank}", b64encode(sealed).decode())
            self.store.set(f"done/{self.rank}", self._signed("1", "done"))
            return None
        deadline = time.monotonic() + self.rt.op_timeout_s
        waiting = set(range(1, self.layout.world_size))
        while waiting:
            for r in sorted(waiting):
                if self.store.check([f"done/{r}"]) and self._done(r, self.store.get(f"done/{r}")):
                    waiting.discard(r)
            if not waiting:
                break
            if self._lost is not None:
                raise self._lost
            if time.monotonic() > deadline:
                raise PartyFailure("peers did not finish in time", rank=None)
            time.sleep(0.05)
        self._stop.set()
        out = [json.loads(json.dumps(summary))]  # as the peers' summaries: through JSON
        assert self.links is not None
        for r in range(1, self.layout.world_size):
            raw = self.store.get(f"summary/{r}")
            try:
                sealed = b64decode(raw, validate=True)
            except ValueError:
                raise ProtocolError(f"{self.who(r)} sent a malformed run summary") from None
            plain = self.links.link(r, SUMMARY_STREAM).open(sealed)  # ProtocolError naming r if forged
            try:
                out.append(json.loads(plain))
            except json.JSONDecodeError:
                raise ProtocolError(f"{self.who(r)} sent a malformed run summary") from None
        return out

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


def write_error_file(out_dir: Path, note: ErrorNote) -> None:
    d = Path(out_dir) / "ranks"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"rank{note.rank}.error.json").write_text(note.model_dump_json(indent=2))


def exit_code_for(exc: BaseException) -> int:
    if isinstance(exc, PartyFailure):
        return EXIT_PARTY_FAILURE
    if isinstance(exc, SecureVFLError):
        return EXIT_USER_ERROR
    return 1
