"""Admission: which processes are the run's ranks.

Every rank publishes a hello (its rank, party, role, protocol digest, pid, host,
version, Ed25519 identity key, fresh X25519 ephemeral key, what it resumes
from), signed over the run nonce. A hello counts only when its signature
verifies with the identity key it carries and that key is the one pinned for
the rank (where none is pinned, the key the rank was claimed with); the ranks
wait for a hello that counts from every rank until the start-up deadline, and
only then refuse a rank, naming why its hello did not count
(:func:`exchange_hellos`). Every rank then checks that all hellos run this
protocol in their expected roles (:func:`check_hellos`) and authenticates every
peer with the SIGMA-style "sign and MAC" exchange of
:mod:`securevfl.runtime.secure.handshake` (:func:`authenticate`), which yields
the sealed links the channel uses. A failure stops the start-up before the
process group exists, so nothing of the run's data is sent.
"""

from __future__ import annotations

import time

import torch.distributed as dist
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from pydantic import BaseModel, ConfigDict, ValidationError

from securevfl import __version__
from securevfl.errors import ConfigError, PartyFailure, ProtocolError, SecureVFLError
from securevfl.runtime.claims import counting_claim, signed_claim
from securevfl.runtime.notes import SignedNote, open_note, sign_note
from securevfl.runtime.seat import Seat
from securevfl.runtime.secure import handshake as hs
from securevfl.runtime.secure import keys
from securevfl.runtime.secure.link import Links


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


class Authenticators(BaseModel):
    """One rank's handshake answer to every peer: signature and key-confirmation
    MAC, hex, keyed by the peer's rank."""

    model_config = ConfigDict(extra="forbid")
    sig: dict[str, str]
    mac: dict[str, str]


def exchange_hellos(
    seat: Seat, store: dist.TCPStore, me: Hello, deadline: float
) -> tuple[dict[int, bytes], dict[int, Hello]]:
    """Publish this rank's hello ``me`` signed, and wait until every rank's hello
    counts (:func:`accepted_hello`) or the deadline passes; a peer that gives up
    meanwhile (its signed error note) ends the wait at once. Sets the seat's
    session hash. Returns the hellos as published (the handshake's transcripts
    and the session hash cover these bytes) and as read."""
    mine = sign_note(seat.identity, seat.nonce, seat.rank, "hello", me.model_dump_json())
    store.set(f"hb/{seat.rank}", "0")
    store.set(f"hello/{seat.rank}", mine)
    world = seat.layout.world_size
    raws: dict[int, bytes] = {seat.rank: mine.encode()}
    hellos: dict[int, Hello] = {seat.rank: me}
    seat.keys[seat.rank] = seat.identity.public
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
            got = accepted_hello(seat, store, r, raw)
            if isinstance(got, Hello):
                raws[r], hellos[r] = raw, got
                seat.keys[r] = bytes.fromhex(got.identity)
                refused.pop(r, None)
            else:
                refused[r] = got
        if len(raws) == world:
            break
        missing = [r for r in range(world) if r not in raws]
        for r in sorted(raws):  # a peer gave up waiting: conclude now, from what the store holds
            if r != seat.rank and store.check([f"err/{r}"]):
                failure = seat.peer_failure(r, store.get(f"err/{r}"))
                if failure is not None:
                    raise evidence(seat, store, missing, refused) or failure
        if time.monotonic() > deadline:
            raise evidence(seat, store, missing, refused) or PartyFailure(
                f"start-up timed out after {seat.rendezvous.timeout_s:g} s: "
                + ", ".join(seat.who(r) for r in missing)
                + " never joined the rendezvous",
                rank=missing[0],
            )
        time.sleep(0.05)
    seat.session = hs.session_hash(seat.digest, seat.nonce, [raws[r] for r in range(world)])
    return raws, hellos


