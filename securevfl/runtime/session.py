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
sealed links the channel uses. A key that is not the pinned one, or an
authenticator that does not verify, stops the start-up (exit 2, naming the rank)
before the process group exists, so nothing of the run's data is sent. What the
store carries that changes the run is authenticated: claims and error notes are
signed with the writer's identity key (a note that does not verify is ignored),
and run summaries travel sealed on the link to rank 0. Heartbeats and ``done``
flags are not authenticated: forging them affects liveness detection only.
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
    """Who holds a rank: written once per rank with an atomic compare-and-set, so
    that a second process started with the same ``--rank`` is refused before it
    can overwrite the first one's hello. ``token`` makes each claim unique."""

    model_config = ConfigDict(extra="forbid")
    pid: int
    host: str
    token: str
    identity: str = ""  # the claimant's Ed25519 public key, hex
    sig: str = ""  # its signature over (digest, rank, pid, host, token)

    def body(self) -> bytes:
        return f"{self.pid} {self.host} {self.token} {self.identity}".encode()


class SignedNote(BaseModel):
    """A note a rank publishes in the store for its peers (an error report),
    signed with its identity key over (protocol digest, rank, kind, body)."""

    model_config = ConfigDict(extra="forbid")
    body: str
    sig: str


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


def pins_of(proto: Protocol, layout: Layout) -> dict[int, str]:
    """The identity each rank must present, by rank: a party's ``key`` under its
    entry, a helper's under ``security.helper_keys``. With
    ``security.require_pinned_keys`` a rank without a pin is a ConfigError."""
    by_party = {p.name: p.key for p in [proto.parties.active, *proto.parties.passive]}
    pins: dict[int, str] = {}
    for role in layout.roles:
        pin = (
            proto.security.helper_keys.get(role.party) if role.kind == "helper" else by_party.get(role.party)
        )
        if pin is not None:
            pins[role.rank] = pin
        elif proto.security.require_pinned_keys:
            raise ConfigError(
                f"no key is pinned for {role.label} (rank {role.rank}); security.require_pinned_keys is on",
                path=f"security.helper_keys.{role.party}" if role.kind == "helper" else "parties",
            )
    return pins