def accepted_hello(seat: Seat, store: dist.TCPStore, r: int, raw: bytes) -> Hello | SecureVFLError:
    """Rank ``r``'s hello if it counts: signed over this run's nonce with the
    identity key it carries, and that key the one pinned for ``r`` (or, where
    none is pinned, the key ``r``'s claim was signed with). Otherwise why not,
    raised only if no hello of ``r`` counts by the deadline: the real rank may
    still overwrite an impostor's or a stale one."""
    try:
        signed = SignedNote.model_validate_json(raw)
        h = Hello.model_validate_json(signed.body)
        identity, eph = bytes.fromhex(h.identity), bytes.fromhex(h.ephemeral)
        if len(identity) != 32 or len(eph) != 32:
            raise ValueError("key length")
    except (ValidationError, ValueError):
        return ProtocolError(
            f"{seat.who(r)} failed the handshake: its signature does not verify: its hello in the "
            "rendezvous store is unsigned or malformed (forged, or written by a version of securevfl "
            f"other than {__version__}); refused at start-up"
        )
    if open_note(raw, identity, seat.nonce, r, "hello") is None:
        return ProtocolError(
            f"{seat.who(r)} failed the handshake: its signature does not verify with the identity key "
            f"{keys.short(identity)} of its hello (a forged hello, or one of another run, in the "
            "rendezvous store); refused at start-up"
        )
    if r in seat.pins:
        return h if keys.matches(seat.pins[r], identity) else impostor(seat, r, identity)
    claim = store.get(f"claim/{r}") if store.check([f"claim/{r}"]) else b""
    owner = counting_claim(seat, r, claim)
    if owner is None or owner.identity != h.identity:
        return ProtocolError(
            f"{seat.who(r)}: the hello in the rendezvous store carries identity key "
            f"{keys.short(identity)}, not the key the rank was claimed with (a process published a "
            "hello for a rank it does not hold); refused at start-up"
        )
    return h


def impostor(seat: Seat, r: int, identity: bytes) -> ProtocolError:
    pin = seat.pins[r]
    return ProtocolError(
        f"{seat.who(r)} presented identity key {keys.short(identity)}, not the key the protocol pins "
        f"for {seat.layout.roles[r].label} ({pin[:23]}...): refused at start-up (an impostor, or that "
        "party's rank was started with the wrong --key); nothing of the run was sent"
    )


def evidence(
    seat: Seat, store: dist.TCPStore, missing: list[int], refused: dict[int, SecureVFLError]
) -> SecureVFLError | None:
    """What the store says about the ranks in ``missing``, which have no hello
    that counts: the reason their hello in the store was refused, or a claim
    signed with a key that is not the pinned one (a rank started with the wrong
    key tells the rendezvous so); None if it says nothing."""
    for r in missing:
        if r in refused:
            return refused[r]
        if r in seat.pins and store.check([f"claim/{r}"]):
            claim = signed_claim(seat, r, store.get(f"claim/{r}"))
            if claim is not None and not keys.matches(seat.pins[r], bytes.fromhex(claim.identity)):
                return impostor(seat, r, bytes.fromhex(claim.identity))
    return None


def check_hellos(seat: Seat, hellos: dict[int, Hello], me: Hello) -> None:
    """Every rank runs this protocol, for the same purpose, in its expected role:
    a ConfigError naming the first rank that does not, raised alike at every rank."""
    world = seat.layout.world_size
    for r in range(world):
        h, expect = hellos[r], seat.layout.roles[r]
        if h.rank != r or h.world_size != world:
            raise ConfigError(
                f"{seat.who(r)} was started with world size {h.world_size} as rank {h.rank}; "
                f"this protocol needs world size {world}"
            )
        if h.purpose != me.purpose:
            raise ConfigError(
                f"{seat.who(r)} was started to {h.purpose}, this rank to {me.purpose}: start every "
                "rank of a prediction with --predict (securevfl party) or all of them with "
                "securevfl predict"
            )
        if h.digest != me.digest:
            theirs, mine = _schema(h.digest), _schema(me.digest)
            if theirs != mine:
                raise ConfigError(
                    f"{seat.who(r)} runs a securevfl whose protocol schema ({theirs}) is incompatible with "
                    f"this rank's ({mine}): run the same securevfl version on every host"
                )
            raise ConfigError(
                f"{seat.who(r)} runs a different protocol (digest {h.digest}, mine {me.digest}): "
                "start every rank with the same protocol file and --set overrides"
            )
        if (h.party, h.role) != (expect.party, expect.kind):
            raise ConfigError(f"rank {r} announced itself as {h.role} '{h.party}', expected {expect.label}")


def authenticate(
    seat: Seat,
    store: dist.TCPStore,
    raws: dict[int, bytes],
    hellos: dict[int, Hello],
    ephemeral: X25519PrivateKey,
    deadline: float,
) -> Links:
    """SIGMA-style mutual authentication with every peer (:mod:`.secure.handshake`):
    publish a signature and a key-confirmation MAC per peer, verify every
    peer's, then derive the sealed links."""
    me, world = seat.rank, seat.layout.world_size
    peers = [r for r in range(world) if r != me]
    transcripts: dict[int, bytes] = {}
    prks: dict[int, bytes] = {}
    sigs: dict[str, str] = {}
    macs: dict[str, str] = {}
    for r in peers:
        a, b = min(me, r), max(me, r)
        t = hs.transcript(seat.digest, a, raws[a], b, raws[b])
        try:
            prk = hs.pair_secret(ephemeral, bytes.fromhex(hellos[r].ephemeral), t)
        except ValueError:
            raise ProtocolError(f"{seat.who(r)} sent an invalid ephemeral key in its hello") from None
        transcripts[r], prks[r] = t, prk
        sigs[str(r)] = seat.identity.sign(hs.auth_message(t, me, r)).hex()
        macs[str(r)] = hs.confirm_tag(prk, t, me, r).hex()
    store.set(f"auth/{me}", Authenticators(sig=sigs, mac=macs).model_dump_json())
    waiting = list(peers)
    while waiting:
        # every answer present is verified first, so that this rank names an
        # impostor itself rather than relaying a peer's report of it
        for r in list(waiting):
            if store.check([f"auth/{r}"]):
                verify_peer(seat, r, store.get(f"auth/{r}"), transcripts[r], prks[r])
                waiting.remove(r)
        for r in waiting:
            if store.check([f"err/{r}"]):
                failure = seat.peer_failure(r, store.get(f"err/{r}"))
                if failure is not None:
                    raise failure
        if waiting and time.monotonic() > deadline:
            raise PartyFailure(
                f"start-up timed out after {seat.rendezvous.timeout_s:g} s: "
                + ", ".join(seat.who(r) for r in waiting)
                + " never completed the handshake",
                rank=waiting[0],
            )
        if waiting:
            time.sleep(0.02)

    def keys_for(peer: int, stream: str) -> tuple[bytes, bytes]:
        return hs.stream_key(prks[peer], stream, me, peer), hs.stream_key(prks[peer], stream, peer, me)

    return Links(me, peers, keys_for, seat.who)


def verify_peer(seat: Seat, r: int, raw: bytes, t: bytes, prk: bytes) -> None:
    """Check peer ``r``'s signature (with the identity key of its hello, already
    checked against the pin) and its key-confirmation MAC."""
    try:
        auth = Authenticators.model_validate_json(raw)
        sig, mac = bytes.fromhex(auth.sig[str(seat.rank)]), bytes.fromhex(auth.mac[str(seat.rank)])
    except (ValidationError, ValueError, KeyError):
        raise ProtocolError(f"{seat.who(r)} sent a malformed handshake answer") from None
    identity = seat.keys[r]
    if not keys.verify(identity, sig, hs.auth_message(t, r, seat.rank)):
        raise ProtocolError(
            f"{seat.who(r)} failed the handshake: its signature does not verify with the identity key "
            f"{keys.short(identity)} of its hello (a forged hello or answer in the rendezvous store); "
            "refused at start-up"
        )
    if not hs.confirm_ok(prk, t, r, seat.rank, mac):
        raise ProtocolError(
            f"{seat.who(r)} failed the handshake: its key confirmation does not match (its hello's "
            "ephemeral key was replaced in the rendezvous store); refused at start-up"
        )


def _schema(digest: str) -> str:
    """The protocol schema version a digest was made under (``v2-...``: "v2"; a
    digest without one: "v1", the digest of a securevfl before schema versions)."""
    head, sep, _ = digest.partition("-")
    return head if sep else "v1"