class Session:
    """Context manager around one rank's life in the run.

    ``identity`` is this rank's long-term key (``securevfl party --key``; a
    throw-away one if None); ``pins`` overrides the protocol's pins (the local
    launcher pins the throw-away keys it hands its ranks)."""

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
        self._claimed = False  # this process holds its rank in the store
        self.hellos: dict[int, Hello] = {}
        self._lost: PartyFailure | None = None
        self._lost_event = threading.Event()
        self._stop = threading.Event()
        self._report_lock = threading.Lock()
        self._reported = False
        self._watchdog: threading.Thread | None = None
        self.digest = proto.digest()
        self.identity = identity if identity is not None else Identity.generate()
        self.pins = pins if pins is not None else pins_of(proto, layout)
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
        """Connect, claim this rank and handshake, all before one deadline
        (``runtime.startup_timeout_s``).

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
                store = self._connect(deadline)
                stores.append(store)
                self._claim(store)
                claimed.set()
                self._handshake(store, deadline)
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
            refused = probe(self.host, self.port, min(left, PROBE_S))
            if refused is not None:
                reason = refused
            else:
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
                    reason = native_message(exc)
                else:
                    store.set_timeout(timedelta(seconds=timeout))  # later store ops, as before
                    return store
            time.sleep(max(min(RETRY_S, deadline - time.monotonic()), 0.0))
        raise PartyFailure(
            f"could not reach the rendezvous at {self.host}:{self.port} hosted by {self.who(0)} "
            f"within {timeout:g} s (runtime.startup_timeout_s; last attempt: {reason}): start rank 0 "
            "first, and check the address, the port and any firewall in between",
            rank=0,
        )

    def _claim(self, store: dist.TCPStore) -> None:
        """Claim this rank with an atomic compare-and-set, before publishing
        anything under it. A rank already claimed is a ``ConfigError`` naming the
        process holding it; this process then writes nothing to the store (its
        error report stays local), so the run of the first claimant goes on."""
        mine = Claim(
            pid=os.getpid(),
            host=socket.gethostname(),
            token=secrets.token_hex(8),
            identity=self.identity.public.hex(),
        )
        sig = self.identity.sign(hs.note_message(self.digest, self.rank, "claim", mine.body()))
        mine = mine.model_copy(update={"sig": sig.hex()})
        raw = mine.model_dump_json()
        try:
            held = store.compare_set(f"claim/{self.rank}", "", raw)
        except RuntimeError as exc:
            raise PartyFailure(
                f"lost the rendezvous host {self.who(0)} during start-up: {native_message(exc)}", rank=0
            ) from exc
        if held == raw.encode():
            return
        try:
            owner = Claim.model_validate_json(held)
            by = f"pid {owner.pid} on host {owner.host}"
            signer = self._claim_key_note(owner)
        except (ValidationError, ValueError):
            by, signer = "an unidentified client", ""
        raise ConfigError(
            f"rank {self.rank} is already claimed by another process ({by}) at the rendezvous "
            f"{self.host}:{self.port}{signer}: start each rank exactly once per run",
            path="--rank",
        )

    def _claim_key_note(self, owner: Claim) -> str:
        """What the holder's claim says about its identity, for the refusal message."""
        try:
            pub = bytes.fromhex(owner.identity)
            signed = keys.verify(
                pub, bytes.fromhex(owner.sig), hs.note_message(self.digest, self.rank, "claim", owner.body())
            )
        except ValueError:
            signed = False
        if not signed:
            return "; its claim carries no valid signature"
        pin = self.pins.get(self.rank)
        if pin is None:
            return f"; its claim is signed with key {keys.short(pub)}"
        verdict = "the pinned key" if keys.matches(pin, pub) else "NOT the key the protocol pins"
        return f"; its claim is signed with key {keys.short(pub)}, {verdict}"

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
        """Publish this rank's hello, wait for every rank's until the deadline,
        and check that they all run this protocol in their expected roles with
        their pinned identity keys. Returns the hellos as published (the
        handshake's transcripts hash these bytes)."""
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
        store.set(f"hb/{self.rank}", "0")
        store.set(f"hello/{self.rank}", me.model_dump_json())
        keys = [f"hello/{r}" for r in range(self.layout.world_size)]
        while not store.check(keys):
            if time.monotonic() > deadline:
                missing = [r for r in range(self.layout.world_size) if not store.check([f"hello/{r}"])]
                raise PartyFailure(
                    "start-up timed out after "
                    f"{self.rt.startup_timeout_s:g} s: "
                    + ", ".join(self.who(r) for r in missing)
                    + " never joined the rendezvous",
                    rank=missing[0],
                )
            time.sleep(0.05)
        raws: dict[int, bytes] = {}
        for r in range(self.layout.world_size):
            raw = store.get(f"hello/{r}")
            raws[r] = raw
            try:
                h = Hello.model_validate_json(raw)
                identity, eph = bytes.fromhex(h.identity), bytes.fromhex(h.ephemeral)
                if len(identity) != 32 or len(eph) != 32:
                    raise ValueError("key length")
            except (ValidationError, ValueError):
                raise ProtocolError(f"{self.who(r)} sent a malformed start-up hello") from None
            expect = self.layout.roles[r]
            if h.rank != r or h.world_size != self.layout.world_size:
                raise ConfigError(
                    f"{self.who(r)} was started with world size {h.world_size} as rank {h.rank}; "
                    f"this protocol needs world size {self.layout.world_size}"
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
            self._check_pin(r, identity)
            self.hellos[r] = h
        self.resume_epoch, self.run_id = agree_checkpoint(self.hellos, self.who)
        return raws

    def _check_pin(self, r: int, identity: bytes) -> None:
        """Refuse a rank whose identity key is not the one pinned for it."""
        pin = self.pins.get(r)
        if pin is None or keys.matches(pin, identity):
            return
        label = self.layout.roles[r].label
        if r == self.rank:
            raise ConfigError(
                f"this rank's identity key ({keys.short(identity)}) is not the key the protocol pins for "
                f"{label} ({pin[:23]}...): start it with --key naming that party's secret key file",
                path="--key",
            )
        raise ProtocolError(
            f"{self.who(r)} presented identity key {keys.short(identity)}, not the key the protocol pins "
            f"for {label} ({pin[:23]}...): refused at start-up (an impostor, or that party's rank was "
            "started with the wrong --key); nothing of the run was sent"
        )

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

    # -- liveness -------------------------------------------------------------------------
    def _watch(self) -> None:
        try:
            client = dist.TCPStore(
                self.host,
                self.port,
                None,
                is_master=False,
                timeout=timedelta(seconds=5),
                wait_for_workers=False,
            )
        except Exception:
            self._declare(PartyFailure(f"lost the rendezvous host {self.who(0)}", rank=0))
            return
        peers = [r for r in range(self.layout.world_size) if r != self.rank]
        last: dict[int, tuple[bytes, float]] = {}
        forged: dict[int, bytes] = {}  # error notes that did not verify, ignored
        beat = 0
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                beat += 1
                client.set(f"hb/{self.rank}", str(beat))
                for r in list(peers):
                    if client.check([f"err/{r}"]):
                        raw = client.get(f"err/{r}")
                        failure = self._peer_error(r, raw) if forged.get(r) != raw else None
                        if failure is not None:
                            self._declare(failure)
                            return
                        forged[r] = raw
                    if client.check([f"done/{r}"]):
                        peers.remove(r)
                        continue
                    v = client.get(f"hb/{r}")
                    if r not in last or last[r][0] != v:
                        last[r] = (v, now)
                    elif now - last[r][1] > self.rt.peer_timeout_s:
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
        not signed by ``r``'s identity key (someone else wrote it: ignored)."""
        identity = bytes.fromhex(self.hellos[r].identity) if r in self.hellos else None
        try:
            signed = SignedNote.model_validate_json(raw)
            ok = identity is not None and keys.verify(
                identity,
                bytes.fromhex(signed.sig),
                hs.note_message(self.digest, r, "error", signed.body.encode()),
            )
        except (ValidationError, ValueError):
            ok = False
        if not ok:
            print(
                f"securevfl: rank {self.rank}: ignoring an error note for {self.who(r)} in the rendezvous "
                "store that is not signed by its identity key",
                file=sys.stderr,
                flush=True,
            )
            return None
        try:
            note = ErrorNote.model_validate_json(signed.body)
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
        if self.store is not None and self._claimed:
            try:
                self.store.set(f"err/{self.rank}", self._signed(note.public().model_dump_json(), "error"))
                if self.rank == 0:
                    self._linger()
            except Exception:
                pass

    def _signed(self, body: str, kind: str) -> str:
        sig = self.identity.sign(hs.note_message(self.digest, self.rank, kind, body.encode()))
        return SignedNote(body=body, sig=sig.hex()).model_dump_json()

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
            self.store.set(f"done/{self.rank}", "1")
            return None
        deadline = time.monotonic() + self.rt.op_timeout_s
        keys = [f"done/{r}" for r in range(1, self.layout.world_size)]
        while not self.store.check(keys):
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
